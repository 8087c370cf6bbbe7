// The hooked calls of managed memory: cudaMallocManaged served from the device's slabs, and
// the calls that take a managed pointer and act on "its allocation" or a range of it
// (cudaStreamAttachMemAsync, cudaMemAdvise, cudaMemPrefetchAsync, cudaPointerGetAttributes),
// which must treat a slab allocation as the real runtime treats a managed allocation of its
// own. The exported shims (exports.cpp) call one of these after their re-entry and pass-through
// checks; cudaFree of a slab allocation reaches its chain through pooling::release.
//
// Depends on the registry, the real-function table and the configuration.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "pools/types.h"

namespace poolcuda::hooks {

cudaError_t malloc_managed(void** ptr, std::size_t size, unsigned int flags);
cudaError_t stream_attach_mem(cudaStream_t stream, void* ptr, std::size_t length,
                              unsigned int flags, bool per_thread);
cudaError_t mem_advise(const void* ptr, std::size_t count, cudaMemoryAdvise advice,
                       cudaMemLocation location);
cudaError_t mem_prefetch(const void* ptr, std::size_t count, cudaMemLocation location,
                         unsigned int flags, cudaStream_t stream, bool per_thread);
cudaError_t pointer_get_attributes(cudaPointerAttributes* attributes, const void* ptr);

}  // namespace poolcuda::hooks
