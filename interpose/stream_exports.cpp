// Exported entry points that only watch which queues and devices the program's work goes to,
// for free_fence:auto (Note [Stream-ordered reuse] in stream_order.cpp), then call the real
// function unchanged: kernel launches, copies, memsets, host functions, graph launches, event
// records and waits (in both the legacy and the per-thread-default-stream flavours), device
// switches, peer access and peer copies. Each costs two atomic loads when no device is ordered,
// four more to note its work (Note [Memory info after a free] in pools/manager_api.cpp), a
// kernel launch one more (Note [Room that arrived meanwhile] in pooling.cpp). A kernel launch
// refused for lack of memory is tried once more after the pools gave their idle memory back
// (Note [Launches short of memory] in hooks.cpp).
//
// Host functions and graph launches also record the free fences of earlier frees first; host
// functions (cudaLaunchHostFunc, cudaStreamAddCallback) also get the pools' idle memory back to
// the driver before they go on.
//
// Depends on stream_order.h, pooling.h, the real-function table and the re-entry guard.
#include <cuda_runtime_api.h>

#include "interpose/exports_common.h"
#include "interpose/hooks.h"
#include "interpose/pooling.h"
#include "interpose/real_cuda.h"
#include "interpose/stream_order.h"
#include "pools/work_since_free.h"

namespace pc = poolcuda;

namespace {

// The thread's current device, and the per-thread default stream: a _ptsz entry point given 0,
// or the explicit handle anywhere.
inline void watch(cudaStream_t stream, bool per_thread_flavour) {
  if (pc::bypass()) return;
  pc::stream_order::work_issued();
  if (stream == cudaStreamPerThread || (per_thread_flavour && stream == nullptr))
    pc::stream_order::per_thread_stream_used();
}

// Records earlier frees' fences; a failure (a host allocation) must not cross the entry point,
// and only costs the fence: the program's call goes on.
inline void fence_before_host_work() {
  (void)pc::guarded([] {
    pc::pooling::fence_before_host_work();
    return cudaSuccess;
  });
}

// Idle memory goes back to the driver before a host function, which may park its stream
// (Note [Idle memory before a park] in pools/memory_manager.cpp).
inline void before_host_function(cudaStream_t stream, bool per_thread) {
  (void)pc::guarded([&] {
    pc::pooling::before_host_function(per_thread && stream == nullptr ? cudaStreamPerThread
                                                                      : stream);
    return cudaSuccess;
  });
}

}  // namespace

// Watches the call, and notes its work before the real call and once it has queued it (Note
// [Memory info after a free] in pools/manager_api.cpp): a declaration, in the entry point's own
// scope.
#define WATCH(stream_expr, flavour)                                        \
  const pc::work_since_free::NoteWorkAround noted_around_call(!pc::bypass()); \
  watch(stream_expr, flavour)

#define POOLCUDA_WATCHED(name, flavour, stream_expr, params, args) \
  POOLCUDA_EXPORT cudaError_t name params {                      \
    WATCH(stream_expr, flavour);                                 \
    return pc::real::name() args;                                \
  }

// A kernel launch, tried once more after the pools gave their idle memory back, or one of their
// pages reached the driver since the launch began, when it was refused for lack of memory (Note
// [Launches short of memory] in hooks.cpp, Note [Room that arrived meanwhile] in pooling.cpp).
#define POOLCUDA_LAUNCH(name, flavour, stream_expr, params, args)                             \
  POOLCUDA_EXPORT cudaError_t name params {                                                   \
    WATCH(stream_expr, flavour);                                                              \
    const pc::pooling::ReturnsSince returns;                                                  \
    const cudaError_t result = pc::real::name() args;                                         \
    if (result != cudaErrorMemoryAllocation || pc::bypass()) return result;                   \
    const auto again = [&] { return pc::real::name() args; };                                 \
    return pc::guarded([&] { return pc::hooks::launch_again(result, returns, again); });      \
  }

// A copy between two devices: as cudaMemcpyPeer, every device leaves ordered reuse.
#define POOLCUDA_WATCHED_PEER(name, flavour, stream_expr, params, args)             \
  POOLCUDA_EXPORT cudaError_t name params {                                        \
    WATCH(stream_expr, flavour);                                                   \
    if (!pc::bypass() && p != nullptr && p->srcDevice != p->dstDevice)             \
      pc::stream_order::devices_connected();                                       \
    return pc::real::name() args;                                                  \
  }

// Work that may park its stream on the host (a host function; a graph, whose nodes may be host
// functions): the free fences of earlier frees are recorded before it (Note [Recovery and parked
// streams] in pools/memory_manager.cpp).
#define POOLCUDA_HOST_WORK(name, flavour, stream_expr, params, args) \
  POOLCUDA_EXPORT cudaError_t name params {                        \
    WATCH(stream_expr, flavour);                                   \
    if (!pc::bypass()) fence_before_host_work();                   \
    return pc::real::name() args;                                  \
  }

POOLCUDA_LAUNCH(cudaLaunchKernel, false, stream,
                 (const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                  cudaStream_t stream),
                 (func, grid, block, args, shared, stream))
POOLCUDA_LAUNCH(cudaLaunchKernel_ptsz, true, stream,
                 (const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                  cudaStream_t stream),
                 (func, grid, block, args, shared, stream))
POOLCUDA_LAUNCH(__cudaLaunchKernel, false, stream,
                 (cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                  cudaStream_t stream),
                 (kernel, grid, block, args, shared, stream))
POOLCUDA_LAUNCH(__cudaLaunchKernel_ptsz, true, stream,
                 (cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                  cudaStream_t stream),
                 (kernel, grid, block, args, shared, stream))
POOLCUDA_LAUNCH(cudaLaunchKernelExC, false, config != nullptr ? config->stream : nullptr,
                 (const cudaLaunchConfig_t* config, const void* func, void** args),
                 (config, func, args))
POOLCUDA_LAUNCH(cudaLaunchKernelExC_ptsz, true, config != nullptr ? config->stream : nullptr,
                 (const cudaLaunchConfig_t* config, const void* func, void** args),
                 (config, func, args))
POOLCUDA_LAUNCH(cudaLaunchCooperativeKernel, false, stream,
                 (const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                  cudaStream_t stream),
                 (func, grid, block, args, shared, stream))
POOLCUDA_LAUNCH(cudaLaunchCooperativeKernel_ptsz, true, stream,
                 (const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                  cudaStream_t stream),
                 (func, grid, block, args, shared, stream))
POOLCUDA_WATCHED(cudaMemcpyAsync, false, stream,
                 (void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                  cudaStream_t stream),
                 (dst, src, count, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyAsync_ptsz, true, stream,
                 (void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                  cudaStream_t stream),
                 (dst, src, count, kind, stream))
POOLCUDA_WATCHED(cudaMemsetAsync, false, stream,
                 (void* ptr, int value, size_t count, cudaStream_t stream),
                 (ptr, value, count, stream))
POOLCUDA_WATCHED(cudaMemsetAsync_ptsz, true, stream,
                 (void* ptr, int value, size_t count, cudaStream_t stream),
                 (ptr, value, count, stream))
// The synchronous copies and memsets name no stream: the legacy one, or with a per-thread build
// (the _ptds form) the thread's own. The legacy form's call watches only the device it runs on
// (a thread that never set one runs it on device 0).
#define POOLCUDA_WATCHED_SYNC(name, params, args)  \
  POOLCUDA_WATCHED(name, false, nullptr, params, args) \
  POOLCUDA_WATCHED(name##_ptds, true, nullptr, params, args)

POOLCUDA_WATCHED_SYNC(cudaMemcpy, (void* dst, const void* src, size_t count, cudaMemcpyKind kind),
                      (dst, src, count, kind))
POOLCUDA_WATCHED_SYNC(cudaMemset, (void* ptr, int value, size_t count), (ptr, value, count))
POOLCUDA_WATCHED_SYNC(cudaMemcpy2D,
                      (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                       size_t height, cudaMemcpyKind kind),
                      (dst, dpitch, src, spitch, width, height, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpy2DFromArray,
                      (void* dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                       size_t hOffset, size_t width, size_t height, cudaMemcpyKind kind),
                      (dst, dpitch, src, wOffset, hOffset, width, height, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpy2DToArray,
                      (cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src,
                       size_t spitch, size_t width, size_t height, cudaMemcpyKind kind),
                      (dst, wOffset, hOffset, src, spitch, width, height, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpy3D, (const cudaMemcpy3DParms* p), (p))
POOLCUDA_WATCHED_SYNC(cudaMemcpyFromArray,
                      (void* dst, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                       size_t count, cudaMemcpyKind kind),
                      (dst, src, wOffset, hOffset, count, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpyToArray,
                      (cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src,
                       size_t count, cudaMemcpyKind kind),
                      (dst, wOffset, hOffset, src, count, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpyFromSymbol,
                      (void* dst, const void* symbol, size_t count, size_t offset,
                       cudaMemcpyKind kind),
                      (dst, symbol, count, offset, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpyToSymbol,
                      (const void* symbol, const void* src, size_t count, size_t offset,
                       cudaMemcpyKind kind),
                      (symbol, src, count, offset, kind))
POOLCUDA_WATCHED_SYNC(cudaMemset2D,
                      (void* ptr, size_t pitch, int value, size_t width, size_t height),
                      (ptr, pitch, value, width, height))
POOLCUDA_WATCHED_SYNC(cudaMemset3D, (cudaPitchedPtr ptr, int value, cudaExtent extent),
                      (ptr, value, extent))
POOLCUDA_WATCHED_SYNC(cudaMemcpyArrayToArray,
                      (cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                       cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc, size_t count,
                       cudaMemcpyKind kind),
                      (dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count, kind))
POOLCUDA_WATCHED_SYNC(cudaMemcpy2DArrayToArray,
                      (cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                       cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc, size_t width,
                       size_t height, cudaMemcpyKind kind),
                      (dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width, height,
                       kind))
#undef POOLCUDA_WATCHED_SYNC
POOLCUDA_WATCHED_PEER(cudaMemcpy3DPeer_ptds, true, nullptr,
                 (const cudaMemcpy3DPeerParms* p),
                 (p))
POOLCUDA_WATCHED(cudaMemcpy2DAsync, false, stream,
                 (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                  size_t height, cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, dpitch, src, spitch, width, height, kind, stream))
POOLCUDA_WATCHED(cudaMemcpy2DAsync_ptsz, true, stream,
                 (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                  size_t height, cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, dpitch, src, spitch, width, height, kind, stream))
POOLCUDA_WATCHED(cudaMemcpy2DFromArrayAsync, false, stream,
                 (void* dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                  size_t hOffset, size_t width, size_t height, cudaMemcpyKind kind,
                  cudaStream_t stream),
                 (dst, dpitch, src, wOffset, hOffset, width, height, kind, stream))
POOLCUDA_WATCHED(cudaMemcpy2DFromArrayAsync_ptsz, true, stream,
                 (void* dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                  size_t hOffset, size_t width, size_t height, cudaMemcpyKind kind,
                  cudaStream_t stream),
                 (dst, dpitch, src, wOffset, hOffset, width, height, kind, stream))
POOLCUDA_WATCHED(cudaMemcpy2DToArrayAsync, false, stream,
                 (cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src,
                  size_t spitch, size_t width, size_t height, cudaMemcpyKind kind,
                  cudaStream_t stream),
                 (dst, wOffset, hOffset, src, spitch, width, height, kind, stream))
POOLCUDA_WATCHED(cudaMemcpy2DToArrayAsync_ptsz, true, stream,
                 (cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src,
                  size_t spitch, size_t width, size_t height, cudaMemcpyKind kind,
                  cudaStream_t stream),
                 (dst, wOffset, hOffset, src, spitch, width, height, kind, stream))
POOLCUDA_WATCHED(cudaMemcpy3DAsync, false, stream,
                 (const cudaMemcpy3DParms* p, cudaStream_t stream),
                 (p, stream))
POOLCUDA_WATCHED(cudaMemcpy3DAsync_ptsz, true, stream,
                 (const cudaMemcpy3DParms* p, cudaStream_t stream),
                 (p, stream))
POOLCUDA_WATCHED_PEER(cudaMemcpy3DPeerAsync, false, stream,
                 (const cudaMemcpy3DPeerParms* p, cudaStream_t stream),
                 (p, stream))
POOLCUDA_WATCHED_PEER(cudaMemcpy3DPeerAsync_ptsz, true, stream,
                 (const cudaMemcpy3DPeerParms* p, cudaStream_t stream),
                 (p, stream))
POOLCUDA_WATCHED(cudaMemcpy3DBatchAsync, false, stream,
                 (size_t count, cudaMemcpy3DBatchOp* ops, unsigned long long flags,
                  cudaStream_t stream),
                 (count, ops, flags, stream))
POOLCUDA_WATCHED(cudaMemcpy3DBatchAsync_ptsz, true, stream,
                 (size_t count, cudaMemcpy3DBatchOp* ops, unsigned long long flags,
                  cudaStream_t stream),
                 (count, ops, flags, stream))
POOLCUDA_WATCHED(cudaMemcpyBatchAsync, false, stream,
                 (void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                  cudaMemcpyAttributes* attrs, size_t* attrs_indices, size_t attrs_count,
                  cudaStream_t stream),
                 (dsts, srcs, sizes, count, attrs, attrs_indices, attrs_count, stream))
POOLCUDA_WATCHED(cudaMemcpyBatchAsync_ptsz, true, stream,
                 (void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                  cudaMemcpyAttributes* attrs, size_t* attrs_indices, size_t attrs_count,
                  cudaStream_t stream),
                 (dsts, srcs, sizes, count, attrs, attrs_indices, attrs_count, stream))
POOLCUDA_WATCHED(cudaMemcpyFromArrayAsync, false, stream,
                 (void* dst, cudaArray_const_t src, size_t wOffset, size_t hOffset, size_t count,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, src, wOffset, hOffset, count, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyFromArrayAsync_ptsz, true, stream,
                 (void* dst, cudaArray_const_t src, size_t wOffset, size_t hOffset, size_t count,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, src, wOffset, hOffset, count, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyToArrayAsync, false, stream,
                 (cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src, size_t count,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, wOffset, hOffset, src, count, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyToArrayAsync_ptsz, true, stream,
                 (cudaArray_t dst, size_t wOffset, size_t hOffset, const void* src, size_t count,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, wOffset, hOffset, src, count, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyFromSymbolAsync, false, stream,
                 (void* dst, const void* symbol, size_t count, size_t offset,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, symbol, count, offset, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyFromSymbolAsync_ptsz, true, stream,
                 (void* dst, const void* symbol, size_t count, size_t offset,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (dst, symbol, count, offset, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyToSymbolAsync, false, stream,
                 (const void* symbol, const void* src, size_t count, size_t offset,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (symbol, src, count, offset, kind, stream))
POOLCUDA_WATCHED(cudaMemcpyToSymbolAsync_ptsz, true, stream,
                 (const void* symbol, const void* src, size_t count, size_t offset,
                  cudaMemcpyKind kind, cudaStream_t stream),
                 (symbol, src, count, offset, kind, stream))
POOLCUDA_WATCHED(cudaMemset2DAsync, false, stream,
                 (void* ptr, size_t pitch, int value, size_t width, size_t height,
                  cudaStream_t stream),
                 (ptr, pitch, value, width, height, stream))
POOLCUDA_WATCHED(cudaMemset2DAsync_ptsz, true, stream,
                 (void* ptr, size_t pitch, int value, size_t width, size_t height,
                  cudaStream_t stream),
                 (ptr, pitch, value, width, height, stream))
POOLCUDA_WATCHED(cudaMemset3DAsync, false, stream,
                 (cudaPitchedPtr ptr, int value, cudaExtent extent, cudaStream_t stream),
                 (ptr, value, extent, stream))
POOLCUDA_WATCHED(cudaMemset3DAsync_ptsz, true, stream,
                 (cudaPitchedPtr ptr, int value, cudaExtent extent, cudaStream_t stream),
                 (ptr, value, extent, stream))
// A host function: besides the fences, the pools' idle memory goes back first. The real call
// runs inside the guard (guarded()): the runtime passes it to the driver's hooked
// cuLaunchHostFunc, which must not do the same again.
#define POOLCUDA_HOST_FUNCTION(name, flavour, stream_expr, params, args) \
  POOLCUDA_EXPORT cudaError_t name params {                            \
    WATCH(stream_expr, flavour);                                       \
    if (pc::bypass()) return pc::real::name() args;                    \
    before_host_function(stream_expr, flavour);                        \
    return pc::guarded([&] { return pc::real::name() args; });         \
  }

POOLCUDA_HOST_FUNCTION(cudaLaunchHostFunc, false, stream,
                       (cudaStream_t stream, cudaHostFn_t fn, void* data), (stream, fn, data))
POOLCUDA_HOST_FUNCTION(cudaLaunchHostFunc_ptsz, true, stream,
                       (cudaStream_t stream, cudaHostFn_t fn, void* data), (stream, fn, data))
POOLCUDA_HOST_FUNCTION(cudaStreamAddCallback, false, stream,
                       (cudaStream_t stream, cudaStreamCallback_t callback, void* data,
                        unsigned int flags),
                       (stream, callback, data, flags))
POOLCUDA_HOST_FUNCTION(cudaStreamAddCallback_ptsz, true, stream,
                       (cudaStream_t stream, cudaStreamCallback_t callback, void* data,
                        unsigned int flags),
                       (stream, callback, data, flags))
POOLCUDA_HOST_WORK(cudaGraphLaunch, false, stream, (cudaGraphExec_t exec, cudaStream_t stream),
                   (exec, stream))
POOLCUDA_HOST_WORK(cudaGraphLaunch_ptsz, true, stream,
                   (cudaGraphExec_t exec, cudaStream_t stream), (exec, stream))
POOLCUDA_WATCHED(cudaEventRecord, false, stream, (cudaEvent_t event, cudaStream_t stream),
                 (event, stream))
POOLCUDA_WATCHED(cudaEventRecord_ptsz, true, stream, (cudaEvent_t event, cudaStream_t stream),
                 (event, stream))
// A wait that may join its stream to a capture (Note [Streams destroyed while capturing] in
// cuda_device.cpp).
#define POOLCUDA_WAIT_EVENT(name, flavour)                                                     \
  POOLCUDA_EXPORT cudaError_t name(cudaStream_t stream, cudaEvent_t event, unsigned int flags) { \
    WATCH(stream, flavour);                                                                    \
    const auto real = [&] { return pc::real::name()(stream, event, flags); };                  \
    if (pc::bypass() || !pc::hooks::any_capture_open()) return real();                         \
    return pc::guarded([&] { return pc::hooks::wait_event(stream, flavour, real); });          \
  }

POOLCUDA_WAIT_EVENT(cudaStreamWaitEvent, false)
POOLCUDA_WAIT_EVENT(cudaStreamWaitEvent_ptsz, true)

#undef POOLCUDA_WATCHED
#undef POOLCUDA_WATCHED_PEER
#undef POOLCUDA_HOST_WORK
#undef POOLCUDA_HOST_FUNCTION
#undef POOLCUDA_WAIT_EVENT

// Another device's work may read this one's memory: every device leaves ordered reuse.
POOLCUDA_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  if (!pc::bypass()) pc::stream_order::devices_connected();
  return pc::real::cudaDeviceEnablePeerAccess()(peer, flags);
}

POOLCUDA_EXPORT cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src,
                                           int src_device, size_t count) {
  WATCH(nullptr, false);
  if (!pc::bypass() && dst_device != src_device) pc::stream_order::devices_connected();
  return pc::real::cudaMemcpyPeer()(dst, dst_device, src, src_device, count);
}

POOLCUDA_EXPORT cudaError_t cudaMemcpy3DPeer(const cudaMemcpy3DPeerParms* p) {
  WATCH(nullptr, false);
  if (!pc::bypass() && p != nullptr && p->srcDevice != p->dstDevice)
    pc::stream_order::devices_connected();
  return pc::real::cudaMemcpy3DPeer()(p);
}

POOLCUDA_EXPORT cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                                int src_device, size_t count,
                                                cudaStream_t stream) {
  WATCH(stream, false);
  if (!pc::bypass() && dst_device != src_device) pc::stream_order::devices_connected();
  return pc::real::cudaMemcpyPeerAsync()(dst, dst_device, src, src_device, count, stream);
}

POOLCUDA_EXPORT cudaError_t cudaMemcpyPeerAsync_ptsz(void* dst, int dst_device, const void* src,
                                                     int src_device, size_t count,
                                                     cudaStream_t stream) {
  WATCH(stream, true);
  if (!pc::bypass() && dst_device != src_device) pc::stream_order::devices_connected();
  return pc::real::cudaMemcpyPeerAsync_ptsz()(dst, dst_device, src, src_device, count, stream);
}

POOLCUDA_EXPORT cudaError_t cudaSetDevice(int device) {
  const cudaError_t result = pc::real::cudaSetDevice()(device);
  if (result == cudaSuccess && !pc::bypass()) pc::stream_order::device_made_current(device);
  return result;
}
