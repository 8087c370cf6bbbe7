// Lazy, lock-free resolution of the real CUDA runtime functions (see real_cuda.h).
//
// Why not only RTLD_NEXT: a program that dlopen()s a library linked to libcudart with
// RTLD_LOCAL (Python extensions do) keeps libcudart out of the global scope, so RTLD_NEXT from
// a preloaded library finds nothing. The runtime is then already loaded, and
// dlopen(RTLD_NOLOAD) finds it by soname without loading anything new; a runtime bundled under
// a name of its own (a Python wheel's libcudart-<hash>.so.12) is found among the loaded objects
// by its file name.
//
// Note [Missing functions]
// A lookup that finds nothing while a runtime is loaded is remembered (a sentinel in the slot),
// so a missing function costs one dlsym and a few dlopen attempts once, not on every call: the
// function belongs to an older runtime than the headers. The first thread to record the miss
// logs one line naming the function. With no runtime loaded yet nothing is remembered: a
// program may reach a hook before it loads the runtime (dlsym(dlopen(NULL), "cudaFree"), as
// ctypes.CDLL(None) does to ask whether CUDA is loaded), and remembering the miss then made
// that function fail, or go unhooked, for the rest of the process.
//
// Note [The runtime stays loaded]
// The addresses found are kept for the life of the process, so the object that holds them must
// stay mapped: a plugin host that dlclose()d the last user of a runtime it had dlopen()ed left
// the library calling into unmapped or reused memory (a crash, or a pooled pointer passed to
// the real cudaFree, which freed its whole page, after the runtime was loaded again elsewhere).
// So each object a function is found in is made RTLD_NODELETE when found: the program's
// dlclose() leaves it loaded, as if the library held a reference.
//
// Depends on the CUDA runtime header, the real dlsym and the log.
#include "interpose/real_cuda.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

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

// Keeps the object holding `address` loaded for good (Note [The runtime stays loaded]).
void keep_loaded(void* address) {
  Dl_info info{};
  if (::dladdr(address, &info) == 0 || info.dli_fname == nullptr) return;
  // NOLOAD takes a reference to an object already loaded and marks it NODELETE; the reference
  // is never given back either.
  (void)::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
}

// Whether a loaded object's file name (any directory) names a CUDA runtime: libcudart.so*, or
// a bundled copy renamed libcudart-<hash>.so*.
bool runtime_file(const char* path) {
  const char* base = std::strrchr(path, '/');
  base = base == nullptr ? path : base + 1;
  return std::strncmp(base, "libcudart.so", 12) == 0 || std::strncmp(base, "libcudart-", 10) == 0;
}

// Whether `address` lies in a file runtime_file() names.
bool in_runtime(const void* address) {
  Dl_info info{};
  return ::dladdr(address, &info) != 0 && info.dli_fname != nullptr &&
         runtime_file(info.dli_fname);
}

// `name` in a loaded runtime found by its file name, or null. The names are gathered first and
// opened after the walk: dl_iterate_phdr holds a loader lock that dlopen takes second (another
// thread's dlopen, holding the first, would wait for it while this walk waited for that one).
void* lookup_in_loaded_runtimes(const char* name) {
  std::vector<std::string> paths;
  ::dl_iterate_phdr(
      [](dl_phdr_info* object, std::size_t, void* data) {
        if (object->dlpi_name != nullptr && runtime_file(object->dlpi_name))
          static_cast<std::vector<std::string>*>(data)->emplace_back(object->dlpi_name);
        return 0;
      },
      &paths);
  for (const std::string& path : paths) {
    void* handle = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* address = dl::real_dlsym(handle, name);
    ::dlclose(handle);  // NOLOAD took a reference; keep_loaded() takes the lasting one
    if (address != nullptr) return address;
  }
  return nullptr;
}

void* lookup(const char* name) {
  if (void* address = dl::real_dlsym(RTLD_NEXT, name)) return address;
  static constexpr const char* kSonames[] = {"libcudart.so.13", "libcudart.so.12",
                                             "libcudart.so"};
  for (const char* soname : kSonames) {
    void* handle = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* address = dl::real_dlsym(handle, name);
    ::dlclose(handle);  // NOLOAD took a reference; keep_loaded() takes the lasting one
    if (address != nullptr) return address;
  }
  return lookup_in_loaded_runtimes(name);
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
    // Asked first: a runtime loaded between the two looks must not make the miss final.
    const bool loaded = runtime_loaded();
    void* found = lookup(name);
    if (found != nullptr) {
      if (in_runtime(found)) keep_loaded(found);  // not an interposer's or a plugin's
    } else if (!loaded) {
      return nullptr;  // Note [Missing functions]: asked again next time
    }
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

bool in_hooked_runtime(const void* address) {
  // The runtime the hooks call: the object of a function the library resolved that lies in a
  // runtime file (an interposer preloaded after the library may hold the others). It stays
  // loaded (Note [The runtime stays loaded]), so its base never changes once found.
  static std::atomic<void*> base{nullptr};
  void* known = base.load(std::memory_order_acquire);
  if (known == nullptr) {
    for (Slot slot : {Slot::cudaGetDevice, Slot::cudaMalloc, Slot::cudaFree}) {
      const void* resolved = resolve(slot);
      Dl_info info{};
      if (resolved == nullptr || !in_runtime(resolved) || ::dladdr(resolved, &info) == 0)
        continue;
      known = info.dli_fbase;
      base.store(known, std::memory_order_release);
      break;
    }
    if (known == nullptr) return false;
  }
  Dl_info info{};
  return ::dladdr(address, &info) != 0 && info.dli_fbase == known;
}

}  // namespace poolcuda::real
