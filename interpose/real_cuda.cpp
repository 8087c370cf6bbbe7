// Lazy, lock-free resolution of the real CUDA runtime functions (see real_cuda.h).
//
// Why not only RTLD_NEXT: a program that dlopen()s a library linked to libcudart with
// RTLD_LOCAL (Python extensions do) keeps libcudart out of the global scope, so RTLD_NEXT from
// a preloaded library finds nothing. The runtime is then already loaded, and
// dlopen(RTLD_NOLOAD) finds it by soname without loading anything new.
//
// Note [Missing functions]
// A lookup that finds nothing is remembered (a sentinel in the slot), so a missing function
// costs one dlsym and a few dlopen attempts once, not on every call. Nothing is lost by not
// looking again: a hook runs only when code linked to the runtime calls it, so the runtime is
// already loaded by the first lookup; a function missing then belongs to an older runtime than
// the headers. The first thread to record the miss logs one line naming the function.
//
// Depends on the CUDA runtime header, the real dlsym and the log.
#include "interpose/real_cuda.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "interpose/dl_real.h"
#include "interpose/log.h"

namespace poolcuda::real {

namespace {

constexpr int kSlots = static_cast<int>(Slot::count);

constexpr const char* kNames[kSlots] = {
#define POOLCUDA_NAME(name) #name,
    POOLCUDA_REAL_FUNCTIONS(POOLCUDA_NAME)
#undef POOLCUDA_NAME
};

void* lookup(const char* name) {
  if (void* address = dl::real_dlsym(RTLD_NEXT, name)) return address;
  static constexpr const char* kSonames[] = {"libcudart.so.13", "libcudart.so.12",
                                             "libcudart.so"};
  for (const char* soname : kSonames) {
    void* handle = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* address = dl::real_dlsym(handle, name);
    ::dlclose(handle);  // NOLOAD took a reference; the library stays loaded by its owner
    if (address != nullptr) return address;
  }
  return nullptr;
}

}  // namespace

namespace detail {
std::atomic<void*> g_slots[kSlots];
char g_missing;
}  // namespace detail

void* resolve_first(Slot slot) {
  using detail::g_missing;
  auto& entry = detail::g_slots[static_cast<int>(slot)];
  void* address = entry.load(std::memory_order_acquire);
  if (address == nullptr) {
    const char* name = kNames[static_cast<int>(slot)];
    void* found = lookup(name);
    void* expected = nullptr;
    if (entry.compare_exchange_strong(expected, found != nullptr ? found : &g_missing,
                                      std::memory_order_acq_rel) &&
        found == nullptr) {
      log_format(LogLevel::basic,
                 "%s is not in the CUDA runtime; the library's calls to it fail with "
                 "cudaErrorSharedObjectSymbolNotFound",
                 name);
    }
    address = entry.load(std::memory_order_acquire);
  }
  return address == &g_missing ? nullptr : address;
}

void* resolve_by_name(const char* name) {
  for (int slot = 0; slot < kSlots; ++slot) {
    if (std::strcmp(kNames[slot], name) == 0) return resolve(static_cast<Slot>(slot));
  }
  return nullptr;
}

bool runtime_loaded() { return lookup("cudaGetDevice") != nullptr; }

}  // namespace poolcuda::real
