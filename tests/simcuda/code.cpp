// Device memory the stand-in's driver takes for code (SIMCUDA_CODE_BYTES a module): the modules
// that launches load lazily, one per function and device, and the modules and libraries loaded
// explicitly (cuModuleLoad*, cuLibraryLoad*), each with its handle. The stand-in never runs the
// code; it only charges the memory. Depends only on core.h; takes its own mutex, then the memory
// module's.
#include "core.h"

#include <deque>

namespace poolcuda::sim {
namespace {

// Note [Code memory]
// With lazy loading (CUDA's default since 12.2) a kernel's module is loaded into the device at
// the kernel's first launch, and that takes device memory: on a full device the launch fails
// with out of memory and nothing is enqueued. An explicit module or library load takes its
// memory at once. The stand-in models both with one size, config().code_bytes, charged as one
// allocation (live_allocations counts it, cudaMemGetInfo sees it):
//
// - A launch keys its module by the function (the runtime's func pointer or cudaKernel_t, the
//   driver's CUfunction) and the device. The first launch takes the memory; a launch that cannot
//   have it fails and remembers nothing, so the next one tries again; later launches take
//   nothing. The check and the charge happen under one lock, so concurrent first launches of one
//   function charge it once.
// - An explicit load takes the memory of its context's device and returns the address of an
//   object kept for the process's life (never reused); an unload gives the memory back, and
//   refuses a handle that is not loaded.
// - A device reset frees all the device's memory (mem_free_all), so it forgets the device's
//   lazily loaded modules and unloads the explicit modules of its contexts (their handles are
//   refused afterwards). Libraries are not a context's: a library loaded on the device loses its
//   memory but stays loaded, and its unload succeeds. Destroying a created context unloads its
//   modules.

struct Charge {
  void* base = nullptr;
  uint64_t id = 0;
};

struct Loaded {
  CodeKind kind = CodeKind::module;
  int device = 0;
  const Context* ctx = nullptr;  // the context a module belongs to
  bool live = false;
  Charge charge;
};

struct Table {
  std::mutex m;
  std::map<std::pair<int, const void*>, Charge> launched;  // (device, function) -> its module
  std::deque<Loaded> loads;  // every explicit load, kept: handles are their addresses
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

}  // namespace

cudaError_t load_for_launch(int device, const void* fn) {
  if (config().code_bytes == 0) return cudaSuccess;
  Table& t = table();
  std::lock_guard lock(t.m);
  const auto key = std::make_pair(device, fn);
  if (t.launched.count(key)) return cudaSuccess;
  Charge c;
  if (cudaError_t err = charge(device, &c); err != cudaSuccess) return err;
  t.launched.emplace(key, c);
  return cudaSuccess;
}

cudaError_t code_load(const Context* ctx, CodeKind kind, void** handle) {
  Table& t = table();
  std::lock_guard lock(t.m);
  Charge c;
  if (cudaError_t err = charge(ctx->device, &c); err != cudaSuccess) return err;
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
  for (Loaded& l : t.loads) {
    if (&l != handle) continue;
    if (!l.live || l.kind != kind) break;
    give_back(l.charge);
    l.charge = Charge{};
    l.live = false;
    return cudaSuccess;
  }
  return cudaErrorInvalidResourceHandle;
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
    give_back(l.charge);
    l.charge = Charge{};
    if (l.kind == CodeKind::module) l.live = false;
  }
}

void drop_context_code(const Context* ctx) {
  Table& t = table();
  std::lock_guard lock(t.m);
  for (Loaded& l : t.loads) {
    if (!l.live || l.kind != CodeKind::module || l.ctx != ctx) continue;
    give_back(l.charge);
    l.charge = Charge{};
    l.live = false;
  }
}

}  // namespace poolcuda::sim
