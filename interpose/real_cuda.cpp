// Lazy, lock-free resolution of the real CUDA runtime functions (see real_cuda.h).
//
// Why not only RTLD_NEXT: a program that dlopen()s a library linked to libcudart with
// RTLD_LOCAL (Python extensions do) keeps libcudart out of the global scope, so RTLD_NEXT from
// a preloaded library finds nothing. The runtime is then already loaded, and
// dlopen(RTLD_NOLOAD) finds it by soname without loading anything new.
//
// Depends on the CUDA runtime header and libdl only.
#include "interpose/real_cuda.h"

#include <dlfcn.h>

#include <atomic>

namespace poolcuda::real {

namespace {

constexpr int kSlots = static_cast<int>(Slot::count);

constexpr const char* kNames[kSlots] = {
#define POOLCUDA_NAME(name) #name,
    POOLCUDA_REAL_FUNCTIONS(POOLCUDA_NAME)
#undef POOLCUDA_NAME
};

// nullptr: not found yet. A miss is not remembered: the runtime may be loaded later.
std::atomic<void*> g_slots[kSlots];

void* lookup(const char* name) {
  if (void* address = ::dlsym(RTLD_NEXT, name)) return address;
  static constexpr const char* kSonames[] = {"libcudart.so.13", "libcudart.so.12",
                                             "libcudart.so"};
  for (const char* soname : kSonames) {
    void* handle = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* address = ::dlsym(handle, name);
    ::dlclose(handle);  // NOLOAD took a reference; the library stays loaded by its owner
    if (address != nullptr) return address;
  }
  return nullptr;
}

}  // namespace

void* resolve(Slot slot) {
  auto& entry = g_slots[static_cast<int>(slot)];
  void* address = entry.load(std::memory_order_acquire);
  if (address == nullptr) {
    address = lookup(kNames[static_cast<int>(slot)]);
    if (address != nullptr) entry.store(address, std::memory_order_release);
  }
  return address;
}

void resolve_all() {
  for (int i = 0; i < kSlots; ++i) resolve(static_cast<Slot>(i));
}

}  // namespace poolcuda::real
