// Runtime stand-in entry points that act on managed memory without allocating it:
// cudaStreamAttachMemAsync, cudaMemAdvise, cudaMemPrefetchAsync, and the batch calls
// cudaMemPrefetchBatchAsync, cudaMemDiscardBatchAsync and cudaMemDiscardAndPrefetchBatchAsync
// (and their per-thread variants). The stand-in has no page migration, so attach, advice and
// prefetches move or change no byte; what they model is CUDA's argument checking (a range inside
// one managed allocation, the attach length rule, valid flags, advice, locations, devices and
// streams), their stream ordering, and attach refusing a capturing stream. A discard changes
// bytes (Note [Discard poison]). Leaf entry points over core.h's memory and streams.
//
// Note [Discard poison]
// A discarded range reads as indeterminate until it is written or prefetched, and the driver
// acts on whole pages: a discard of a few bytes makes its whole CPU pages indeterminate. The
// stand-in makes that visible. When a discard runs on its stream, it overwrites every
// SIMCUDA_MANAGED_PAGE-byte (4 KiB) page its ranges touch with SIMCUDA_DISCARD_POISON
// (simcuda.h), so that a test sees which bytes a discard reached, neighbours of the range within
// the same allocation included. Allocations start on pages and own the rest of their last page
// (memory.cpp), so the poison never reaches another allocation of the stand-in. The prefetch of a
// discard-and-prefetch leaves the poison in place: after a discard, a prefetch migrates pages
// without their old contents.
#include <cstdio>
#include <cstring>

#include "rt_common.h"
#include "simcuda.h"

using namespace poolcuda::sim;

extern "C" {
cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void* devPtr, size_t length,
                                          unsigned int flags);
cudaError_t cudaMemPrefetchAsync_ptsz(const void* devPtr, size_t count,
                                      cudaMemLocation location, unsigned int flags,
                                      cudaStream_t stream);
cudaError_t cudaMemPrefetchBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                           cudaMemLocation* prefetchLocs,
                                           size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                           unsigned long long flags, cudaStream_t stream);
cudaError_t cudaMemDiscardBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                          unsigned long long flags, cudaStream_t stream);
cudaError_t cudaMemDiscardAndPrefetchBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                                     cudaMemLocation* prefetchLocs,
                                                     size_t* prefetchLocIdxs,
                                                     size_t numPrefetchLocs,
                                                     unsigned long long flags,
                                                     cudaStream_t stream);
}

namespace {

// The managed allocation that holds all of [ptr, ptr + count): count 0 is refused, as CUDA
// refuses an empty range.
cudaError_t managed_range(const void* ptr, size_t count, AllocInfo* info) {
  if (ptr == nullptr || count == 0) return cudaErrorInvalidValue;
  if (!mem_find(ptr, info) || info->kind != AllocKind::managed) return cudaErrorInvalidValue;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  if (count > info->base + info->size - p) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// A device location must name a device with concurrent managed access; the host ones need
// nothing (a NUMA node id is not checked: the stand-in has one node).
cudaError_t check_location(const cudaMemLocation& location) {
  switch (location.type) {
    case cudaMemLocationTypeDevice:
      if (!valid_device(location.id) || !config().concurrent_managed)
        return cudaErrorInvalidDevice;
      return cudaSuccess;
    case cudaMemLocationTypeHost:
    case cudaMemLocationTypeHostNuma:
    case cudaMemLocationTypeHostNumaCurrent:
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;
  }
}

// Stream-ordered and without effect: an empty operation on the stream.
cudaError_t enqueue_marker(const StreamRef& s, const char* what) {
  Work w;
  w.desc = what;
  return submit(s, std::move(w));
}

cudaError_t attach(const StreamRef& s, void* ptr, size_t length, unsigned flags) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost && flags != cudaMemAttachSingle)
    return cudaErrorInvalidValue;
  AllocInfo info;
  if (managed_range(ptr, 1, &info) != cudaSuccess) return cudaErrorInvalidValue;
  // Zero or the whole allocation's size (from its start): a part cannot change association.
  if (length != 0 && (reinterpret_cast<uintptr_t>(ptr) != info.base || length != info.size))
    return cudaErrorInvalidValue;
  {
    std::lock_guard lock(state_mutex());
    if (s->capture) {
      s->capture->invalidated = true;
      return cudaErrorStreamCaptureUnsupported;
    }
  }
  return enqueue_marker(s, "cudaStreamAttachMemAsync");
}

// A null pointer is refused before the location, and the location before the range, as CUDA 13
// does on an H200 (a freed range to device 999 is cudaErrorInvalidDevice, a null one
// cudaErrorInvalidValue).
cudaError_t prefetch(const StreamRef& s, const void* ptr, size_t count,
                     const cudaMemLocation& location, unsigned flags) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (flags != 0 || ptr == nullptr) return cudaErrorInvalidValue;
  if (cudaError_t err = check_location(location); err != cudaSuccess) return err;
  AllocInfo info;
  if (cudaError_t err = managed_range(ptr, count, &info); err != cudaSuccess) return err;
  if (!config().concurrent_managed) return cudaErrorInvalidDevice;  // the stream's device
  return enqueue_marker(s, "cudaMemPrefetchAsync");
}

// The checks every batch call makes: a stream other than the legacy one, flags 0, at least one
// range, each inside one managed allocation, and concurrent managed access on every device.
cudaError_t check_batch(const StreamRef& s, void* const* dptrs, const size_t* sizes,
                        size_t count, unsigned long long flags, std::vector<AllocInfo>* infos) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (s->kind == StreamKind::legacy) return cudaErrorInvalidValue;
  if (flags != 0 || count == 0 || dptrs == nullptr || sizes == nullptr)
    return cudaErrorInvalidValue;
  infos->resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (cudaError_t err = managed_range(dptrs[i], sizes[i], &(*infos)[i]); err != cudaSuccess)
      return err;
  }
  if (!config().concurrent_managed) return cudaErrorNotSupported;
  return cudaSuccess;
}

// The prefetch locations of a batch: prefetchLocIdxs[k] is the first operation prefetchLocs[k]
// applies to; the first index is 0, each is above the one before, all are below count, and
// there are at most count of them.
cudaError_t check_locations(size_t count, const cudaMemLocation* locations, const size_t* firsts,
                            size_t num) {
  if (locations == nullptr || firsts == nullptr || num == 0 || num > count)
    return cudaErrorInvalidValue;
  if (firsts[0] != 0 || firsts[num - 1] >= count) return cudaErrorInvalidValue;
  for (size_t k = 1; k < num; ++k) {
    if (firsts[k] <= firsts[k - 1]) return cudaErrorInvalidValue;
  }
  for (size_t k = 0; k < num; ++k) {
    if (cudaError_t err = check_location(locations[k]); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// Note [Discard poison]: one stream operation that poisons the pages of every range of the
// batch, each checked, when it runs, to be still the allocation it was.
cudaError_t enqueue_discard(const StreamRef& s, void* const* dptrs, const size_t* sizes,
                            const std::vector<AllocInfo>& infos, const char* what) {
  struct Pages {
    uintptr_t begin;
    uintptr_t end;
    uint64_t id;
  };
  constexpr uintptr_t kPage = SIMCUDA_MANAGED_PAGE;
  std::vector<Pages> pages;
  Work w;
  w.desc = what;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto p = reinterpret_cast<uintptr_t>(dptrs[i]);
    const uintptr_t begin = p / kPage * kPage;
    const uintptr_t end = (p + sizes[i] + kPage - 1) / kPage * kPage;
    pages.push_back(Pages{begin, end, infos[i].id});
    w.ranges.push_back(Range{begin, end, true});
  }
  w.fn = [pages = std::move(pages)] {
    std::lock_guard lock(effects_mutex());
    for (const Pages& range : pages) {
      AllocInfo now;
      if (!mem_find(reinterpret_cast<void*>(range.begin), &now) || now.id != range.id) {
        // Freed on an unordered stream: what a GPU reports as an illegal address.
        std::fprintf(stderr, "simcuda: discard reaches freed device memory at %#lx\n",
                     static_cast<unsigned long>(range.begin));
        set_sticky_error(cudaErrorIllegalAddress);
        return;
      }
      std::memset(reinterpret_cast<void*>(range.begin), SIMCUDA_DISCARD_POISON,
                  range.end - range.begin);
    }
  };
  return submit(s, std::move(w));
}

cudaError_t prefetch_batch(const StreamRef& s, void** dptrs, size_t* sizes, size_t count,
                           cudaMemLocation* locations, size_t* firsts, size_t num,
                           unsigned long long flags) {
  bump(Counter::cudaMemPrefetchBatchAsync);
  std::vector<AllocInfo> infos;
  if (cudaError_t err = check_batch(s, dptrs, sizes, count, flags, &infos); err != cudaSuccess)
    return err;
  if (cudaError_t err = check_locations(count, locations, firsts, num); err != cudaSuccess)
    return err;
  return enqueue_marker(s, "cudaMemPrefetchBatchAsync");
}

cudaError_t discard_batch(const StreamRef& s, void** dptrs, size_t* sizes, size_t count,
                          unsigned long long flags) {
  bump(Counter::cudaMemDiscardBatchAsync);
  std::vector<AllocInfo> infos;
  if (cudaError_t err = check_batch(s, dptrs, sizes, count, flags, &infos); err != cudaSuccess)
    return err;
  return enqueue_discard(s, dptrs, sizes, infos, "cudaMemDiscardBatchAsync");
}

cudaError_t discard_and_prefetch_batch(const StreamRef& s, void** dptrs, size_t* sizes,
                                       size_t count, cudaMemLocation* locations, size_t* firsts,
                                       size_t num, unsigned long long flags) {
  bump(Counter::cudaMemDiscardAndPrefetchBatchAsync);
  std::vector<AllocInfo> infos;
  if (cudaError_t err = check_batch(s, dptrs, sizes, count, flags, &infos); err != cudaSuccess)
    return err;
  if (cudaError_t err = check_locations(count, locations, firsts, num); err != cudaSuccess)
    return err;
  return enqueue_discard(s, dptrs, sizes, infos, "cudaMemDiscardAndPrefetchBatchAsync");
}

}  // namespace

cudaError_t cudaStreamAttachMemAsync(cudaStream_t stream, void* devPtr, size_t length,
                                     unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(attach(resolve_stream(stream, false), devPtr, length, flags));
}

cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void* devPtr, size_t length,
                                          unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(attach(resolve_stream(stream, true), devPtr, length, flags));
}

cudaError_t cudaMemAdvise(const void* devPtr, size_t count, cudaMemoryAdvise advice,
                          cudaMemLocation location) {
  SIM_ENTER();
  AllocInfo info;
  if (cudaError_t err = managed_range(devPtr, count, &info); err != cudaSuccess) SIM_RETURN(err);
  switch (advice) {
    case cudaMemAdviseSetReadMostly:
    case cudaMemAdviseUnsetReadMostly:
    case cudaMemAdviseUnsetPreferredLocation:
      return cudaSuccess;  // the location is ignored
    case cudaMemAdviseSetPreferredLocation:
      // An H200 answers an unknown device here with cudaErrorInvalidValue, where a prefetch's
      // answer is cudaErrorInvalidDevice.
      if (location.type == cudaMemLocationTypeDevice && !valid_device(location.id))
        SIM_RETURN(cudaErrorInvalidValue);
      SIM_RETURN(check_location(location));
    case cudaMemAdviseSetAccessedBy:
    case cudaMemAdviseUnsetAccessedBy:
      if (location.type != cudaMemLocationTypeDevice && location.type != cudaMemLocationTypeHost)
        SIM_RETURN(cudaErrorInvalidValue);
      SIM_RETURN(check_location(location));
  }
  SIM_RETURN(cudaErrorInvalidValue);
}

cudaError_t cudaMemPrefetchAsync(const void* devPtr, size_t count, cudaMemLocation location,
                                 unsigned int flags, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(prefetch(resolve_stream(stream, false), devPtr, count, location, flags));
}

cudaError_t cudaMemPrefetchAsync_ptsz(const void* devPtr, size_t count, cudaMemLocation location,
                                      unsigned int flags, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(prefetch(resolve_stream(stream, true), devPtr, count, location, flags));
}

cudaError_t cudaMemPrefetchBatchAsync(void** dptrs, size_t* sizes, size_t count,
                                      cudaMemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                      size_t numPrefetchLocs, unsigned long long flags,
                                      cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(prefetch_batch(resolve_stream(stream, false), dptrs, sizes, count, prefetchLocs,
                            prefetchLocIdxs, numPrefetchLocs, flags));
}

cudaError_t cudaMemPrefetchBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                           cudaMemLocation* prefetchLocs,
                                           size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                           unsigned long long flags, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(prefetch_batch(resolve_stream(stream, true), dptrs, sizes, count, prefetchLocs,
                            prefetchLocIdxs, numPrefetchLocs, flags));
}

cudaError_t cudaMemDiscardBatchAsync(void** dptrs, size_t* sizes, size_t count,
                                     unsigned long long flags, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(discard_batch(resolve_stream(stream, false), dptrs, sizes, count, flags));
}

cudaError_t cudaMemDiscardBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                          unsigned long long flags, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(discard_batch(resolve_stream(stream, true), dptrs, sizes, count, flags));
}

cudaError_t cudaMemDiscardAndPrefetchBatchAsync(void** dptrs, size_t* sizes, size_t count,
                                                cudaMemLocation* prefetchLocs,
                                                size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                                unsigned long long flags, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(discard_and_prefetch_batch(resolve_stream(stream, false), dptrs, sizes, count,
                                        prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags));
}

cudaError_t cudaMemDiscardAndPrefetchBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                                     cudaMemLocation* prefetchLocs,
                                                     size_t* prefetchLocIdxs,
                                                     size_t numPrefetchLocs,
                                                     unsigned long long flags,
                                                     cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(discard_and_prefetch_batch(resolve_stream(stream, true), dptrs, sizes, count,
                                        prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags));
}
