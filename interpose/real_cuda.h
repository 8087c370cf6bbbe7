// The table of real CUDA runtime functions: the only place that calls dlsym. Each entry is
// resolved on first use with dlsym(RTLD_NEXT, name) (falling back to a libcudart that was loaded
// privately, see real_cuda.cpp), once per process, lock-free and thread-safe: racing threads
// store the same pointer. A function that cannot be found is remembered as missing (one log
// line, no further lookups) and answers cudaErrorSharedObjectSymbolNotFound instead of crashing.
//
// Usage: real::cudaMalloc()(&ptr, size). Depends on the CUDA runtime header only.
#pragma once

#include <cuda_runtime_api.h>

// The per-thread-default-stream variants, which the CUDA header declares only when a program is
// built for them.
extern "C" {
cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t* dependencies,
                                               const cudaGraphEdgeData* dependencyData,
                                               size_t numDependencies,
                                               cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph);
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                          cudaStreamCaptureStatus* captureStatus_out,
                                          unsigned long long* id_out, cudaGraph_t* graph_out,
                                          const cudaGraphNode_t** dependencies_out,
                                          const cudaGraphEdgeData** edgeData_out,
                                          size_t* numDependencies_out);
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t hStream, int* device);
}

// Every real function the library calls. Add a name here and real::<name>() exists.
#define POOLCUDA_REAL_FUNCTIONS(X)          \
  X(cudaMalloc)                             \
  X(cudaFree)                               \
  X(cudaFreeAsync)                          \
  X(cudaFreeAsync_ptsz)                     \
  X(cudaMemGetInfo)                         \
  X(cudaDeviceReset)                        \
  X(cudaDeviceSynchronize)                  \
  X(cudaStreamCreate)                       \
  X(cudaStreamCreateWithFlags)              \
  X(cudaStreamCreateWithPriority)           \
  X(cudaStreamDestroy)                      \
  X(cudaStreamIsCapturing)                  \
  X(cudaStreamBeginCapture)                 \
  X(cudaStreamBeginCapture_ptsz)            \
  X(cudaStreamBeginCaptureToGraph)          \
  X(cudaStreamBeginCaptureToGraph_ptsz)     \
  X(cudaStreamEndCapture)                   \
  X(cudaStreamEndCapture_ptsz)              \
  X(cudaStreamGetCaptureInfo)               \
  X(cudaStreamGetCaptureInfo_ptsz)          \
  X(cudaStreamGetDevice)                    \
  X(cudaStreamGetDevice_ptsz)               \
  X(cudaUserObjectCreate)                   \
  X(cudaUserObjectRelease)                  \
  X(cudaGraphRetainUserObject)              \
  X(cudaThreadExchangeStreamCaptureMode)    \
  X(cudaGetDevice)                          \
  X(cudaSetDevice)                          \
  X(cudaGetLastError)                       \
  X(cudaPeekAtLastError)                    \
  X(cudaEventCreateWithFlags)               \
  X(cudaEventRecord)                        \
  X(cudaEventQuery)                         \
  X(cudaEventSynchronize)                   \
  X(cudaEventDestroy)

namespace poolcuda::real {

enum class Slot : int {
#define POOLCUDA_SLOT(name) name,
  POOLCUDA_REAL_FUNCTIONS(POOLCUDA_SLOT)
#undef POOLCUDA_SLOT
      count
};

// The resolved address for `slot`, or nullptr when the symbol exists nowhere (decided by the
// first lookup, see Note [Missing functions] in real_cuda.cpp).
void* resolve(Slot slot);

template <typename Fn>
struct Missing;

template <typename... Args>
struct Missing<cudaError_t (*)(Args...)> {
  static cudaError_t call(Args...) { return cudaErrorSharedObjectSymbolNotFound; }
};

#define POOLCUDA_ACCESSOR(name)                                          \
  inline decltype(&::name) name() {                                      \
    using Fn = decltype(&::name);                                        \
    void* address = resolve(Slot::name);                                 \
    return address != nullptr ? reinterpret_cast<Fn>(address)            \
                              : &Missing<Fn>::call;                      \
  }
POOLCUDA_REAL_FUNCTIONS(POOLCUDA_ACCESSOR)
#undef POOLCUDA_ACCESSOR

}  // namespace poolcuda::real
