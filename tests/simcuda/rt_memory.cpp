// Runtime stand-in entry points for memory: allocation (device, pitched, managed, pinned host,
// stream-ordered, arrays, mipmapped arrays, explicit pools), free, cudaMemGetInfo, copies,
// memsets and pointer attributes. Copies and memsets (transfer.cpp) are stream operations
// declaring the device ranges they read and write; the synchronous forms run on the legacy (or
// per-thread) default stream and wait for it. Arrays, mipmapped arrays and explicit pools always
// call the driver; in the static-runtime archive cudaMalloc, cudaFree, cudaMallocManaged and
// cudaMemGetInfo do too (Note [Static runtime] in rt_driver.cpp).
#include <cstdio>
#include <cstring>

#include "rt_common.h"
#include "rt_driver.h"

using namespace poolcuda::sim;

namespace {

cudaError_t alloc_checked(void** p, size_t size, AllocKind kind) {
  if (!p) return cudaErrorInvalidValue;
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return err;
  return after_refusal(mem_alloc(current_device(), size, kind, p));
}

}  // namespace

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  bump(Counter::cudaMalloc);
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::malloc(devPtr, size));
  SIM_RETURN(alloc_checked(devPtr, size, AllocKind::device));
}

cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  SIM_ENTER();
  if (!pitch) SIM_RETURN(cudaErrorInvalidValue);
  if (width > SIZE_MAX - 511) SIM_RETURN(cudaErrorMemoryAllocation);  // no row that wide fits
  size_t p = (width + 511) / 512 * 512;
  if (height && p > SIZE_MAX / height) SIM_RETURN(cudaErrorMemoryAllocation);
  cudaError_t err = alloc_checked(devPtr, p * height, AllocKind::device);
  if (err == cudaSuccess) *pitch = p;
  SIM_RETURN(err);
}

cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  bump(Counter::cudaMallocManaged);
  SIM_ENTER();
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) SIM_RETURN(cudaErrorInvalidValue);
  if (!devPtr) SIM_RETURN(cudaErrorInvalidValue);
  if (size == 0) {  // as for cudaMalloc: success with NULL, and the driver is never reached
    *devPtr = nullptr;
    return cudaSuccess;
  }
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::malloc_managed(devPtr, size, flags));
  SIM_RETURN(alloc_checked(devPtr, size, AllocKind::managed));
}

cudaError_t cudaFree(void* devPtr) {
  bump(Counter::cudaFree);
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::free(devPtr));
  if (!devPtr) return cudaSuccess;
  free_latency();
  AllocInfo info;
  if (!mem_find(devPtr, &info) || info.base != reinterpret_cast<uintptr_t>(devPtr))
    SIM_RETURN(cudaErrorInvalidValue);
  // Potentially unsafe (Note [Capture legality] in capture.cpp): a relaxed capture allows it.
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) SIM_RETURN(err);
  // CUDA takes every access to stream-ordered memory as complete at this free, and waits for
  // nothing; work still queued on it then touches freed memory (an illegal address).
  if (info.kind != AllocKind::async) device_drain(info.device);
  cudaError_t err;
  {
    std::lock_guard lock(effects_mutex());
    err = mem_free(devPtr, info.id);
  }
  SIM_RETURN(after_free(err));
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  SIM_ENTER();
  if (!ptr) SIM_RETURN(cudaErrorInvalidValue);
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) SIM_RETURN(err);
  SIM_RETURN(host_alloc(size, cudaHostAllocDefault, ptr));
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  SIM_ENTER();
  if (!ptr || (flags & ~0xfu)) SIM_RETURN(cudaErrorInvalidValue);
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) SIM_RETURN(err);
  SIM_RETURN(host_alloc(size, flags, ptr));
}

cudaError_t cudaFreeHost(void* ptr) {
  SIM_ENTER();
  SIM_RETURN(host_free(ptr));
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(after_refusal(malloc_async(resolve_stream(stream, false), size, devPtr)));
}

cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(after_refusal(malloc_async(resolve_stream(stream, true), size, devPtr)));
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::free_async(devPtr, stream, false));
  SIM_RETURN(free_async(resolve_stream(stream, false), devPtr));
}

cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::free_async(devPtr, stream, true));
  SIM_RETURN(free_async(resolve_stream(stream, true), devPtr));
}

// A pure function (no context, no error state), which the headers' cudaCreateChannelDesc<T>()
// templates call.
cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w, cudaChannelFormatKind f) {
  return cudaChannelFormatDesc{x, y, z, w, f};
}

// Arrays, mipmapped arrays and explicit pools: only through the driver's entry points, so that
// an interposer on libcuda.so.1 sees them, as with the real runtime (rt_driver.h).
cudaError_t cudaMallocArray(cudaArray_t* array, const cudaChannelFormatDesc* desc, size_t width,
                            size_t height, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(via_driver::malloc_array(array, desc, width, height, flags));
}

cudaError_t cudaMalloc3DArray(cudaArray_t* array, const cudaChannelFormatDesc* desc,
                              cudaExtent extent, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(via_driver::malloc_3d_array(array, desc, extent, flags));
}

cudaError_t cudaFreeArray(cudaArray_t array) {
  SIM_ENTER();
  SIM_RETURN(via_driver::free_array(array));
}

cudaError_t cudaMallocMipmappedArray(cudaMipmappedArray_t* mipmappedArray,
                                     const cudaChannelFormatDesc* desc, cudaExtent extent,
                                     unsigned int numLevels, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(via_driver::malloc_mipmapped_array(mipmappedArray, desc, extent, numLevels, flags));
}

cudaError_t cudaGetMipmappedArrayLevel(cudaArray_t* levelArray,
                                       cudaMipmappedArray_const_t mipmappedArray,
                                       unsigned int level) {
  SIM_ENTER();
  SIM_RETURN(via_driver::get_mipmapped_array_level(levelArray, mipmappedArray, level));
}

cudaError_t cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray) {
  SIM_ENTER();
  SIM_RETURN(via_driver::free_mipmapped_array(mipmappedArray));
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const cudaMemPoolProps* poolProps) {
  SIM_ENTER();
  SIM_RETURN(via_driver::mem_pool_create(memPool, poolProps));
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  SIM_ENTER();
  SIM_RETURN(via_driver::mem_pool_destroy(memPool));
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(via_driver::malloc_from_pool_async(ptr, size, memPool, stream, false));
}

cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(via_driver::malloc_from_pool_async(ptr, size, memPool, stream, true));
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  SIM_ENTER();
  bump(Counter::cudaMemGetInfo);
  if (!free || !total) SIM_RETURN(cudaErrorInvalidValue);
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::mem_get_info(free, total));
  mem_info(current_device(), free, total);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  SIM_ENTER();
  SIM_RETURN(mem_copy(dst, src, count, kind, resolve_stream(nullptr, false), true, "cudaMemcpy"));
}

cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  SIM_ENTER();
  SIM_RETURN(mem_copy(dst, src, count, kind, resolve_stream(nullptr, true), true, "cudaMemcpy"));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(mem_copy(dst, src, count, kind, resolve_stream(stream, false), false,
                      "cudaMemcpyAsync"));
}

cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                 cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(mem_copy(dst, src, count, kind, resolve_stream(stream, true), false,
                      "cudaMemcpyAsync"));
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  SIM_ENTER();
  SIM_RETURN(mem_set(devPtr, value, count, resolve_stream(nullptr, false), true, "cudaMemset"));
}

cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count) {
  SIM_ENTER();
  SIM_RETURN(mem_set(devPtr, value, count, resolve_stream(nullptr, true), true, "cudaMemset"));
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(mem_set(devPtr, value, count, resolve_stream(stream, false), false,
                     "cudaMemsetAsync"));
}

cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(mem_set(devPtr, value, count, resolve_stream(stream, true), false,
                     "cudaMemsetAsync"));
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  SIM_ENTER();
  if (!handle) SIM_RETURN(cudaErrorInvalidValue);
  SIM_RETURN(mem_ipc_handle(devPtr, reinterpret_cast<unsigned char*>(handle->reserved))
                 ? cudaSuccess
                 : cudaErrorInvalidValue);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  SIM_ENTER();
  if (!attributes) SIM_RETURN(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof *attributes);
  AllocInfo info;
  unsigned flags = 0;
  if (ptr && mem_find(ptr, &info)) {
    attributes->device = info.device;
    attributes->devicePointer = const_cast<void*>(ptr);
    if (info.kind == AllocKind::managed) {
      attributes->type = cudaMemoryTypeManaged;
      attributes->hostPointer = const_cast<void*>(ptr);
    } else {
      attributes->type = cudaMemoryTypeDevice;
    }
  } else if (ptr && host_find(ptr, &flags)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = current_device();
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}
