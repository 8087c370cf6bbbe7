// The real CUDA driver's resolver and functions (see real_driver.h).
//
// The driver library is found with dlopen(RTLD_NOLOAD) by its soname: whoever uses the driver
// (the runtime, a static cudart, a program linked with -lcuda) has loaded it before any driver
// hook or resolver can run. The handle is kept once found.
//
// Depends on the CUDA driver header and the real dlsym.
#include "interpose/real_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "interpose/dl_real.h"

namespace poolcuda::real_driver {

namespace {

constexpr int kSlots = static_cast<int>(Slot::count);

struct Entry {
  const char* base;
  int version;
};

constexpr Entry kEntries[kSlots] = {
#define POOLCUDA_ENTRY(name, base, version) {base, version},
    POOLCUDA_REAL_DRIVER_FUNCTIONS(POOLCUDA_ENTRY)
#undef POOLCUDA_ENTRY
};

// nullptr: not looked up yet; &g_missing: the loaded driver lacks it.
std::atomic<void*> g_slots[kSlots];
char g_missing;
std::atomic<void*> g_library{nullptr};

void* library() {
  void* handle = g_library.load(std::memory_order_acquire);
  if (handle != nullptr) return handle;
  static const char* const kSonames[] = {"libcuda.so.1", "libcuda.so"};
  for (const char* soname : kSonames) {
    handle = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);  // a reference kept for good
    if (handle != nullptr) break;
  }
  if (handle == nullptr) return nullptr;
  void* expected = nullptr;
  if (!g_library.compare_exchange_strong(expected, handle, std::memory_order_acq_rel)) {
    ::dlclose(handle);  // another thread kept its own
    return expected;
  }
  return handle;
}

// The address range of this library's loaded segments: the object whose segments hold a
// marker of its own, found once. A dladdr per resolved function cost the first allocation
// 150 us (each one walks every loaded object's symbols).
struct Span {
  std::uintptr_t low = 0;
  std::uintptr_t high = 0;
};

Span own_span() {
  static const Span span = [] {
    static const char marker = 0;
    Span found;
    ::dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) {
          std::uintptr_t low = UINTPTR_MAX;
          std::uintptr_t high = 0;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD) continue;
            low = std::min<std::uintptr_t>(low, info->dlpi_addr + ph.p_vaddr);
            high = std::max<std::uintptr_t>(high, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
          }
          const auto at = reinterpret_cast<std::uintptr_t>(&marker);
          if (at < low || at >= high) return 0;
          *static_cast<Span*>(data) = Span{low, high};
          return 1;
        },
        &found);
    return found;
  }();
  return span;
}

bool in_this_library(void* fn) {
  const Span span = own_span();
  const auto address = reinterpret_cast<std::uintptr_t>(fn);
  return fn != nullptr && address >= span.low && address < span.high;
}

}  // namespace

void* symbol(const char* name) {
  void* handle = library();
  return handle != nullptr ? dl::real_dlsym(handle, name) : nullptr;
}

Resolver resolver() { return reinterpret_cast<Resolver>(symbol("cuGetProcAddress_v2")); }

ResolverV1 resolver_v1() { return reinterpret_cast<ResolverV1>(symbol("cuGetProcAddress")); }

void* resolve(const char* name, int version, bool per_thread) {
  void* fn = nullptr;
  const cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                      : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  CUresult result = CUDA_ERROR_NOT_FOUND;
  if (Resolver v2 = resolver()) {
    CUdriverProcAddressQueryResult status;
    result = v2(name, &fn, version, flags, &status);
  } else if (ResolverV1 v1 = resolver_v1()) {
    result = v1(name, &fn, version, flags);
  }
  // A driver whose resolver hands out its exported symbols, bound to the first definition in
  // the process, would hand out this library's hooks: never a real function.
  return result == CUDA_SUCCESS && !in_this_library(fn) ? fn : nullptr;
}

void* function(Slot slot) {
  auto& entry = g_slots[static_cast<int>(slot)];
  void* address = entry.load(std::memory_order_acquire);
  if (address == nullptr) {
    if (library() == nullptr) return nullptr;  // no driver yet: look again next time
    const Entry& e = kEntries[static_cast<int>(slot)];
    void* found = resolve(e.base, e.version, false);
    void* expected = nullptr;
    entry.compare_exchange_strong(expected, found != nullptr ? found : &g_missing,
                                  std::memory_order_acq_rel);
    address = entry.load(std::memory_order_acquire);
  }
  return address == &g_missing ? nullptr : address;
}

bool resolve_all() {
  if (library() == nullptr) return false;
  for (int slot = 0; slot < static_cast<int>(Slot::count); ++slot)
    (void)function(static_cast<Slot>(slot));
  return true;
}

}  // namespace poolcuda::real_driver
