// The exported driver entry points: every hooked variant under its own symbol (driver_variants.h),
// for programs linked with -lcuda and as the targets the hooked resolvers hand out. Thin shims:
// calls made from inside the library or in a forked child (hook_guard.h) go straight to the real
// variant; everything else is one call into driver_hooks.cpp. The resolvers always map what the
// real one found, whoever asks: the real runtime caches what it gets for the life of the process.
//
// Capture begin and end call the real variant: the capture layer's begin and end go at the two
// marked places. The fences stay safe meanwhile, because a stream created through any layer is
// in the stream table, where CudaDevice looks for open captures before it records a fence or
// releases memory.
//
// Depends on driver_hooks.h, driver_variants.h and hook_guard.h.
#include "interpose/driver_hooks.h"
#include "interpose/driver_variants.h"
#include "interpose/hook_guard.h"

#define POOLCUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace pc = poolcuda;
namespace dh = poolcuda::driver_hooks;
namespace dr = poolcuda::driver_real;

POOLCUDA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  const CUresult result = dr::cuGetProcAddress_v2()(symbol, pfn, cudaVersion, flags, symbolStatus);
  dh::map_resolved(result == CUDA_SUCCESS, pfn);
  return result;
}

POOLCUDA_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags) {
  const CUresult result = dr::cuGetProcAddress()(symbol, pfn, cudaVersion, flags);
  dh::map_resolved(result == CUDA_SUCCESS, pfn);
  return result;
}

POOLCUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (pc::bypass()) return dr::cuMemAlloc_v2()(dptr, bytesize);
  pc::InsideHook inside;
  return dh::mem_alloc(dptr, bytesize);
}

POOLCUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (pc::bypass()) return dr::cuMemFree_v2()(dptr);
  pc::InsideHook inside;
  return dh::mem_free(dptr);
}

POOLCUDA_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (pc::bypass()) return dr::cuMemGetInfo_v2()(free, total);
  pc::InsideHook inside;
  return dh::mem_get_info(free, total);
}

// Pitched allocations are not pooled: recognised, passed through.
POOLCUDA_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                            size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes) {
  return dr::cuMemAllocPitch_v2()(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
}

// Managed memory is passed through for now: managed pooling goes here.
POOLCUDA_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
                                           unsigned int flags) {
  return dr::cuMemAllocManaged()(dptr, bytesize, flags);
}

POOLCUDA_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  if (pc::bypass()) return dr::cuStreamCreate()(phStream, Flags);
  pc::InsideHook inside;
  return dh::stream_create(phStream, Flags);
}

POOLCUDA_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                    int priority) {
  if (pc::bypass()) return dr::cuStreamCreateWithPriority()(phStream, flags, priority);
  pc::InsideHook inside;
  return dh::stream_create_with_priority(phStream, flags, priority);
}

POOLCUDA_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  if (pc::bypass()) return dr::cuStreamDestroy_v2()(hStream);
  pc::InsideHook inside;
  return dh::stream_destroy(hStream);
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxReset()(dev);
  pc::InsideHook inside;
  return dh::primary_ctx_reset(dr::cuDevicePrimaryCtxReset(), dev);
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxReset_v2()(dev);
  pc::InsideHook inside;
  return dh::primary_ctx_reset(dr::cuDevicePrimaryCtxReset_v2(), dev);
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxRelease()(dev);
  pc::InsideHook inside;
  return dh::primary_ctx_release(dr::cuDevicePrimaryCtxRelease(), dev);
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxRelease_v2()(dev);
  pc::InsideHook inside;
  return dh::primary_ctx_release(dr::cuDevicePrimaryCtxRelease_v2(), dev);
}

POOLCUDA_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxDestroy_v2()(ctx);
  pc::InsideHook inside;
  return dh::ctx_destroy(ctx);
}

// ---- Capture: the capture layer's begin goes here --------------------------------------------

POOLCUDA_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  return dr::cuStreamBeginCapture()(hStream);
}

POOLCUDA_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return dr::cuStreamBeginCapture_ptsz()(hStream);
}

POOLCUDA_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return dr::cuStreamBeginCapture_v2()(hStream, mode);
}

POOLCUDA_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return dr::cuStreamBeginCapture_v2_ptsz()(hStream, mode);
}

POOLCUDA_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                     const CUgraphNode* dependencies,
                                                     const CUgraphEdgeData* dependencyData,
                                                     size_t numDependencies,
                                                     CUstreamCaptureMode mode) {
  return dr::cuStreamBeginCaptureToGraph()(hStream, hGraph, dependencies, dependencyData,
                                           numDependencies, mode);
}

POOLCUDA_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                          const CUgraphNode* dependencies,
                                                          const CUgraphEdgeData* dependencyData,
                                                          size_t numDependencies,
                                                          CUstreamCaptureMode mode) {
  return dr::cuStreamBeginCaptureToGraph_ptsz()(hStream, hGraph, dependencies, dependencyData,
                                                numDependencies, mode);
}

// ---- Capture: the capture layer's end goes here ----------------------------------------------

POOLCUDA_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return dr::cuStreamEndCapture()(hStream, phGraph);
}

POOLCUDA_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return dr::cuStreamEndCapture_ptsz()(hStream, phGraph);
}
