// Managed-memory hooks (see managed_hooks.h).
//
// Note [Managed routing]
// cudaMallocManaged(ptr, size, cudaMemAttachGlobal) with 0 < size <= managed_slab comes from
// the current device's chain of slabs. Everything else goes to the real call unchanged and is
// counted as passed through: managed:off, NULL, size 0, larger sizes, cudaMemAttachHost or any
// other flags (the real call judges them), a device that cannot be used, a process where not
// every device has concurrent managed access (Note [Managed attach]), and requests the chain
// cannot serve. A full chain (its cap of slabs reached) is logged once per device with the
// request and the limit, and the request then goes to the real call: the cap is the library's,
// not a budget the program chose, so it must not fail an allocation plain CUDA would make. A
// new slab refused for lack of memory first trims the device's idle pool pages and retries;
// after that, as for any other failure, the real call's own answer is the program's answer
// (Note [Last error] in hooks.cpp).
//
// Note [Managed attach]
// cudaStreamAttachMemAsync changes the stream association of a whole managed allocation (length
// 0 or the allocation's size; a part is refused). Passed a slab pointer unchanged, the real call
// would see the whole slab as "the allocation": length 0 would re-associate every neighbour, and
// the program's own size would be refused. Association matters only on a device without
// concurrent managed access, where it decides which host accesses are legal while kernels run;
// there it cannot be honoured for part of a slab, so on such a system (any device without it)
// managed memory is not pooled at all. With concurrent managed access on every device, the
// host and the devices may touch managed memory at any time whatever the association, so the
// hook checks the arguments as the real call checks them against the program's allocation
// (a live allocation; length 0, or its start and size; flags global, host or single) and then
// makes the real call with the slab's own, unchanged association (the whole slab, global): a
// no-op that still validates the stream, orders on it and answers for a capture as the real
// call does. The neighbours are never touched.
//
// cudaMemAdvise and cudaMemPrefetchAsync act on [ptr, ptr + count), which the driver rounds out
// to CPU pages. For a slab pointer the range must start in a live allocation and, when count is
// not 0, end within it, or the call is refused with cudaErrorInvalidValue as for a range outside
// a real allocation; then the real call gets the program's arguments unchanged (count 0 included,
// so the driver answers it as it would). The page rounding can extend the hint to neighbours
// that share a page: these calls are hints about placement and never change a byte, and a
// real managed allocation shares its pages with nothing only because the driver gives each one
// whole pages. cudaPointerGetAttributes of a live slab allocation (start or inside) is the real
// answer for managed memory; of slab memory in no live allocation, it is what the runtime says
// of memory it does not know (asked of a library-owned host byte, with that byte's address in
// the answer replaced by the pointer asked about), as it would say of a freed allocation.
//
// Depends on the registry, the real-function table, hooks.h, the log and the configuration.
#include "interpose/managed_hooks.h"

#include "interpose/hooks.h"
#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/pooling.h"
#include "interpose/real_cuda.h"
#include "interpose/registry.h"

namespace poolcuda::hooks {

namespace {

cudaError_t forward_managed(int device, void** ptr, std::size_t size, unsigned int flags) {
  const int result = pooling::forward(
      device, size, ptr, [&] { return real::cudaMallocManaged()(ptr, size, flags); },
      pooling::Passed::managed);
  if (result != pooling::kOverBudget) return static_cast<cudaError_t>(result);
  raise_out_of_memory();
  return cudaErrorMemoryAllocation;
}

// What the chains make of `ptr`: the chain of the current device first, then the others.
ManagedLookup find_managed(const void* ptr) {
  Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  const int current = current_device();
  ManagedLookup found;
  if (ManagedSlabs* chain = registry.managed(current)) found = chain->find(address);
  for (int d = 0; found.kind == ManagedLookup::Kind::not_mine && d < registry.managed_bound();
       ++d) {
    if (d == current) continue;
    if (ManagedSlabs* chain = registry.managed(d)) found = chain->find(address);
  }
  return found;
}

cudaError_t refuse() {
  raise_invalid_value();
  return cudaErrorInvalidValue;
}

// A range of a slab allocation (Note [Managed attach]): inside one live allocation.
bool range_allowed(const ManagedLookup& found, const void* ptr, std::size_t count) {
  if (found.kind != ManagedLookup::Kind::live) return false;
  const DevicePtr offset = reinterpret_cast<DevicePtr>(ptr) - found.start;
  return count <= found.size - offset;
}

}  // namespace

cudaError_t malloc_managed(void** ptr, std::size_t size, unsigned int flags) {
  const int device = current_device();
  const Config& conf = config();
  // Note [Managed routing].
  if (!conf.managed || ptr == nullptr || size == 0 || size > conf.managed_slab ||
      flags != cudaMemAttachGlobal || device < 0) {
    return forward_managed(device, ptr, size, flags);
  }
  Registry& registry = Registry::instance();
  ManagedSlabs* chain = registry.managed_or_create(device);
  if (chain == nullptr) return forward_managed(device, ptr, size, flags);
  ManagedAllocation allocation = chain->allocate(size, chain->granule());
  if (allocation.error.kind == ManagedErrorKind::out_of_memory) {
    if (MemoryManager* manager = registry.manager(device)) {
      manager->cleanup(true);
      allocation = chain->allocate(size, chain->granule());
    }
  }
  if (allocation.ptr != 0) {
    *ptr = reinterpret_cast<void*>(allocation.ptr);
    return cudaSuccess;
  }
  if (allocation.error.kind == ManagedErrorKind::too_large &&
      registry.first_time(Registry::Once::managed_full, device)) {
    log_format(LogLevel::basic,
               "device %d: managed slabs full (%s); passing such requests to cudaMallocManaged",
               device, describe(allocation.error).c_str());
  }
  return forward_managed(device, ptr, size, flags);
}

cudaError_t stream_attach_mem(cudaStream_t stream, void* ptr, std::size_t length,
                              unsigned int flags, bool per_thread) {
  auto attach =
      per_thread ? real::cudaStreamAttachMemAsync_ptsz() : real::cudaStreamAttachMemAsync();
  const ManagedLookup found = find_managed(ptr);
  if (found.kind == ManagedLookup::Kind::not_mine) return attach(stream, ptr, length, flags);
  // Note [Managed attach].
  if (found.kind != ManagedLookup::Kind::live) return refuse();
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost && flags != cudaMemAttachSingle) {
    return refuse();
  }
  if (length != 0 && (reinterpret_cast<DevicePtr>(ptr) != found.start || length != found.size)) {
    return refuse();
  }
  return attach(stream, reinterpret_cast<void*>(found.slab), 0, cudaMemAttachGlobal);
}

cudaError_t mem_advise(const void* ptr, std::size_t count, cudaMemoryAdvise advice,
                       cudaMemLocation location) {
  const ManagedLookup found = find_managed(ptr);
  if (found.kind != ManagedLookup::Kind::not_mine && !range_allowed(found, ptr, count)) {
    return refuse();
  }
  return real::cudaMemAdvise()(ptr, count, advice, location);
}

cudaError_t mem_prefetch(const void* ptr, std::size_t count, cudaMemLocation location,
                         unsigned int flags, cudaStream_t stream, bool per_thread) {
  const ManagedLookup found = find_managed(ptr);
  if (found.kind != ManagedLookup::Kind::not_mine && !range_allowed(found, ptr, count)) {
    return refuse();
  }
  auto prefetch = per_thread ? real::cudaMemPrefetchAsync_ptsz() : real::cudaMemPrefetchAsync();
  return prefetch(ptr, count, location, flags, stream);
}

cudaError_t pointer_get_attributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr || find_managed(ptr).kind != ManagedLookup::Kind::free_space) {
    return real::cudaPointerGetAttributes()(attributes, ptr);
  }
  // Note [Managed attach]: what the runtime says of memory it does not know.
  static char unknown;
  const cudaError_t result = real::cudaPointerGetAttributes()(attributes, &unknown);
  if (result == cudaSuccess) {
    if (attributes->devicePointer == &unknown) attributes->devicePointer = const_cast<void*>(ptr);
    if (attributes->hostPointer == &unknown) attributes->hostPointer = const_cast<void*>(ptr);
  }
  return result;
}

}  // namespace poolcuda::hooks
