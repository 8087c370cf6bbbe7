// The core of every hooked CUDA runtime entry point: what cudaMalloc, cudaFree, cudaMemGetInfo,
// cudaDeviceReset and the stream calls do when the pools are active. The exported shims
// (exports.cpp) call exactly one of these after their re-entry and pass-through checks; these
// functions never check either.
//
// Depends on the pooling core, the real-function table and the driver variants.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace poolcuda::hooks {

cudaError_t malloc(void** ptr, std::size_t size);
cudaError_t free(void* ptr);
cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t device_reset();
cudaError_t stream_create(cudaStream_t* stream);
cudaError_t stream_create_with_flags(cudaStream_t* stream, unsigned int flags);
cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t stream_destroy(cudaStream_t stream);

// cudaGetDriverEntryPoint(ByVersion): what the real call found, a hooked driver variant mapped
// to the library's hook.
cudaError_t map_driver_entry(cudaError_t result, void** fn);

}  // namespace poolcuda::hooks

// Every runtime entry point the library exports.
#define POOLCUDA_RUNTIME_HOOKS(X)           \
  X(cudaMalloc)                             \
  X(cudaFree)                               \
  X(cudaMemGetInfo)                         \
  X(cudaDeviceReset)                        \
  X(cudaStreamCreate)                       \
  X(cudaStreamCreateWithFlags)              \
  X(cudaStreamCreateWithPriority)           \
  X(cudaStreamDestroy)                      \
  X(cudaGetDriverEntryPoint)                \
  X(cudaGetDriverEntryPoint_ptsz)           \
  X(cudaGetDriverEntryPointByVersion)       \
  X(cudaGetDriverEntryPointByVersion_ptsz)

namespace poolcuda {

// The library's exported hook named `name`, or nullptr when it hooks no runtime call of that
// name (for dlsym, see dlsym_hook.cpp).
void* runtime_hook(const char* name);

}  // namespace poolcuda
