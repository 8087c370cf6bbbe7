// Shared helpers of the runtime stand-in's entry points (rt_*.cpp): the guard each entry point
// starts with, and the declarations of the per-thread-default-stream variants (_ptsz/_ptds) that
// the CUDA headers only declare when CUDA_API_PER_THREAD_DEFAULT_STREAM is defined.
#pragma once

#include "core.h"

namespace poolcuda::sim::rt {

#ifdef SIMCUDA_STATIC_RUNTIME
inline constexpr bool kStaticRuntime = true;
#else
inline constexpr bool kStaticRuntime = false;
#endif

// The runtime's first call loads the driver library (rt_driver.cpp), as the real runtime's
// initialization does: a driver call made beside the runtime then sees the contexts the runtime
// binds.
void load_driver();

}  // namespace poolcuda::sim::rt

// Binds the primary context and honours the sticky error, as every runtime call does.
#define SIM_ENTER()                                                                   \
  do {                                                                                \
    ::poolcuda::sim::rt::load_driver();                                               \
    ::poolcuda::sim::runtime_touch();                                                 \
    if (cudaError_t sticky_ = ::poolcuda::sim::sticky_error())                        \
      return ::poolcuda::sim::record_error(sticky_);                                  \
  } while (0)

#define SIM_RETURN(expr) return ::poolcuda::sim::record_error(expr)

extern "C" {
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                 cudaStream_t stream);
cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t hStream, unsigned int* flags);
cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t hStream, int* priority);
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t hStream, int* device);
cudaError_t cudaStreamGetId_ptsz(cudaStream_t hStream, unsigned long long* streamId);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                          unsigned int flags);
cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t stream, cudaStreamCallback_t callback,
                                       void* userData, unsigned int flags);
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* userData);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t* dependencies,
                                               const cudaGraphEdgeData* dependencyData,
                                               size_t numDependencies,
                                               cudaStreamCaptureMode mode);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                       cudaStreamCaptureStatus* pCaptureStatus);
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                          cudaStreamCaptureStatus* captureStatus_out,
                                          unsigned long long* id_out, cudaGraph_t* graph_out,
                                          const cudaGraphNode_t** dependencies_out,
                                          const cudaGraphEdgeData** edgeData_out,
                                          size_t* numDependencies_out);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus);
}
