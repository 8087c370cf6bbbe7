// How the runtime stand-in reaches the driver stand-in: as the real runtime does, through
// dlopen("libcuda.so.1"), dlsym(handle, "cuGetProcAddress_v2") and then that resolver for each
// entry point, so an interposer on libcuda.so.1 sees every lookup. cudaGetDriverEntryPoint, the
// array, mipmapped-array, explicit-pool and device-limit calls use it in both builds (their
// `via_driver` functions below), as the real runtime's do. In the static-runtime archive
// (SIMCUDA_STATIC_RUNTIME, see Note [Static runtime] in rt_driver.cpp) the memory (stream-ordered
// frees too), memory-info, device reset, stream create/destroy, capture begin/end and kernel
// launch entry points also go through it,
// exactly like a program built with nvcc's default static cudart.
#pragma once

#include "rt_common.h"

namespace poolcuda::sim::rt {

// cudaGetDriverEntryPoint(ByVersion): the driver's resolver answers; `status` as the runtime
// reports it.
cudaError_t driver_entry(const char* symbol, void** fn, unsigned version,
                         unsigned long long flags, cudaDriverEntryPointQueryResult* status);

}  // namespace poolcuda::sim::rt

// The static runtime's calls into the driver. Each returns the runtime's error code (the codes
// coincide with the driver's), cudaErrorNotSupported when the driver cannot be reached.
namespace poolcuda::sim::via_driver {

cudaError_t malloc(void** ptr, size_t size);
cudaError_t malloc_managed(void** ptr, size_t size, unsigned int flags);
cudaError_t free(void* ptr);
cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread);
// cudaDeviceReset: the primary context's reset (cuDevicePrimaryCtxReset_v2) of `device`.
cudaError_t device_reset(int device);
cudaError_t mem_get_info(size_t* free_bytes, size_t* total_bytes);
cudaError_t stream_create(cudaStream_t* stream, unsigned int flags);
cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t stream_destroy(cudaStream_t stream);
cudaError_t begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode, bool per_thread);
cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph, bool per_thread);
// Every kernel launch (cuLaunchKernel, or its _ptsz form for the runtime's _ptsz forms): the
// driver loads the function's module, then refuses. A null function never reaches the driver
// (cudaErrorInvalidDeviceFunction).
cudaError_t launch_kernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                          cudaStream_t stream, bool per_thread);

// Both builds. Height 0 is a 1D array; a channel description no CUDA array holds is
// cudaErrorInvalidChannelDescriptor. Freeing NULL does nothing.
cudaError_t malloc_array(cudaArray_t* array, const cudaChannelFormatDesc* desc, size_t width,
                         size_t height, unsigned int flags);
cudaError_t malloc_3d_array(cudaArray_t* array, const cudaChannelFormatDesc* desc,
                            cudaExtent extent, unsigned int flags);
cudaError_t free_array(cudaArray_t array);
// numLevels is the driver's to clamp; freeing NULL does nothing.
cudaError_t malloc_mipmapped_array(cudaMipmappedArray_t* array, const cudaChannelFormatDesc* desc,
                                   cudaExtent extent, unsigned int levels, unsigned int flags);
cudaError_t get_mipmapped_array_level(cudaArray_t* level_array, cudaMipmappedArray_const_t array,
                                      unsigned int level);
cudaError_t free_mipmapped_array(cudaMipmappedArray_t array);
// The current context's limits (the device's primary context, once the runtime bound it).
cudaError_t device_set_limit(cudaLimit limit, size_t value);
cudaError_t device_get_limit(size_t* value, cudaLimit limit);
cudaError_t mem_pool_create(cudaMemPool_t* pool, const cudaMemPoolProps* props);
cudaError_t mem_pool_destroy(cudaMemPool_t pool);
cudaError_t malloc_from_pool_async(void** ptr, size_t size, cudaMemPool_t pool,
                                   cudaStream_t stream, bool per_thread);

}  // namespace poolcuda::sim::via_driver
