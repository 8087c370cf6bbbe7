// Runtime stand-in entry points that act on managed memory without allocating it:
// cudaStreamAttachMemAsync, cudaMemAdvise and cudaMemPrefetchAsync (and their per-thread
// variants). The stand-in has no page migration, so none of them moves or changes a byte; what
// they model is CUDA's argument checking (a range inside one managed allocation, the attach
// length rule, valid flags, advice, locations, devices and streams), their stream ordering, and
// attach refusing a capturing stream. Leaf entry points over core.h's memory and streams.
#include "rt_common.h"

using namespace poolcuda::sim;

extern "C" {
cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void* devPtr, size_t length,
                                          unsigned int flags);
cudaError_t cudaMemPrefetchAsync_ptsz(const void* devPtr, size_t count,
                                      cudaMemLocation location, unsigned int flags,
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

cudaError_t prefetch(const StreamRef& s, const void* ptr, size_t count,
                     const cudaMemLocation& location, unsigned flags) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (flags != 0) return cudaErrorInvalidValue;
  AllocInfo info;
  if (cudaError_t err = managed_range(ptr, count, &info); err != cudaSuccess) return err;
  if (cudaError_t err = check_location(location); err != cudaSuccess) return err;
  if (!config().concurrent_managed) return cudaErrorInvalidDevice;  // the stream's device
  return enqueue_marker(s, "cudaMemPrefetchAsync");
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
