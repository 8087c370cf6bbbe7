// The driver entry point variants the library hooks, each under its exact symbol: base name,
// the CUDA version that introduced it and its stream flavour (Note [Variants] in
// driver_variants.cpp). From them: the real function of each variant, and the map from any
// pointer the real driver hands out (through its resolver or as an exported symbol) to the
// library's hook for that very variant. A variant is never chosen by name: the real resolver
// chooses, the map only recognizes what it chose.
//
// Depends on the CUDA driver header and real_driver.h.
#pragma once

#include <cuda.h>

// The exported hooks carry the variants' own names: cuda.h's macros would rename the v1 ones.
#undef cuGetProcAddress
#undef cuStreamBeginCapture
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxRelease
#undef cuMemFreeAsync
#undef cuMemAllocAsync
#undef cuStreamDestroy
#undef cuCtxDestroy
#undef cuCtxCreate
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuMemAllocFromPoolAsync
#undef cuLaunchKernel
#undef cuLaunchKernelEx
#undef cuLaunchCooperativeKernel

// Variants cuda.h declares only for internal or per-thread builds.
extern "C" {
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuStreamDestroy(CUstream hStream);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext* pctx);
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                        unsigned int flags, CUdevice dev);
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* dependencyData,
                                          size_t numDependencies, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                  unsigned int flags);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void** kernelParams, void** extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                               void** extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void** kernelParams);
}

// symbol, base name, version that introduced it, per-thread-default-stream flavour
#define POOLCUDA_DRIVER_VARIANTS(X)                                                    \
  X(cuGetProcAddress, "cuGetProcAddress", 11030, false)                                \
  X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, false)                             \
  X(cuMemAlloc_v2, "cuMemAlloc", 3020, false)                                          \
  X(cuMemFree_v2, "cuMemFree", 3020, false)                                            \
  X(cuMemFreeAsync, "cuMemFreeAsync", 11020, false)                                    \
  X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, true)                                \
  X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, false)                                      \
  X(cuMemGetAddressRange_v2, "cuMemGetAddressRange", 3020, false)                      \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, false)                               \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, false)                                \
  X(cuMemAllocManaged, "cuMemAllocManaged", 6000, false)                               \
  X(cuMemAllocAsync, "cuMemAllocAsync", 11020, false)                                  \
  X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, true)                              \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, false)                  \
  X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, true)              \
  X(cuMemCreate, "cuMemCreate", 10020, false)                                          \
  X(cuArrayCreate_v2, "cuArrayCreate", 3020, false)                                    \
  X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, false)                                \
  X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, false)                     \
  X(cuCtxSetLimit, "cuCtxSetLimit", 3010, false)                                       \
  X(cuStreamCreate, "cuStreamCreate", 2000, false)                                     \
  X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", 5050, false)             \
  X(cuStreamDestroy, "cuStreamDestroy", 2000, false)                                   \
  X(cuStreamDestroy_v2, "cuStreamDestroy", 4000, false)                                \
  X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, false)                   \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, false)               \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, false)               \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, false)           \
  X(cuCtxDestroy, "cuCtxDestroy", 2000, false)                                         \
  X(cuCtxSynchronize, "cuCtxSynchronize", 2000, false)                                 \
  X(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, false)                             \
  X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, false)                                      \
  X(cuCtxCreate, "cuCtxCreate", 2000, false)                                           \
  X(cuCtxCreate_v2, "cuCtxCreate", 3020, false)                                        \
  X(cuCtxCreate_v3, "cuCtxCreate", 11040, false)                                       \
  X(cuCtxCreate_v4, "cuCtxCreate", 12050, false)                                       \
  X(cuCtxFromGreenCtx, "cuCtxFromGreenCtx", 12040, false)                              \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, false)                                   \
  X(cuCtxPushCurrent, "cuCtxPushCurrent", 2000, false)                                 \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, false)                              \
  X(cuCtxPopCurrent, "cuCtxPopCurrent", 2000, false)                                   \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, false)                                \
  X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, false)                        \
  X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, true)                    \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, false)                     \
  X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, true)                 \
  X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, false)          \
  X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, true)      \
  X(cuStreamEndCapture, "cuStreamEndCapture", 10000, false)                            \
  X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, true)                       \
  X(cuGraphDestroy, "cuGraphDestroy", 10000, false)                                    \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, false)                            \
  X(cuLaunchHostFunc, "cuLaunchHostFunc", 10000, false)                                \
  X(cuLaunchHostFunc_ptsz, "cuLaunchHostFunc", 10000, true)                            \
  X(cuStreamAddCallback, "cuStreamAddCallback", 5000, false)                           \
  X(cuStreamAddCallback_ptsz, "cuStreamAddCallback", 7000, true)                      \
  X(cuGraphLaunch, "cuGraphLaunch", 10000, false)                                      \
  X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, true)                                  \
  X(cuLaunchKernel, "cuLaunchKernel", 4000, false)                                     \
  X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, true)                                 \
  X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, false)                                \
  X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, true)                            \
  X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, false)               \
  X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, true)           \
  X(cuModuleLoad, "cuModuleLoad", 2000, false)                                         \
  X(cuModuleLoadData, "cuModuleLoadData", 2000, false)                                 \
  X(cuModuleLoadDataEx, "cuModuleLoadDataEx", 2010, false)                             \
  X(cuModuleLoadFatBinary, "cuModuleLoadFatBinary", 2000, false)                       \
  X(cuLibraryLoadData, "cuLibraryLoadData", 12000, false)                              \
  X(cuLibraryLoadFromFile, "cuLibraryLoadFromFile", 12000, false)                      \
  X(cuModuleGetFunction, "cuModuleGetFunction", 2000, false)                           \
  X(cuLibraryGetKernel, "cuLibraryGetKernel", 12000, false)                            \
  X(cuKernelGetFunction, "cuKernelGetFunction", 12000, false)                          \
  X(cuFuncLoad, "cuFuncLoad", 12040, false)                                            \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", 2020, false)                             \
  X(cuFuncSetAttribute, "cuFuncSetAttribute", 9000, false)                             \
  X(cuFuncSetCacheConfig, "cuFuncSetCacheConfig", 3000, false)                         \
  X(cuKernelGetAttribute, "cuKernelGetAttribute", 12000, false)                        \
  X(cuKernelSetAttribute, "cuKernelSetAttribute", 12000, false)                        \
  X(cuKernelSetCacheConfig, "cuKernelSetCacheConfig", 12000, false)                    \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor,                                       \
    "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, false)                        \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,                              \
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, false)               \
  X(cuOccupancyMaxPotentialBlockSize, "cuOccupancyMaxPotentialBlockSize", 6050, false) \
  X(cuOccupancyMaxPotentialBlockSizeWithFlags,                                         \
    "cuOccupancyMaxPotentialBlockSizeWithFlags", 7000, false)                          \
  X(cuOccupancyAvailableDynamicSMemPerBlock,                                           \
    "cuOccupancyAvailableDynamicSMemPerBlock", 10020, false)                           \
  X(cuOccupancyMaxPotentialClusterSize,                                                \
    "cuOccupancyMaxPotentialClusterSize", 11070, false)                                \
  X(cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters", 11070, false)        \
  X(cuModuleGetGlobal_v2, "cuModuleGetGlobal", 3020, false)                            \
  X(cuLibraryGetGlobal, "cuLibraryGetGlobal", 12000, false)

namespace poolcuda::driver {

enum class Variant : int {
#define POOLCUDA_VARIANT(symbol, base, version, per_thread) symbol,
  POOLCUDA_DRIVER_VARIANTS(POOLCUDA_VARIANT)
#undef POOLCUDA_VARIANT
      count
};

// The real driver's function for `variant`, or nullptr while no driver is loaded.
void* real(Variant variant);

// The library's hook for `fn`, a pointer the real driver handed out, when it is a hooked
// variant; otherwise `fn` unchanged.
void* hook_for(void* fn);

// dlsym(handle, name) found `found`: the hook when `name` is a hooked variant and `found` is the
// real driver's; otherwise `found`.
void* hook_for_symbol(const char* name, void* found);

// Fork handlers (Note [Fork] in lifecycle.cpp): a fork waits for a map being built by another
// thread, so that no child inherits the map's lock held by a thread it does not have.
void before_fork();
void after_fork();

template <typename Fn>
struct Missing;

template <typename... Args>
struct Missing<CUresult (*)(Args...)> {
  static CUresult call(Args...) { return CUDA_ERROR_NOT_INITIALIZED; }
};

}  // namespace poolcuda::driver

// driver_real::cuMemAlloc_v2()(&ptr, size): the real variant, typed; without a driver a
// function that answers CUDA_ERROR_NOT_INITIALIZED.
namespace poolcuda::driver_real {
#define POOLCUDA_DRIVER_REAL(symbol, base, version, per_thread)                           \
  inline decltype(&::symbol) symbol() {                                                   \
    using Fn = decltype(&::symbol);                                                       \
    void* address = ::poolcuda::driver::real(::poolcuda::driver::Variant::symbol);        \
    return address != nullptr ? reinterpret_cast<Fn>(address)                             \
                              : &::poolcuda::driver::Missing<Fn>::call;                   \
  }
POOLCUDA_DRIVER_VARIANTS(POOLCUDA_DRIVER_REAL)
#undef POOLCUDA_DRIVER_REAL
}  // namespace poolcuda::driver_real
