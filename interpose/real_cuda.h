// The table of real CUDA runtime functions. Each entry is resolved on first use with the C
// library's own dlsym (dl_real.h), RTLD_NEXT from this library (falling back to a libcudart that
// was loaded privately, see real_cuda.cpp), once per process, lock-free and thread-safe: racing
// threads store the same pointer. A function that cannot be found while a runtime is loaded is
// remembered as missing (one log line, no further lookups) and answers
// cudaErrorSharedObjectSymbolNotFound instead of crashing.
//
// Usage: real::cudaMalloc()(&ptr, size). Depends on the CUDA runtime header and dl_real.h.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

// The per-thread-default-stream variants, which the CUDA header declares only when a program is
// built for them.
extern "C" {
cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream);
cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream);
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
cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                  size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func,
                                     void** args);
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim,
                                             void** args, size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void** args, size_t sharedMem, cudaStream_t stream);
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                 cudaStream_t stream);
cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count);
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* userData);
cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t stream, cudaStreamCallback_t callback,
                                       void* userData, unsigned int flags);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaMemcpyPeerAsync_ptsz(void* dst, int dstDevice, const void* src, int srcDevice,
                                     size_t count, cudaStream_t stream);
cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void* devPtr, size_t length,
                                          unsigned int flags);
cudaError_t cudaMemPrefetchAsync_ptsz(const void* devPtr, size_t count,
                                      struct cudaMemLocation location, unsigned int flags,
                                      cudaStream_t stream);
cudaError_t cudaMemPrefetchBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                           struct cudaMemLocation* prefetchLocs,
                                           size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                           unsigned long long flags, cudaStream_t stream);
cudaError_t cudaMemDiscardBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                          unsigned long long flags, cudaStream_t stream);
cudaError_t cudaMemDiscardAndPrefetchBatchAsync_ptsz(void** dptrs, size_t* sizes, size_t count,
                                                     struct cudaMemLocation* prefetchLocs,
                                                     size_t* prefetchLocIdxs,
                                                     size_t numPrefetchLocs,
                                                     unsigned long long flags,
                                                     cudaStream_t stream);
cudaError_t cudaMemcpy2D_ptds(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind);
cudaError_t cudaMemcpyArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                        cudaArray_const_t src, size_t wOffsetSrc,
                                        size_t hOffsetSrc, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                          cudaArray_const_t src, size_t wOffsetSrc,
                                          size_t hOffsetSrc, size_t width, size_t height,
                                          cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DFromArray_ptds(void* dst, size_t dpitch, cudaArray_const_t src,
                                       size_t wOffset, size_t hOffset, size_t width, size_t height,
                                       cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                     const void* src, size_t spitch, size_t width, size_t height,
                                     cudaMemcpyKind kind);
cudaError_t cudaMemcpy3D_ptds(const cudaMemcpy3DParms* p);
cudaError_t cudaMemcpy3DPeer_ptds(const cudaMemcpy3DPeerParms* p);
cudaError_t cudaMemcpyFromArray_ptds(void* dst, cudaArray_const_t src, size_t wOffset,
                                     size_t hOffset, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src,
                                   size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyFromSymbol_ptds(void* dst, const void* symbol, size_t count, size_t offset,
                                      cudaMemcpyKind kind);
cudaError_t cudaMemcpyToSymbol_ptds(const void* symbol, const void* src, size_t count,
                                    size_t offset, cudaMemcpyKind kind);
cudaError_t cudaMemset2D_ptds(void* ptr, size_t pitch, int value, size_t width, size_t height);
cudaError_t cudaMemset3D_ptds(cudaPitchedPtr ptr, int value, cudaExtent extent);
cudaError_t cudaMemcpy2DAsync_ptsz(void* dst, size_t dpitch, const void* src, size_t spitch,
                                   size_t width, size_t height, cudaMemcpyKind kind,
                                   cudaStream_t stream);
cudaError_t cudaMemcpy2DFromArrayAsync_ptsz(void* dst, size_t dpitch, cudaArray_const_t src,
                                            size_t wOffset, size_t hOffset, size_t width,
                                            size_t height, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2DToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                          const void* src, size_t spitch, size_t width,
                                          size_t height, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy3DAsync_ptsz(const cudaMemcpy3DParms* p, cudaStream_t stream);
cudaError_t cudaMemcpy3DPeerAsync_ptsz(const cudaMemcpy3DPeerParms* p, cudaStream_t stream);
cudaError_t cudaMemcpy3DBatchAsync_ptsz(size_t count, cudaMemcpy3DBatchOp* ops,
                                        unsigned long long flags, cudaStream_t stream);
cudaError_t cudaMemcpyBatchAsync_ptsz(void* const* dsts, const void* const* srcs,
                                      const size_t* sizes, size_t count,
                                      cudaMemcpyAttributes* attrs, size_t* attrs_indices,
                                      size_t attrs_count, cudaStream_t stream);
cudaError_t cudaMemcpyFromArrayAsync_ptsz(void* dst, cudaArray_const_t src, size_t wOffset,
                                          size_t hOffset, size_t count, cudaMemcpyKind kind,
                                          cudaStream_t stream);
cudaError_t cudaMemcpyToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset, size_t hOffset,
                                        const void* src, size_t count, cudaMemcpyKind kind,
                                        cudaStream_t stream);
cudaError_t cudaMemcpyFromSymbolAsync_ptsz(void* dst, const void* symbol, size_t count,
                                           size_t offset, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpyToSymbolAsync_ptsz(const void* symbol, const void* src, size_t count,
                                         size_t offset, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset2DAsync_ptsz(void* ptr, size_t pitch, int value, size_t width, size_t height,
                                   cudaStream_t stream);
cudaError_t cudaMemset3DAsync_ptsz(cudaPitchedPtr ptr, int value, cudaExtent extent,
                                   cudaStream_t stream);
}

// The copies and memsets of other shapes than a plain byte range, in every flavour: watched
// only (stream_exports.cpp). One list for the real functions and the hooks (hooks.h).
#define POOLCUDA_SHAPED_COPIES(X)           \
  X(cudaMemcpy2D)                           \
  X(cudaMemcpy2DFromArray)                  \
  X(cudaMemcpy2DToArray)                    \
  X(cudaMemcpy3D)                           \
  X(cudaMemcpyFromArray)                    \
  X(cudaMemcpyToArray)                      \
  X(cudaMemcpyFromSymbol)                   \
  X(cudaMemcpyToSymbol)                     \
  X(cudaMemset2D)                           \
  X(cudaMemset3D)                           \
  X(cudaMemcpyArrayToArray)                 \
  X(cudaMemcpy2DArrayToArray)               \
  X(cudaMemcpyArrayToArray_ptds)            \
  X(cudaMemcpy2DArrayToArray_ptds)          \
  X(cudaMemcpy2D_ptds)                      \
  X(cudaMemcpy2DFromArray_ptds)             \
  X(cudaMemcpy2DToArray_ptds)               \
  X(cudaMemcpy3D_ptds)                      \
  X(cudaMemcpy3DPeer_ptds)                  \
  X(cudaMemcpyFromArray_ptds)               \
  X(cudaMemcpyToArray_ptds)                 \
  X(cudaMemcpyFromSymbol_ptds)              \
  X(cudaMemcpyToSymbol_ptds)                \
  X(cudaMemset2D_ptds)                      \
  X(cudaMemset3D_ptds)                      \
  X(cudaMemcpy2DAsync)                      \
  X(cudaMemcpy2DAsync_ptsz)                 \
  X(cudaMemcpy2DFromArrayAsync)             \
  X(cudaMemcpy2DFromArrayAsync_ptsz)        \
  X(cudaMemcpy2DToArrayAsync)               \
  X(cudaMemcpy2DToArrayAsync_ptsz)          \
  X(cudaMemcpy3DAsync)                      \
  X(cudaMemcpy3DAsync_ptsz)                 \
  X(cudaMemcpy3DPeerAsync)                  \
  X(cudaMemcpy3DPeerAsync_ptsz)             \
  X(cudaMemcpy3DBatchAsync)                 \
  X(cudaMemcpy3DBatchAsync_ptsz)            \
  X(cudaMemcpyBatchAsync)                   \
  X(cudaMemcpyBatchAsync_ptsz)              \
  X(cudaMemcpyFromArrayAsync)               \
  X(cudaMemcpyFromArrayAsync_ptsz)          \
  X(cudaMemcpyToArrayAsync)                 \
  X(cudaMemcpyToArrayAsync_ptsz)            \
  X(cudaMemcpyFromSymbolAsync)              \
  X(cudaMemcpyFromSymbolAsync_ptsz)         \
  X(cudaMemcpyToSymbolAsync)                \
  X(cudaMemcpyToSymbolAsync_ptsz)           \
  X(cudaMemset2DAsync)                      \
  X(cudaMemset2DAsync_ptsz)                 \
  X(cudaMemset3DAsync)                      \
  X(cudaMemset3DAsync_ptsz)

// Every real function the library calls. Add a name here and real::<name>() exists.
#define POOLCUDA_REAL_FUNCTIONS(X)          \
  X(cudaMalloc)                             \
  X(cudaFree)                               \
  X(cudaMallocManaged)                      \
  X(cudaStreamAttachMemAsync)               \
  X(cudaStreamAttachMemAsync_ptsz)          \
  X(cudaMemAdvise)                          \
  X(cudaMemPrefetchAsync)                   \
  X(cudaMemPrefetchAsync_ptsz)              \
  X(cudaMemPrefetchBatchAsync)              \
  X(cudaMemPrefetchBatchAsync_ptsz)         \
  X(cudaMemDiscardBatchAsync)               \
  X(cudaMemDiscardBatchAsync_ptsz)          \
  X(cudaMemDiscardAndPrefetchBatchAsync)    \
  X(cudaMemDiscardAndPrefetchBatchAsync_ptsz) \
  X(cudaPointerGetAttributes)               \
  X(cudaIpcGetMemHandle)                    \
  X(cudaFreeAsync)                          \
  X(cudaFreeAsync_ptsz)                     \
  X(cudaMallocAsync)                        \
  X(cudaMallocAsync_ptsz)                   \
  X(cudaMallocPitch)                        \
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
  X(cudaStreamWaitEvent)                    \
  X(cudaStreamWaitEvent_ptsz)               \
  X(cudaLaunchKernel)                       \
  X(cudaLaunchKernel_ptsz)                  \
  X(cudaLaunchKernelExC)                    \
  X(cudaLaunchKernelExC_ptsz)               \
  X(cudaLaunchCooperativeKernel)            \
  X(cudaLaunchCooperativeKernel_ptsz)       \
  X(__cudaLaunchKernel)                     \
  X(__cudaLaunchKernel_ptsz)                \
  X(cudaMemcpyAsync)                        \
  X(cudaMemcpyAsync_ptsz)                   \
  X(cudaMemsetAsync)                        \
  X(cudaMemsetAsync_ptsz)                   \
  X(cudaMemcpy)                             \
  X(cudaMemset)                             \
  X(cudaMemcpy_ptds)                        \
  X(cudaMemset_ptds)                        \
  POOLCUDA_SHAPED_COPIES(X)                 \
  X(cudaLaunchHostFunc)                     \
  X(cudaLaunchHostFunc_ptsz)                \
  X(cudaStreamAddCallback)                  \
  X(cudaStreamAddCallback_ptsz)             \
  X(cudaGraphLaunch)                        \
  X(cudaGraphLaunch_ptsz)                   \
  X(cudaGraphDestroy)                       \
  X(cudaGraphExecDestroy)                   \
  X(cudaEventRecord_ptsz)                   \
  X(cudaMemcpyPeer)                         \
  X(cudaMemcpy3DPeer)                       \
  X(cudaMemcpyPeerAsync)                    \
  X(cudaMemcpyPeerAsync_ptsz)               \
  X(cudaDeviceEnablePeerAccess)             \
  X(cudaUserObjectRelease)                  \
  X(cudaGraphRetainUserObject)              \
  X(cudaThreadExchangeStreamCaptureMode)    \
  X(cudaGetDevice)                          \
  X(cudaGetDeviceCount)                     \
  X(cudaDeviceGetAttribute)                 \
  X(cudaSetDevice)                          \
  X(cudaGetLastError)                       \
  X(cudaPeekAtLastError)                    \
  X(cudaEventCreateWithFlags)               \
  X(cudaEventRecord)                        \
  X(cudaEventQuery)                         \
  X(cudaStreamQuery)                        \
  X(cudaEventSynchronize)                   \
  X(cudaEventDestroy)                       \
  X(cudaGetDriverEntryPoint)                \
  X(cudaGetDriverEntryPointByVersion)       \
  X(cudaGetDriverEntryPoint_ptsz)           \
  X(cudaGetDriverEntryPointByVersion_ptsz)

// The per-thread-default-stream flavours, which the runtime header declares only when code is
// built for the per-thread default stream.
extern "C" {
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus);
}

namespace poolcuda::real {

enum class Slot : int {
#define POOLCUDA_SLOT(name) name,
  POOLCUDA_REAL_FUNCTIONS(POOLCUDA_SLOT)
#undef POOLCUDA_SLOT
      count
};

namespace detail {
// nullptr: not looked up yet; &g_missing: looked up and found nowhere (Note [Missing functions]).
extern std::atomic<void*> g_slots[static_cast<int>(Slot::count)];
extern char g_missing;
}  // namespace detail

// resolve() when the slot may not be looked up yet: looks it up and records the answer.
void* resolve_first(Slot slot);

// The resolved address for `slot`, or nullptr when the symbol exists nowhere (decided by the
// first lookup, see Note [Missing functions] in real_cuda.cpp). Inline: every hook calls it.
inline void* resolve(Slot slot) {
  void* address = detail::g_slots[static_cast<int>(slot)].load(std::memory_order_acquire);
  if (address == nullptr) return resolve_first(slot);
  return address == &detail::g_missing ? nullptr : address;
}

// resolve() for the slot named `name`; nullptr when `name` has no slot.
void* resolve_by_name(const char* name);

// Whether a CUDA runtime is loaded now. Looks, records nothing: unlike a slot, the answer may
// change when a library brings a runtime in later.
bool runtime_loaded();

// Whether `address` lies in the CUDA runtime whose functions the hooks call (a file named
// libcudart.so*, or a bundled copy renamed libcudart-<hash>.so*).
bool in_hooked_runtime(const void* address);

template <typename Fn>
struct Missing;

template <typename... Args>
struct Missing<cudaError_t (*)(Args...)> {
  static cudaError_t call(Args...) { return cudaErrorSharedObjectSymbolNotFound; }
};

// cudaGetDriverEntryPoint is deprecated in favour of its ByVersion form; both are hooked.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define POOLCUDA_ACCESSOR(name)                                          \
  inline decltype(&::name) name() {                                      \
    using Fn = decltype(&::name);                                        \
    void* address = resolve(Slot::name);                                 \
    return address != nullptr ? reinterpret_cast<Fn>(address)            \
                              : &Missing<Fn>::call;                      \
  }
POOLCUDA_REAL_FUNCTIONS(POOLCUDA_ACCESSOR)
#undef POOLCUDA_ACCESSOR
#pragma GCC diagnostic pop

}  // namespace poolcuda::real
