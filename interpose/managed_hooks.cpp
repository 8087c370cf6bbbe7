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
// not a budget the program chose, so it must not fail an allocation plain CUDA would make. So
// is a request the held bound refuses a slab for (slabs kept by small live allocations, Note
// [Managed held bound] in pools/managed_bound.cpp), logged once per device: plain CUDA would
// give it memory of its own. A new slab refused for lack of memory first trims the device's
// idle pool pages and retries; after that, as for any other failure, the real call's own answer
// is the program's answer (Note [Last error] in hooks.cpp).
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
// not 0, end within it, or the call is refused as for a range outside a real allocation; then the
// real call gets the program's arguments unchanged (count 0 included, so the driver answers it as
// it would). The page rounding can extend the hint to neighbours that share a page: these calls
// are hints about placement and never change a byte, and a real managed allocation shares its
// pages with nothing only because the driver gives each one whole pages. cudaPointerGetAttributes
// of a live slab allocation (start or inside) is the real answer for managed memory; of slab
// memory in no live allocation, it is what the runtime says of memory it does not know (asked of
// a library-owned host byte, with that byte's address in the answer replaced by the pointer asked
// about), as it would say of a freed allocation.
//
// A refused attach or prefetch is answered by the runtime itself, as a refused batch is (Note
// [Managed discard]): the same call with the program's stream, flags and location and a range it
// refuses whatever else it is given, NULL (with length 0 for attach, which only a managed
// allocation may be given; one byte for a prefetch). So the stream and the flags are judged in
// the runtime's order (on the stand-in an unknown stream is cudaErrorInvalidResourceHandle before
// any range is looked at) and the last-error slot holds what the plain call leaves there; should
// the runtime take such a call, the answer is cudaErrorInvalidValue. A prefetch's location is
// judged after a null pointer but before the range (a freed range to device 999 is
// cudaErrorInvalidDevice on an H200, a null one cudaErrorInvalidValue), so a prefetch to a device
// the runtime does not have is put to it with the slab's first byte instead, a range it takes:
// it answers for the location as the plain call does. cudaMemAdvise, which takes no stream, is
// refused with cudaErrorInvalidValue.
//
// Note [Managed discard]
// cudaMemDiscardBatchAsync makes the contents of its ranges indeterminate until they are written
// or prefetched, and the driver discards whole pages: a discard of a slab allocation would also
// discard the neighbours that share a page with it, bytes their owners never gave up. A discard
// only permits the memory to lose its contents, so not discarding is always a correct
// implementation of it, and a slab range never reaches the driver's discard. Each range of a
// batch that starts in a slab must start in a live allocation, end inside it and not be empty
// (the runtime refuses an empty range of a batch; an empty slab range of a discard, which never
// reaches it, must be refused here). One that fails refuses the whole call, and so does a bad
// location array below; the answer is then the runtime's own, to the same call with every slab
// range replaced by one it refuses whatever else it is given (NULL, one byte). So the stream,
// the flags and the other arrays are judged in the runtime's order (on the stand-in an unknown
// stream is cudaErrorInvalidResourceHandle before any range is looked at, and everything else
// cudaErrorInvalidValue), the last-error slot holds what the plain call leaves there, and no
// slab range reaches the driver. Should the runtime take such a call, the answer is
// cudaErrorInvalidValue. Then:
// - cudaMemDiscardBatchAsync forwards the other ranges as a batch of their own. When none is
//   left no call is made, and the answer is the runtime's for a valid batch on that stream:
//   cudaErrorInvalidValue for flags other than 0 or the legacy stream (which the batch calls do
//   not take), otherwise what cudaStreamGetDevice says of the stream (an unknown handle is
//   refused). A capturing stream gets cudaSuccess and nothing is captured: there is nothing to do.
//   The batch calls' other requirement, concurrent managed access on every device, holds
//   wherever slabs exist (Note [Managed routing]).
// - cudaMemDiscardAndPrefetchBatchAsync is a discard followed by a prefetch; the slab ranges get
//   only the prefetch. One cudaMemPrefetchBatchAsync of the slab ranges with their own locations
//   is followed, on the same stream, by one cudaMemDiscardAndPrefetchBatchAsync of the others (if
//   any). The ranges are disjoint and the operations of a batch unordered anyway, so the two
//   calls in stream order do what the one did. The prefetch goes first: if either call is
//   refused, no byte has changed (a prefetch moves pages, never contents), as a refused single
//   call leaves them. The location arrays are checked as CUDA documents them (first index 0,
//   increasing, below count, at most one entry per range) before they are split.
// - cudaMemPrefetchBatchAsync is forwarded unchanged once its slab ranges are checked: a
//   prefetch is a placement hint and may cover neighbours that share a page.
// A batch with no range in a slab, or with arrays the runtime must judge (NULL), is forwarded
// unchanged; it costs one slab lookup per range. What skipping a discard gives up is only what a
// discard could save: migrating bytes the program no longer needs, and memory pressure.
//
// Depends on the registry, the real-function table, hooks.h, the log and the configuration.
#include "interpose/managed_hooks.h"

#include <vector>

#include "interpose/driver_context.h"
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
      device, size, ptr,
      [&] {
        return hooks::with_room(device, size,
                                [&] { return real::cudaMallocManaged()(ptr, size, flags); });
      },
      pooling::Passed::managed);
  if (result != pooling::kOverBudget) return static_cast<cudaError_t>(result);
  return raise_out_of_memory(ptr);
}

// What the chains make of `ptr`: the chain of the current device first, then the others.
ManagedLookup find_managed(const void* ptr) {
  Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  ManagedLookup found;
  if (registry.managed_bound() == 0) return found;  // no slab yet: not even a device query
  pooling::release_passed_managed_frees();
  const int current = current_device();
  if (ManagedSlabs* chain = registry.managed(current)) found = chain->find(address);
  for (int d = 0; found.kind == ManagedLookup::Kind::not_mine && d < registry.managed_bound();
       ++d) {
    if (d == current) continue;
    if (ManagedSlabs* chain = registry.managed(d)) found = chain->find(address);
  }
  if (found.kind == ManagedLookup::Kind::live && pooling::managed_free_held(found.start))
    found = ManagedLookup{ManagedLookup::Kind::free_space, 0, 0, found.slab, found.slab_size};
  return found;
}

cudaError_t refuse() {
  return raise_invalid_value();
}

// A range of a slab allocation (Note [Managed attach]): inside one live allocation.
bool range_allowed(const ManagedLookup& found, const void* ptr, std::size_t count) {
  if (found.kind != ManagedLookup::Kind::live) return false;
  const DevicePtr offset = reinterpret_cast<DevicePtr>(ptr) - found.start;
  return count <= found.size - offset;
}

// Note [Managed discard]: marks the ranges that start in a slab (`in_slab` stays empty when none
// does); false when one of them is empty or not inside a live allocation.
bool check_batch(void* const* ptrs, const std::size_t* sizes, std::size_t count,
                 std::vector<unsigned char>* in_slab) {
  if (ptrs == nullptr || sizes == nullptr) return true;
  bool allowed = true;
  for (std::size_t i = 0; i < count; ++i) {
    const ManagedLookup found = find_managed(ptrs[i]);
    if (found.kind == ManagedLookup::Kind::not_mine) continue;
    allowed = allowed && sizes[i] != 0 && range_allowed(found, ptrs[i], sizes[i]);
    if (in_slab->empty()) in_slab->resize(count);
    (*in_slab)[i] = 1;
  }
  return allowed;
}

// Note [Managed discard]: a refused batch's ranges for the runtime, each slab range replaced by
// one the runtime refuses whatever else the call says.
struct RefusedRanges {
  std::vector<void*> ptrs;
  std::vector<std::size_t> sizes;

  RefusedRanges(void* const* program_ptrs, const std::size_t* program_sizes, std::size_t count,
                const std::vector<unsigned char>& in_slab)
      : ptrs(program_ptrs, program_ptrs + count), sizes(program_sizes, program_sizes + count) {
    for (std::size_t i = 0; i < count; ++i) {
      if (in_slab[i] == 0) continue;
      ptrs[i] = nullptr;
      sizes[i] = 1;
    }
  }
};

// Whether `location` is a device the runtime does not have. Slabs exist only where every device
// has concurrent managed access (CudaManagedBacking::every_device_concurrent), so that is the
// one thing about a device location the runtime can refuse.
bool device_unknown(const cudaMemLocation& location) {
  if (location.type != cudaMemLocationTypeDevice) return false;
  int count = 0;
  return real::cudaGetDeviceCount()(&count) != cudaSuccess || location.id < 0 ||
         location.id >= count;
}

// The runtime's refusal, or (should it have taken the call after all) cudaErrorInvalidValue.
cudaError_t refused_by(cudaError_t result) {
  return result != cudaSuccess ? result : refuse();
}

// The location arrays of a batch of `count` ranges, as CUDA documents them: firsts[k] is the
// first range locations[k] applies to.
bool locations_valid(std::size_t count, const cudaMemLocation* locations,
                     const std::size_t* firsts, std::size_t location_count) {
  if (locations == nullptr || firsts == nullptr || location_count == 0 ||
      location_count > count || firsts[0] != 0 || firsts[location_count - 1] >= count) {
    return false;
  }
  for (std::size_t k = 1; k < location_count; ++k) {
    if (firsts[k] <= firsts[k - 1]) return false;
  }
  return true;
}

// Part of a batch: ranges with their locations in CUDA's run-length form.
struct SubBatch {
  std::vector<void*> ptrs;
  std::vector<std::size_t> sizes;
  std::vector<cudaMemLocation> locations;
  std::vector<std::size_t> firsts;
  std::size_t last_run = static_cast<std::size_t>(-1);

  void add(void* ptr, std::size_t size, const cudaMemLocation& location, std::size_t run) {
    if (run != last_run) {
      locations.push_back(location);
      firsts.push_back(ptrs.size());
      last_run = run;
    }
    ptrs.push_back(ptr);
    sizes.push_back(size);
  }
};

// Note [Managed discard]: the runtime's answer to a valid batch on `stream` with `flags`.
cudaError_t batch_answer(unsigned long long flags, cudaStream_t stream, bool per_thread) {
  if (flags != 0 || stream == cudaStreamLegacy || (stream == nullptr && !per_thread)) {
    return refuse();
  }
  // A capturing stream is never asked for its device: that would invalidate its capture (Note
  // [A capturing stream's device] in capture_hooks.cpp). Asking whether it captures is legal.
  // On one whose capture is invalidated the plain call fails as any work there does.
  const cudaStream_t named = per_thread && stream == nullptr ? cudaStreamPerThread : stream;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t asked = real::cudaStreamIsCapturing()(named, &status);
  if (asked != cudaSuccess || status == cudaStreamCaptureStatusActive) return asked;
  if (status == cudaStreamCaptureStatusInvalidated) return refuse_on_invalidated_capture(named);
  int device = 0;
  auto get_device = per_thread ? real::cudaStreamGetDevice_ptsz() : real::cudaStreamGetDevice();
  return get_device(stream, &device);
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
  // The slabs are the primary context's (Note [Contexts of the program's] in driver_context.cpp).
  if (driver::in_program_context()) return forward_managed(device, ptr, size, flags);
  // Where CUDA refuses it for a capture (and invalidates the capture), the real call answers
  // (Note [Unsafe calls in a capture] in capture_hooks.cpp).
  if (unsafe_calls_refused_here()) return forward_managed(device, ptr, size, flags);
  Registry& registry = Registry::instance();
  ManagedSlabs* chain = registry.managed_or_create(device);
  // Larger than this device's slabs (a 64th of a small device): the driver's, as configured.
  if (chain == nullptr || size > chain->slab_size()) {
    return forward_managed(device, ptr, size, flags);
  }
  ManagedAllocation allocation = chain->allocate(size, chain->granule());
  if (allocation.error.kind == ManagedErrorKind::out_of_memory) {
    if (MemoryManager* manager = registry.manager(device)) {
      manager->cleanup(true);
      // The idle pages went to the release thread, and count against the device, and a budget,
      // until their driver free returns (Note [Budget] in budget.cpp): the retry waits for
      // them, briefly, as a stream the program parked may hold that free. Without the wait the
      // retry was refused as the first was, and a request that fitted a slab passed through.
      constexpr std::uint32_t kPagesOnTheirWayMicros = 20000;
      CudaDevice* cuda = registry.device(device);
      if (cuda != nullptr && cuda->releasing_bytes() != 0)
        cuda->flush_releases(kPagesOnTheirWayMicros);
      allocation = chain->allocate(size, chain->granule());
    }
  }
  if (allocation.ptr != 0) {
    *ptr = reinterpret_cast<void*>(allocation.ptr);
    bind_after_own_calls();  // Note [A thread's first call] in hooks.cpp
    return cudaSuccess;
  }
  if (allocation.error.kind == ManagedErrorKind::too_large &&
      registry.first_time(Registry::Once::managed_full, device)) {
    log_format(LogLevel::basic,
               "device %d: managed slabs full (%s); passing such requests to cudaMallocManaged",
               device, describe(allocation.error).c_str());
  }
  if (allocation.error.kind == ManagedErrorKind::pinned &&
      registry.first_time(Registry::Once::managed_pinned, device)) {
    log_format(LogLevel::basic,
               "device %d: managed slabs kept by few live bytes (%s); passing the requests "
               "they cannot take to cudaMallocManaged",
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
  // Note [Managed attach]; a refusal is the runtime's, asked of a null pointer.
  const bool flags_valid =
      flags == cudaMemAttachGlobal || flags == cudaMemAttachHost || flags == cudaMemAttachSingle;
  if (found.kind != ManagedLookup::Kind::live || !flags_valid ||
      (length != 0 && (reinterpret_cast<DevicePtr>(ptr) != found.start || length != found.size))) {
    return refused_by(attach(stream, nullptr, 0, flags));
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
  auto prefetch = per_thread ? real::cudaMemPrefetchAsync_ptsz() : real::cudaMemPrefetchAsync();
  const ManagedLookup found = find_managed(ptr);
  // Note [Managed attach]: a refusal is the runtime's, asked of a range it always refuses, or,
  // for a device it does not have, of the slab's first byte.
  if (found.kind != ManagedLookup::Kind::not_mine && !range_allowed(found, ptr, count)) {
    const void* asked = device_unknown(location) ? reinterpret_cast<void*>(found.slab) : nullptr;
    return refused_by(prefetch(asked, 1, location, flags, stream));
  }
  return prefetch(ptr, count, location, flags, stream);
}

cudaError_t pointer_get_attributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr || find_managed(ptr).kind != ManagedLookup::Kind::free_space) {
    const cudaError_t result = real::cudaPointerGetAttributes()(attributes, ptr);
    // Device memory may be freed pooled memory, whose page the driver still knows as allocated;
    // host pointers, most of what libraries ask about, cost no look into the pools.
    if (result != cudaSuccess || attributes->type != cudaMemoryTypeDevice ||
        !pooling::in_pooled_free_memory(ptr))
      return result;
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

cudaError_t mem_prefetch_batch(void** ptrs, std::size_t* sizes, std::size_t count,
                               cudaMemLocation* locations, std::size_t* firsts,
                               std::size_t location_count, unsigned long long flags,
                               cudaStream_t stream, bool per_thread) {
  auto prefetch =
      per_thread ? real::cudaMemPrefetchBatchAsync_ptsz() : real::cudaMemPrefetchBatchAsync();
  std::vector<unsigned char> in_slab;
  if (!check_batch(ptrs, sizes, count, &in_slab)) {
    RefusedRanges refused(ptrs, sizes, count, in_slab);
    return refused_by(prefetch(refused.ptrs.data(), refused.sizes.data(), count, locations,
                               firsts, location_count, flags, stream));
  }
  return prefetch(ptrs, sizes, count, locations, firsts, location_count, flags, stream);
}

cudaError_t mem_discard_batch(void** ptrs, std::size_t* sizes, std::size_t count,
                              unsigned long long flags, cudaStream_t stream, bool per_thread) {
  auto discard =
      per_thread ? real::cudaMemDiscardBatchAsync_ptsz() : real::cudaMemDiscardBatchAsync();
  std::vector<unsigned char> in_slab;
  if (!check_batch(ptrs, sizes, count, &in_slab)) {
    RefusedRanges refused(ptrs, sizes, count, in_slab);
    return refused_by(discard(refused.ptrs.data(), refused.sizes.data(), count, flags, stream));
  }
  if (in_slab.empty()) return discard(ptrs, sizes, count, flags, stream);
  // Note [Managed discard]: only the ranges outside the slabs are discarded.
  std::vector<void*> kept_ptrs;
  std::vector<std::size_t> kept_sizes;
  for (std::size_t i = 0; i < count; ++i) {
    if (in_slab[i] != 0) continue;
    kept_ptrs.push_back(ptrs[i]);
    kept_sizes.push_back(sizes[i]);
  }
  if (kept_ptrs.empty()) return batch_answer(flags, stream, per_thread);
  return discard(kept_ptrs.data(), kept_sizes.data(), kept_ptrs.size(), flags, stream);
}

cudaError_t mem_discard_and_prefetch_batch(void** ptrs, std::size_t* sizes, std::size_t count,
                                           cudaMemLocation* locations, std::size_t* firsts,
                                           std::size_t location_count, unsigned long long flags,
                                           cudaStream_t stream, bool per_thread) {
  auto both = per_thread ? real::cudaMemDiscardAndPrefetchBatchAsync_ptsz()
                         : real::cudaMemDiscardAndPrefetchBatchAsync();
  std::vector<unsigned char> in_slab;
  const bool allowed = check_batch(ptrs, sizes, count, &in_slab);
  if (in_slab.empty()) {
    return both(ptrs, sizes, count, locations, firsts, location_count, flags, stream);
  }
  // Note [Managed discard]: the slab ranges are only prefetched, first.
  if (!allowed || !locations_valid(count, locations, firsts, location_count)) {
    RefusedRanges refused(ptrs, sizes, count, in_slab);
    return refused_by(both(refused.ptrs.data(), refused.sizes.data(), count, locations, firsts,
                           location_count, flags, stream));
  }
  SubBatch slab;
  SubBatch rest;
  std::size_t run = 0;
  for (std::size_t i = 0; i < count; ++i) {
    while (run + 1 < location_count && firsts[run + 1] <= i) ++run;
    (in_slab[i] != 0 ? slab : rest).add(ptrs[i], sizes[i], locations[run], run);
  }
  auto prefetch =
      per_thread ? real::cudaMemPrefetchBatchAsync_ptsz() : real::cudaMemPrefetchBatchAsync();
  const cudaError_t result =
      prefetch(slab.ptrs.data(), slab.sizes.data(), slab.ptrs.size(), slab.locations.data(),
               slab.firsts.data(), slab.locations.size(), flags, stream);
  if (result != cudaSuccess || rest.ptrs.empty()) return result;
  return both(rest.ptrs.data(), rest.sizes.data(), rest.ptrs.size(), rest.locations.data(),
              rest.firsts.data(), rest.locations.size(), flags, stream);
}

}  // namespace poolcuda::hooks
