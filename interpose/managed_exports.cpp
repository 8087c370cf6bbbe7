// The exported managed-memory entry points: cudaMallocManaged and the calls that act on a
// managed allocation (attach, advise, prefetch, pointer attributes). Thin shims like those of
// exports.cpp: calls from inside the library or in a forked child go straight to the real
// function; everything else is one call into managed_hooks.cpp through guarded().
//
// Depends on managed_hooks.h, exports_common.h and real_cuda.h only.
#include <cuda_runtime_api.h>

#include "interpose/exports_common.h"
#include "interpose/managed_hooks.h"
#include "interpose/real_cuda.h"

namespace pc = poolcuda;
namespace hooks = poolcuda::hooks;

POOLCUDA_EXPORT cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaMallocManaged()(ptr, size, flags);
  return pc::guarded([&] { return hooks::malloc_managed(ptr, size, flags); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamAttachMemAsync(cudaStream_t stream, void* ptr,
                                                     size_t length, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaStreamAttachMemAsync()(stream, ptr, length, flags);
  return pc::guarded([&] { return hooks::stream_attach_mem(stream, ptr, length, flags, false); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void* ptr,
                                                          size_t length, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaStreamAttachMemAsync_ptsz()(stream, ptr, length, flags);
  return pc::guarded([&] { return hooks::stream_attach_mem(stream, ptr, length, flags, true); });
}

POOLCUDA_EXPORT cudaError_t cudaMemAdvise(const void* ptr, size_t count, cudaMemoryAdvise advice,
                                          cudaMemLocation location) {
  if (pc::bypass()) return pc::real::cudaMemAdvise()(ptr, count, advice, location);
  return pc::guarded([&] { return hooks::mem_advise(ptr, count, advice, location); });
}

POOLCUDA_EXPORT cudaError_t cudaMemPrefetchAsync(const void* ptr, size_t count,
                                                 cudaMemLocation location, unsigned int flags,
                                                 cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaMemPrefetchAsync()(ptr, count, location, flags, stream);
  return pc::guarded(
      [&] { return hooks::mem_prefetch(ptr, count, location, flags, stream, false); });
}

POOLCUDA_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void* ptr, size_t count,
                                                      cudaMemLocation location,
                                                      unsigned int flags, cudaStream_t stream) {
  if (pc::bypass()) {
    return pc::real::cudaMemPrefetchAsync_ptsz()(ptr, count, location, flags, stream);
  }
  return pc::guarded(
      [&] { return hooks::mem_prefetch(ptr, count, location, flags, stream, true); });
}

POOLCUDA_EXPORT cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                                     const void* ptr) {
  if (pc::bypass()) return pc::real::cudaPointerGetAttributes()(attributes, ptr);
  return pc::guarded([&] { return hooks::pointer_get_attributes(attributes, ptr); });
}
