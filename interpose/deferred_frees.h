// Frees the program makes on a thread that is inside one of the library's calls: from a signal
// handler that interrupted the call (a SIGINT handler freeing buffers while the program waits in
// cudaDeviceSynchronize), or from the exit work of an exit() made there. Note [Frees from inside
// a call] in deferred_frees.cpp.
//
// Depends on hook_guard.h; the drain on hooks.h.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "interpose/hook_guard.h"

namespace poolcuda::deferred {

enum Kind : unsigned char { plain, async, async_per_thread };

namespace detail {
// Frees this thread queued since its last drain.
__attribute__((tls_model("initial-exec"))) inline thread_local std::atomic<unsigned> t_queued{0};
}  // namespace detail

// Whether a free on this thread must wait for the call it interrupted: the thread is inside the
// library, and a runtime free never comes from the library itself or from the real runtime.
inline bool must_wait() { return inside_hook() && !passthrough(); }

// Queues a free for the end of the call it interrupted (async-signal-safe). When every slot is
// taken the free is dropped (the memory stays allocated) and counted.
void queue(void* ptr, cudaStream_t stream, Kind kind);

// Whether frees wait on this thread (one load of a thread-local counter).
inline bool waiting() { return detail::t_queued.load(std::memory_order_relaxed) != 0; }

// Makes this thread's queued frees, as the program's own calls, once the call they interrupted
// is over.
void drain();

}  // namespace poolcuda::deferred
