// Device memory the stand-in's driver takes for code (SIMCUDA_CODE_BYTES a module): the functions
// that launches and the driver's getters, attribute and occupancy queries load, one per function
// and device, and the modules and libraries loaded explicitly (cuModuleLoad*, cuLibraryLoad*),
// each with its handle, eagerly or lazily (CUDA_MODULE_LOADING); and the variables of loaded
// code, which live in that memory. The stand-in never runs the code; it only charges the memory.
// Depends only on core.h; takes its own mutex, then the memory module's.
#include "core.h"

#include <deque>
#include <string>

namespace poolcuda::sim {
namespace {

// Note [Code memory]
// With lazy loading (CUDA's default since 12.2) a kernel's module is loaded into the device at
// the kernel's first use (its launch, or a question about it such as its attributes), and a
// module at the first use of one of its variables; that takes device memory: on a full device
// the use fails with out of memory (a launch enqueues nothing). An explicit module or library
// load takes its memory at once when loading is eager (CUDA_MODULE_LOADING=EAGER, the stand-in's
// default); when it is lazy (CUDA_MODULE_LOADING=LAZY) the load takes nothing and each of its
// kernels and variables is loaded at its first use. The stand-in models all of it with one size,
// config().code_bytes, charged as one allocation (live_allocations counts it, cudaMemGetInfo
// sees it):
//
// - Loaded functions are keyed by (device, function): the runtime's func pointer or cudaKernel_t,
//   the driver's CUfunction or CUkernel. The first load takes the memory; a load that cannot have
//   it fails and remembers nothing, so the next one tries again; later ones take nothing. The
//   check and the charge happen under one lock, so concurrent first loads charge once.
// - A launch loads its function on the current device; so do cuKernelGetFunction (key: the
//   kernel, whose own value is the function it returns), cuFuncLoad, cuFuncGetAttribute,
//   cuFuncSetAttribute, cuFuncSetCacheConfig and the cuOccupancy* queries, as a real program's
//   first question about a kernel loads it. cuKernelGetAttribute, cuKernelSetAttribute and
//   cuKernelSetCacheConfig load the kernel (the same key) on the device they name.
// - An explicit load returns the address of an object kept for the process's life (never
//   reused); an unload gives the memory back, the memory of its lazily loaded functions with it,
//   and refuses a handle that is not loaded. Eager, the load takes the memory of its context's
//   device at once.
// - cuModuleGetFunction and cuLibraryGetKernel hand out one object per (module or library,
//   name), also kept for the process's life. The rule for them: eager, they were loaded with
//   their module or library, so nothing takes memory for them (not cuModuleGetFunction, nor any
//   use of them); lazy, they load like any function (cuModuleGetFunction loads its function on
//   the module's device; cuLibraryGetKernel loads nothing). Every other function (the runtime's
//   kernels, a CUfunction the stand-in did not hand out) loads at its first use in both modes.
//   Once the module or library is unloaded, its functions and kernels are refused as invalid
//   handles.
// - Variables (cuModuleGetGlobal, cuLibraryGetGlobal; every name is one) take kVariableBytes each,
//   inside the code memory that holds them, so that an address is valid while its code is loaded
//   and freed with it. A variable shares its (module or library, name) object with the function of
//   that name. Lazy, it loads like that function (a module's on the module's device, a library's on
//   the current context's) and lives at the start of that load's memory, one per device. Eager, it
//   lives in its module's or library's own memory, the n-th variable got from it at
//   n * kVariableBytes, on the device of that load whichever is current; nothing more is taken.
//   Without such memory to live in (SIMCUDA_CODE_BYTES under kVariableBytes, a module's memory
//   full of variables, an eager library's after a reset) the get is refused as unsupported.
// - A device reset frees all the device's memory (mem_free_all), so it forgets the functions
//   loaded on the device and unloads the explicit modules of its contexts (their handles are
//   refused afterwards). Libraries are not a context's: a library loaded on the device loses its
//   memory but stays loaded, and its unload succeeds. Destroying a created context unloads its
//   modules.

struct Loaded;

struct Charge {
  void* base = nullptr;
  uint64_t id = 0;
  const Loaded* owner = nullptr;  // the module or library of a function it handed out
};

struct Loaded {
  CodeKind kind = CodeKind::module;
  int device = 0;
  const Context* ctx = nullptr;  // the context a module belongs to
  bool live = false;
  Charge charge;         // eager: the whole module's
  size_t variables = 0;  // eager: the slots of its memory given to variables
};

// A module's function or a library's kernel, or the variable of that name: its handle is its
// address.
struct Got {
  static constexpr size_t kNoSlot = SIZE_MAX;
  const Loaded* owner = nullptr;
  size_t slot = kNoSlot;  // eager: the variable's place in its owner's memory, once got
};

struct Table {
  std::mutex m;
  std::map<std::pair<int, const void*>, Charge> launched;  // (device, function) -> its code
  std::deque<Loaded> loads;  // every explicit load, kept: handles are their addresses
  std::deque<Got> got;       // every function and kernel handed out, kept likewise
  std::map<std::pair<const Loaded*, std::string>, Got*> by_name;
  std::map<const void*, const Got*> by_handle;
};

Table& table() {
  static auto* t = new Table;  // never destroyed: a program may reset devices during exit
  return *t;
}

void give_back(const Charge& c) {
  if (c.base) mem_free(c.base, c.id);  // a reset may have freed it already
}

cudaError_t charge(int device, Charge* out) {
  if (config().code_bytes == 0) return cudaSuccess;
  return mem_alloc(device, config().code_bytes, AllocKind::device, &out->base, &out->id);
}

Loaded* find_load(Table& t, const void* handle, CodeKind kind) {
  for (Loaded& l : t.loads)
    if (&l == handle) return l.live && l.kind == kind ? &l : nullptr;
  return nullptr;
}

cudaError_t load_locked(Table& t, int device, const void* fn) {
  const Loaded* owner = nullptr;
  if (auto it = t.by_handle.find(fn); it != t.by_handle.end()) {
    owner = it->second->owner;
    if (!owner->live) return cudaErrorInvalidResourceHandle;
    if (!config().lazy_loading) return cudaSuccess;  // loaded with its module or library
  }
  if (config().code_bytes == 0) return cudaSuccess;
  const auto key = std::make_pair(device, fn);
  if (t.launched.count(key)) return cudaSuccess;
  Charge c;
  if (cudaError_t err = charge(device, &c); err != cudaSuccess) return err;
  c.owner = owner;
  t.launched.emplace(key, c);
  return cudaSuccess;
}

// The one object of (l, name), made at its first get.
Got& named_locked(Table& t, Loaded& l, const char* name) {
  Got*& got = t.by_name[{&l, name}];
  if (!got) {
    got = &t.got.emplace_back();
    got->owner = &l;
    t.by_handle.emplace(got, got);
  }
  return *got;
}

// Where variable `got` of `l` lives on `device` once loaded (lazy), or in l's own memory (eager,
// taking the next slot there at its first get); null when no memory holds it.
void* variable_locked(Table& t, Loaded& l, Got& got, int device) {
  if (config().lazy_loading) {
    auto it = t.launched.find({device, &got});
    return it == t.launched.end() ? nullptr : it->second.base;
  }
  if (!l.charge.base) return nullptr;
  if (got.slot == Got::kNoSlot) {
    if ((l.variables + 1) * kVariableBytes > config().code_bytes) return nullptr;
    got.slot = l.variables++;
  }
  return static_cast<char*>(l.charge.base) + got.slot * kVariableBytes;
}

// `l` unloaded: its memory and its functions' given back.
void unload_locked(Table& t, Loaded& l) {
  give_back(l.charge);
  l.charge = Charge{};
  l.live = false;
  std::erase_if(t.launched, [&](auto& entry) {
    if (entry.second.owner != &l) return false;
    give_back(entry.second);
    return true;
  });
}

}  // namespace

cudaError_t load_function(int device, const void* fn) {
  Table& t = table();
  cudaError_t err;
  {
    std::lock_guard lock(t.m);
    err = load_locked(t, device, fn);
  }
  return after_refusal(err);
}

cudaError_t code_load(const Context* ctx, CodeKind kind, void** handle) {
  Table& t = table();
  std::unique_lock lock(t.m);
  Charge c;
  if (!config().lazy_loading) {
    if (cudaError_t err = charge(ctx->device, &c); err != cudaSuccess) {
      lock.unlock();
      return after_refusal(err);
    }
  }
  Loaded& l = t.loads.emplace_back();
  l.kind = kind;
  l.device = ctx->device;
  l.ctx = kind == CodeKind::module ? ctx : nullptr;
  l.live = true;
  l.charge = c;
  *handle = &l;
  return cudaSuccess;
}

cudaError_t code_unload(const void* handle, CodeKind kind) {
  Table& t = table();
  std::lock_guard lock(t.m);
  Loaded* l = find_load(t, handle, kind);
  if (!l) return cudaErrorInvalidResourceHandle;
  unload_locked(t, *l);
  return cudaSuccess;
}

cudaError_t code_get(const void* handle, CodeKind kind, const char* name, void** out) {
  Table& t = table();
  std::unique_lock lock(t.m);
  Loaded* l = find_load(t, handle, kind);
  if (!l) return cudaErrorInvalidResourceHandle;
  Got& got = named_locked(t, *l, name);
  if (kind == CodeKind::module) {
    if (cudaError_t err = load_locked(t, l->device, &got); err != cudaSuccess) {
      lock.unlock();
      return after_refusal(err);
    }
  }
  *out = &got;
  return cudaSuccess;
}

cudaError_t code_variable(const void* handle, CodeKind kind, int device, const char* name,
                          void** address) {
  Table& t = table();
  std::unique_lock lock(t.m);
  Loaded* l = find_load(t, handle, kind);
  if (!l) return cudaErrorInvalidResourceHandle;
  if (config().code_bytes < kVariableBytes) return cudaErrorNotSupported;
  if (kind == CodeKind::module) device = l->device;
  Got& got = named_locked(t, *l, name);
  if (cudaError_t err = load_locked(t, device, &got); err != cudaSuccess) {
    lock.unlock();
    return after_refusal(err);
  }
  void* at = variable_locked(t, *l, got, device);
  if (!at) return cudaErrorNotSupported;
  *address = at;
  return cudaSuccess;
}

void drop_code(int device) {
  Table& t = table();
  std::lock_guard lock(t.m);
  std::erase_if(t.launched, [&](auto& entry) {
    if (entry.first.first != device) return false;
    give_back(entry.second);
    return true;
  });
  for (Loaded& l : t.loads) {
    if (!l.live || l.device != device) continue;
    if (l.kind == CodeKind::module) {
      unload_locked(t, l);
    } else {
      give_back(l.charge);
      l.charge = Charge{};
    }
  }
}

void drop_context_code(const Context* ctx) {
  Table& t = table();
  std::lock_guard lock(t.m);
  for (Loaded& l : t.loads)
    if (l.live && l.kind == CodeKind::module && l.ctx == ctx) unload_locked(t, l);
}

}  // namespace poolcuda::sim
