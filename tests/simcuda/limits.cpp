// Context limits of the stand-in (cuCtxSetLimit / cuCtxGetLimit, which the runtime's
// cudaDeviceSetLimit / cudaDeviceGetLimit reach through the driver's resolver): each context's
// limit values, and the device memory its heap, printf FIFO and thread stacks reserve beyond the
// defaults. Depends only on core.h and cuda.h's CUlimit numbering; takes its own mutex, then the
// memory module's.
#include "core.h"

#include <cuda.h>

#include <algorithm>

namespace poolcuda::sim {
namespace {

// Note [Limit reservations]
// A real context reserves device memory for the device-side malloc heap
// (CU_LIMIT_MALLOC_HEAP_SIZE bytes), the printf FIFO (CU_LIMIT_PRINTF_FIFO_SIZE bytes) and the
// stack of every thread the device can hold at once (CU_LIMIT_STACK_SIZE bytes each, times
// kResidentThreads). The stand-in charges a context only what its limits take beyond the
// defaults (8 MiB heap, 1 MiB FIFO, 1 KiB stack): the defaults count as part of what the
// capacity already leaves out, so a fresh context's cuMemGetInfo reads the whole capacity as it
// always has, and a limit at or below its default charges nothing.
//
// The excess of all three is one allocation on the context's device (live_allocations counts
// it), replaced as a whole by every set of one of them (mem_replace): the old reservation is
// given back before the new one has to fit, and when it does not fit the set fails with
// out of memory, the old reservation and the limit unchanged. Destroying a context gives its
// reservation back. A device reset frees all the device's memory, a created context's included
// (the stand-in's contexts share their device's memory, core.h), so it returns every context of
// the device to the default limits, not only the primary one.

// The threads a device holds at once.
constexpr size_t kResidentThreads = size_t{kMultiprocessors} * kThreadsPerMultiprocessor;

enum class Rule {
  reserves,     // heap, FIFO, stack: device memory beyond the default
  stored,       // kept and read back, nothing else
  read_only,    // can be queried, not set
  unsupported,  // CUDA_ERROR_UNSUPPORTED_LIMIT both ways
};

struct Known {
  Rule rule;
  size_t fallback;  // the default
};

Known known(int limit) {
  switch (limit) {
    case CU_LIMIT_STACK_SIZE: return {Rule::reserves, 1024};
    case CU_LIMIT_PRINTF_FIFO_SIZE: return {Rule::reserves, size_t{1} << 20};
    case CU_LIMIT_MALLOC_HEAP_SIZE: return {Rule::reserves, size_t{8} << 20};
    // Removed from compute capability 9.0, which the stand-in's devices report.
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: return {Rule::unsupported, 0};
    // The real driver would reserve memory past the default 2048; not modelled.
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: return {Rule::stored, 2048};
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY: return {Rule::stored, 64};
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE: return {Rule::stored, 0};
    // Shared memory of a CUDA-in-graphics (CIG) context: the stand-in never makes one.
    case CU_LIMIT_SHMEM_SIZE: return {Rule::unsupported, 0};
    case CU_LIMIT_CIG_ENABLED: return {Rule::read_only, 0};
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: return {Rule::stored, 1};
    default: return {Rule::unsupported, 0};
  }
}

struct Limits {
  std::map<int, size_t> set;  // the limits set; the others read as their defaults
  void* reservation = nullptr;
  uint64_t reservation_id = 0;
};

struct Table {
  std::mutex m;
  std::map<const Context*, Limits> contexts;
};

Table& table() {
  static auto* t = new Table;  // never destroyed: a program may reset devices during exit
  return *t;
}

// What the heap, FIFO and stack limits in `set` reserve beyond their defaults; false when it
// exceeds what size_t counts (no device holds it).
bool excess_bytes(const std::map<int, size_t>& set, size_t* out) {
  size_t total = 0;
  for (int limit : {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE}) {
    auto it = set.find(limit);
    const size_t fallback = known(limit).fallback;
    if (it == set.end() || it->second <= fallback) continue;
    size_t bytes = it->second - fallback;
    if (limit == CU_LIMIT_STACK_SIZE) {
      if (bytes > SIZE_MAX / kResidentThreads) return false;
      bytes *= kResidentThreads;
    }
    if (bytes > SIZE_MAX - total) return false;
    total += bytes;
  }
  *out = total;
  return true;
}

void give_back(const Limits& l) {
  if (l.reservation) mem_free(l.reservation, l.reservation_id);  // a reset may have freed it
}

}  // namespace

bool limit_reserves_memory(int limit) { return known(limit).rule == Rule::reserves; }

cudaError_t set_limit(Context* ctx, int limit, size_t value) {
  const Known k = known(limit);
  if (k.rule == Rule::unsupported) return cudaErrorUnsupportedLimit;
  if (k.rule == Rule::read_only) return cudaErrorInvalidValue;
  // A hint from 0 to 128 bytes; the driver may clamp it, and the stand-in does.
  if (limit == CU_LIMIT_MAX_L2_FETCH_GRANULARITY) value = std::min<size_t>(value, 128);
  Table& t = table();
  std::lock_guard lock(t.m);
  Limits& l = t.contexts[ctx];
  if (k.rule == Rule::stored) {
    l.set[limit] = value;
    return cudaSuccess;
  }
  std::map<int, size_t> next = l.set;
  next[limit] = value;
  size_t bytes = 0;
  if (!excess_bytes(next, &bytes)) return cudaErrorMemoryAllocation;
  void* base = nullptr;
  uint64_t id = 0;
  cudaError_t err = mem_replace(ctx->device, l.reservation, l.reservation_id, bytes,
                                AllocKind::device, &base, &id);
  if (err != cudaSuccess) return err;
  l.set = std::move(next);
  l.reservation = base;
  l.reservation_id = id;
  return cudaSuccess;
}

cudaError_t get_limit(const Context* ctx, int limit, size_t* value) {
  if (!value) return cudaErrorInvalidValue;
  const Known k = known(limit);
  if (k.rule == Rule::unsupported) return cudaErrorUnsupportedLimit;
  Table& t = table();
  std::lock_guard lock(t.m);
  *value = k.fallback;
  auto found = t.contexts.find(ctx);
  if (found == t.contexts.end()) return cudaSuccess;
  auto it = found->second.set.find(limit);
  if (it != found->second.set.end()) *value = it->second;
  return cudaSuccess;
}

void drop_limits(int device) {
  Table& t = table();
  std::lock_guard lock(t.m);
  std::erase_if(t.contexts, [device](const auto& entry) {
    if (entry.first->device != device) return false;
    give_back(entry.second);
    return true;
  });
}

void drop_context_limits(const Context* ctx) {
  Table& t = table();
  std::lock_guard lock(t.m);
  auto it = t.contexts.find(ctx);
  if (it == t.contexts.end()) return;
  give_back(it->second);
  t.contexts.erase(it);
}

}  // namespace poolcuda::sim
