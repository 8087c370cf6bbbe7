// Shared helpers of the driver stand-in's entry points (drv_*.cpp): the guard each entry point
// starts with, conversions between driver and core types, and the declarations of the variants
// that cuda.h renames with macros or declares only for the per-thread default stream.
// core.h first: cuda.h #defines names such as cuMemAlloc that core.h uses as identifiers.
#pragma once

#include "core.h"

#include <cuda.h>

// cuda.h maps base names to their newest variants; the stand-in defines each variant under its
// own symbol, the older ones included.
#undef cuGetProcAddress
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuMemAllocPitch
#undef cuDeviceTotalMem
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuCtxDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuStreamDestroy
#undef cuEventDestroy
#undef cuStreamBeginCapture
#undef cuMemsetD8
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH
#undef cuStreamGetCaptureInfo
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuModuleGetGlobal

extern "C" {
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuMemAlloc(unsigned int* dptr, unsigned int bytesize);
CUresult cuMemFree(unsigned int dptr);
CUresult cuMemGetInfo(unsigned int* free, unsigned int* total);
CUresult cuMemAllocPitch(unsigned int* dptr, unsigned int* pitch, unsigned int width,
                         unsigned int height, unsigned int element_size);
CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int num_params,
                        unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                        CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext* pctx);
CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                            unsigned int element_size);
CUresult cuStreamDestroy(CUstream stream);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize_ptsz(CUstream stream);
CUresult cuEventDestroy(CUevent event);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuEventRecord_ptsz(CUevent event, CUstream stream);
CUresult cuStreamBeginCapture(CUstream stream);
CUresult cuStreamBeginCapture_ptsz(CUstream stream);
CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                          const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* dependency_data,
                                          size_t num_dependencies, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph);
CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status);
CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* user_data);
CUresult cuStreamAddCallback_ptsz(CUstream stream, CUstreamCallback callback, void* user_data,
                                  unsigned int flags);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream);
// CUDA 2.0's array entry points, 32-bit descriptors (cuda.h keeps those types to the driver's
// own build); the generated fallbacks define them.
CUresult cuArrayCreate(CUarray* pHandle, const void* pAllocateArray);
CUresult cuArray3DCreate(CUarray* pHandle, const void* pAllocateArray);
// CUDA 2.0's cuModuleGetGlobal, 32-bit address and size: a generated fallback.
CUresult cuModuleGetGlobal(unsigned int* dptr, unsigned int* bytes, CUmodule hmod,
                           const char* name);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t count);
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t count);
CUresult cuStreamQuery_ptsz(CUstream stream);
CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags);
CUresult cuStreamGetDevice_ptsz(CUstream stream, CUdevice* device);
CUresult cuStreamGetCtx(CUstream stream, CUcontext* pctx);
CUresult cuStreamGetCtx_ptsz(CUstream stream, CUcontext* pctx);
CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id);
CUresult cuStreamGetCaptureInfo_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                     cuuint64_t* id);
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                   CUgraph* graph, const CUgraphNode** dependencies,
                                   size_t* num_dependencies);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph,
                                        const CUgraphNode** dependencies,
                                        size_t* num_dependencies);
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph,
                                        const CUgraphNode** dependencies,
                                        const CUgraphEdgeData** edges, size_t* num_dependencies);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t count,
                                   CUstream stream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t count, CUstream stream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t count,
                                   CUstream stream);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                             unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                             unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                             void** params, void** extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                                        unsigned int grid_z, unsigned int block_x,
                                        unsigned int block_y, unsigned int block_z,
                                        unsigned int shared_bytes, CUstream stream,
                                        void** params);
}

namespace poolcuda::sim::drv {

inline CUresult as_cu(cudaError_t e) { return static_cast<CUresult>(e); }  // the codes coincide

// Every entry point's first check: the driver is initialized (cuInit, or the runtime's first
// call), no sticky error, and with `need_context` a live current context.
inline CUresult guard(bool need_context = false) {
  if (!driver_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (cudaError_t sticky = sticky_error()) return as_cu(sticky);
  if (need_context) {
    Context* ctx = thread_context();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  return CUDA_SUCCESS;
}

// The device of the current context (callers passed guard(true)).
inline int context_device() { return thread_context()->device; }

inline CUdeviceptr dptr(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}
inline void* ptr(CUdeviceptr d) { return reinterpret_cast<void*>(static_cast<uintptr_t>(d)); }
inline cudaStream_t rt(CUstream s) { return reinterpret_cast<cudaStream_t>(s); }

// Out of memory is CUDA_ERROR_OUT_OF_MEMORY in the driver's words.
inline CUresult alloc_result(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : as_cu(e);
}

}  // namespace poolcuda::sim::drv
