// The core of every hooked CUDA runtime entry point: what cudaMalloc, cudaFree, cudaMemGetInfo,
// cudaDeviceReset and the stream calls do when the pools are active. The exported shims
// (exports.cpp) call exactly one of these after their re-entry and pass-through checks; these
// functions never check either.
//
// Depends on the pooling core, the real-function table and the driver variants.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

#include "interpose/real_cuda.h"  // POOLCUDA_SHAPED_COPIES

namespace poolcuda::pooling {
class ReturnsSince;
}

namespace poolcuda::hooks {

cudaError_t malloc(void** ptr, std::size_t size);
cudaError_t free(void* ptr);
cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread);
cudaError_t malloc_async(void** ptr, std::size_t size, cudaStream_t stream, bool per_thread);
cudaError_t malloc_pitch(void** ptr, std::size_t* pitch, std::size_t width, std::size_t height);
// An allocation of `size` bytes the pools do not serve, by the runtime's API: `real`, and once
// more after the pools gave their idle memory back when the driver refused it for lack of
// memory, leaving the last-error slot as the plain call would (Note [Stream-ordered allocations]
// in hooks.cpp).
cudaError_t with_room(int device, std::size_t size, const std::function<cudaError_t()>& real);
// The same, for a device that is looked up (device_of) only when room is needed; `stream_pool`
// for a stream-ordered pool's allocation (pooling::beyond_reach).
cudaError_t with_room(const std::function<int()>& device_of, std::size_t size,
                      const std::function<cudaError_t()>& real, bool stream_pool = false);
// A launch `real` was just refused with `first` (cudaErrorMemoryAllocation): `real` once more
// after the pools gave their idle memory back, or `first` when nothing went back, nor reached the
// driver since `returns` was made before the launch (Note [Launches short of memory] in
// hooks.cpp, Note [Room that arrived meanwhile] in pooling.cpp).
cudaError_t launch_again(cudaError_t first, const pooling::ReturnsSince& returns,
                         const std::function<cudaError_t()>& real);
cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t ipc_get_mem_handle(cudaIpcMemHandle_t* handle, void* ptr);
cudaError_t device_reset();
cudaError_t device_synchronize();
cudaError_t stream_create(cudaStream_t* stream);
cudaError_t stream_create_with_flags(cudaStream_t* stream, unsigned int flags);
cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t stream_destroy(cudaStream_t stream);

// cudaGetDriverEntryPoint(ByVersion): what the real call found, a hooked driver variant mapped
// to the library's hook.
cudaError_t map_driver_entry(cudaError_t result, void** fn);

// Stream capture, for the runtime and the driver entry points alike (capture_hooks.cpp).
// `stream` is the runtime's or the driver's handle (they are the same objects); with
// `per_thread` the 0 handle names the per-thread default stream. `real` makes the real begin or
// end and returns its result as a number (CUresult and cudaError_t agree on success, 0).
int begin_capture(cudaStream_t stream, bool per_thread, cudaStreamCaptureMode mode,
                  const std::function<int()>& real);
int end_capture(cudaStream_t stream, bool per_thread, cudaGraph_t* graph,
                const std::function<int()>& real);
// cudaStreamWaitEvent: while a capture the hooks saw begin is open, a tracked stream that the
// wait may join to it is marked first (Note [Streams destroyed while capturing] in
// cuda_device.cpp). `real` makes the real wait.
cudaError_t wait_event(cudaStream_t stream, bool per_thread,
                       const std::function<cudaError_t()>& real);
// The device of `stream` (-1 when there is none), asked without touching a capture open on it
// (Note [A capturing stream's device] in capture_hooks.cpp): the current device's for the
// legacy and per-thread default streams and for handles CUDA refuses.
int stream_device(cudaStream_t stream);
// The capture open on `stream` (0 when none) and the stream's device, asked before the stream
// is destroyed; afterwards stream_destroyed_while_capturing closes that capture as failed when
// the stream began it (a stream that only joined it leaves it open). `destroyed`: the destroy
// succeeded (the handle is dead and is not asked about again).
unsigned long long stream_capture_id(cudaStream_t stream, int* device);
// Whether CUDA refuses a potentially unsafe call (an allocation, a free) on the calling thread
// now, for a capture begun through the hooks (Note [Unsafe calls in a capture] in
// capture_hooks.cpp).
bool unsafe_calls_refused_here();
// Whether a capture the library saw begin is open on any device (one atomic load), or on
// another device than `device`.
bool any_capture_open();
bool capture_open_elsewhere(int device);
// A reset of `device` ended its open captures: the streams that began them begin no capture now.
void device_captures_forgotten(int device);
void stream_destroyed_while_capturing(cudaStream_t stream, int device,
                                      unsigned long long capture_id, bool destroyed);

// cudaSuccess for a stream handle the runtime knows (the legacy and per-thread default streams
// without asking), else the runtime's error for it, left in the last-error slot (Note [Stream
// handles] in hooks.cpp).
cudaError_t stream_handle_error(cudaStream_t stream);
// Whether `stream` is in a stream capture, valid or invalidated.
bool capturing(cudaStream_t stream);
// The error a stream-ordered free on `stream` meets from a capture in plain CUDA, where it frees
// nothing, so a pooled one must not either: cudaErrorStreamCaptureInvalidated on a stream whose
// capture an earlier call invalidated, cudaErrorStreamCaptureImplicit on the legacy stream while
// a blocking stream captures (that capture is invalidated then, as the plain call does: Note
// [The legacy stream beside a capture] in hooks.cpp). Left in the last-error slot; cudaSuccess
// when neither.
cudaError_t capture_refusal(cudaStream_t stream);
// The plain call's error on a stream whose capture is invalidated, returned and left in the
// last-error slot as the plain call leaves it.
cudaError_t refuse_on_invalidated_capture(cudaStream_t stream);
// Whether a capture the library saw begin is open on `device` (no CUDA call).
bool capture_open(int device);

// Shared with managed_hooks.cpp: the device current on the calling thread (-1 when none), and
// a refusal's cudaErrorInvalidValue or cudaErrorMemoryAllocation left in the runtime's
// last-error slot (Note [Last error] in hooks.cpp) and returned, or the sticky error the real
// call answered instead.
int current_device();
// Note [A thread's first call]: makes the primary context of `device` current on a thread that
// never had a context, as the program's own runtime call would have; bind_after_own_calls does
// so for the current device, after the library's own calls served a program's call. Each is a
// thread-local test once that is done.
void bind_like_the_runtime(int device);
void bind_after_own_calls();
cudaError_t raise_invalid_value();
// `out`: the program's pointer argument, which the real call sets as it sets it on any refusal.
cudaError_t raise_out_of_memory(void** out);

}  // namespace poolcuda::hooks

// Every runtime entry point the library exports (exports.cpp, stream_exports.cpp): a lookup of
// one of these names through a library handle gets the hook (dlsym_hook.cpp).
#define POOLCUDA_RUNTIME_HOOKS(X)           \
  X(cudaMalloc)                             \
  X(cudaFree)                               \
  X(cudaFreeAsync)                          \
  X(cudaFreeAsync_ptsz)                     \
  X(cudaMallocAsync)                        \
  X(cudaMallocAsync_ptsz)                   \
  X(cudaMallocPitch)                        \
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
  X(cudaStreamBeginCapture)                 \
  X(cudaStreamBeginCapture_ptsz)            \
  X(cudaStreamBeginCaptureToGraph)          \
  X(cudaStreamBeginCaptureToGraph_ptsz)     \
  X(cudaStreamEndCapture)                   \
  X(cudaStreamEndCapture_ptsz)              \
  X(cudaLaunchKernel)                       \
  X(cudaLaunchKernel_ptsz)                  \
  X(__cudaLaunchKernel)                     \
  X(__cudaLaunchKernel_ptsz)                \
  X(cudaLaunchKernelExC)                    \
  X(cudaLaunchKernelExC_ptsz)               \
  X(cudaLaunchCooperativeKernel)            \
  X(cudaLaunchCooperativeKernel_ptsz)       \
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
  X(cudaEventRecord)                        \
  X(cudaEventRecord_ptsz)                   \
  X(cudaStreamWaitEvent)                    \
  X(cudaStreamWaitEvent_ptsz)               \
  X(cudaDeviceEnablePeerAccess)             \
  X(cudaMemcpyPeer)                         \
  X(cudaMemcpy3DPeer)                       \
  X(cudaMemcpyPeerAsync)                    \
  X(cudaMemcpyPeerAsync_ptsz)               \
  X(cudaSetDevice)                          \
  X(cudaMemGetInfo)                         \
  X(cudaDeviceReset)                        \
  X(cudaDeviceSynchronize)                  \
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
