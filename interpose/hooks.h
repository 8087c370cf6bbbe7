// The core of every hooked CUDA entry point: what cudaMalloc, cudaFree, cudaMemGetInfo,
// cudaDeviceReset and the stream calls do when the pools are active. The exported shims
// (exports.cpp) call exactly one of these after their re-entry and pass-through checks; these
// functions never check either.
//
// Depends on the registry, the real-function table and the configuration.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace poolcuda::hooks {

cudaError_t malloc(void** ptr, std::size_t size);
cudaError_t free(void* ptr);
cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread);
cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t device_reset();
cudaError_t stream_create(cudaStream_t* stream);
cudaError_t stream_create_with_flags(cudaStream_t* stream, unsigned int flags);
cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t stream_destroy(cudaStream_t stream);

}  // namespace poolcuda::hooks
