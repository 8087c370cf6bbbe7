// The C library's own dlsym (see dl_real.h).
//
// Note [Finding dlsym]
// The library exports dlsym, so asking dlsym for "dlsym" finds the library itself: an interposer
// that bootstraps that way recurses for ever. dlvsym is not interposed, and asks for an exact
// symbol version: GLIBC_2.34 (where glibc moved dlsym into libc), then the oldest version of each
// 64-bit architecture, GLIBC_2.2.5 (x86-64) and GLIBC_2.17 (aarch64). RTLD_NEXT from this
// library skips the library and finds the C library's. The bootstrap runs the first time anyone
// calls dlsym, which may be a sanitizer runtime that is still initializing itself, so it is not
// instrumented and allocates nothing.
//
// Depends on libdl only.
#include "interpose/dl_real.h"

#include <dlfcn.h>

namespace {

void* find_nothing(void*, const char*) { return nullptr; }

}  // namespace

extern "C" {

__attribute__((visibility("hidden"))) void* poolcuda_libc_dlsym = nullptr;

__attribute__((visibility("hidden"), no_sanitize("address", "thread", "undefined"))) void*
poolcuda_dlsym_bootstrap() {
  void* found = __atomic_load_n(&poolcuda_libc_dlsym, __ATOMIC_ACQUIRE);
  if (found != nullptr) return found;
  static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  for (const char* version : kVersions) {
    found = ::dlvsym(RTLD_NEXT, "dlsym", version);
    if (found != nullptr) break;
  }
  if (found == nullptr) return reinterpret_cast<void*>(&find_nothing);
  __atomic_store_n(&poolcuda_libc_dlsym, found, __ATOMIC_RELEASE);
  return found;
}

}  // extern "C"

namespace poolcuda::dl {

// On the path of every dlsym too (Note [Finding dlsym]).
__attribute__((no_sanitize("address", "thread", "undefined"))) void* real_dlsym(
    void* handle, const char* name) {
  using Dlsym = void* (*)(void*, const char*);
  return reinterpret_cast<Dlsym>(poolcuda_dlsym_bootstrap())(handle, name);
}

}  // namespace poolcuda::dl
