// StreamOrder: under free_fence:auto, decides per device whether all device work that can touch
// the device's memory runs in one ordered queue, so that freed memory may be reused at once
// (Note [Stream-ordered reuse] in stream_order.cpp), and moves a device to fenced reuse, safely,
// the moment that stops being true. Fed by the hooks that see streams, threads and devices.
//
// Depends on the registry (managers, CUDA devices, the stream table) and the real-function
// table.
#pragma once

#include <cuda_runtime_api.h>

namespace poolcuda {

class MemoryManager;

namespace stream_order {

// The program called a hooked driver entry point itself (directly, through a resolver, or from
// a statically linked runtime): it may also use per-thread default streams through the driver,
// where no hook sees them, so every device leaves ordered reuse for good.
void driver_used_directly();

// A device got its manager: it starts ordered if nothing so far rules that out.
void device_added(int device, MemoryManager& manager);

// `device` is about to be reset: its fences are dropped (the reset waits for all its work).
void device_reset(int device);

// A stream was created on `device` (after the real create succeeded, before the program sees
// the handle).
void stream_created(int device, cudaStream_t stream, bool non_blocking);

// The calling thread used the per-thread default stream (a _ptsz/_ptds entry point, or the
// cudaStreamPerThread handle) on its current device. Cheap when it changes nothing.
void per_thread_stream_used();
// Whether the calling thread was seen using its per-thread default stream (whatever the mode):
// only then does the library ask about that stream, which would make the runtime set it up,
// perhaps taking the dynamic loader's lock (Note [Table without the loader] in
// pools/thread_cache.cpp), while a shard's lock is held.
bool per_thread_stream_seen();
// The calling thread is exiting, and its per-thread default stream is gone or going with it (the
// runtime's thread-exit handlers may have run first): the library asks no more about it.
void per_thread_stream_gone();

// The calling thread made `device` current (cudaSetDevice).
void device_made_current(int device);

// The calling thread puts work on a stream (a launch, copy, memset...). At its first, its
// current device counts as used: a thread starts on device 0 without calling cudaSetDevice.
// Cheap when it changes nothing.
void work_issued();

// The calling thread switched its driver context (cuCtxSetCurrent, cuCtxPushCurrent,
// cuCtxPopCurrent): the new context's device counts as used, as after cudaSetDevice, and so
// does the device at the thread's next work (the runtime's calls run in that context too).
void context_switched();

// Work of one device may now touch another's memory (peer access, a peer copy).
void devices_connected();

// A stream capture is about to begin on `device`: a device is never left ordered during a
// capture, so it leaves first (the move records on the legacy stream, which a capture forbids).
void capture_beginning(int device);

// The program is about to issue work that may park a stream on the host (a host function, a
// graph launch): an ordered device records the event its leaving may use as its fence.
void host_work_issuing();

// Whether `device` reuses at once now (reports and tests).
bool ordered(int device);

}  // namespace stream_order
}  // namespace poolcuda
