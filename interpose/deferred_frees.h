// Frees the program makes on a thread that is inside one of the library's calls: from a signal
// handler that interrupted the call (a SIGINT handler freeing buffers while the program waits in
// cudaDeviceSynchronize), or from the exit work of an exit() made there. Note [Frees from inside
// a call] in deferred_frees.cpp.
//
// Depends on hook_guard.h; the drain on hooks.h.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "interpose/hook_guard.h"

namespace poolcuda::deferred {

struct Free {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  std::uint8_t kind = 0;  // Kind
  std::atomic<bool> ready{false};
};

enum Kind : std::uint8_t { plain, async, async_per_thread };

inline constexpr unsigned kCapacity = 32;

namespace detail {
__attribute__((tls_model("initial-exec"))) inline thread_local std::atomic<unsigned> t_taken{0};
__attribute__((tls_model("initial-exec"))) inline thread_local Free t_frees[kCapacity];
}  // namespace detail

// Whether a free on this thread must wait for the call it interrupted: the thread is inside the
// library, and a runtime free never comes from the library itself or from the real runtime.
inline bool must_wait() { return inside_hook() && !passthrough(); }

// Queues a free for the end of the call it interrupted (async-signal-safe). When the queue is
// full the free is dropped (the memory stays allocated) and counted.
void queue(void* ptr, cudaStream_t stream, Kind kind);

// Whether frees wait on this thread (one load of a thread-local counter).
inline bool waiting() { return detail::t_taken.load(std::memory_order_relaxed) != 0; }

// Makes the queued frees, as the program's own calls, once the call they interrupted is over.
void drain();

}  // namespace poolcuda::deferred
