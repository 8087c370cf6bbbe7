// Frees from inside a call (see deferred_frees.h).
//
// Note [Frees from inside a call]
// While a thread is inside one of the library's calls, its CUDA calls go straight to the real
// functions (hook_guard.h): they are the real runtime's own, or the library's. A signal handler
// that runs on that thread is neither, and neither is an exit() it calls, whose atexit work and
// static destructors run there too. Its cudaFree of a pooled pointer reached the real cudaFree,
// which freed the whole page the slice lay in, live neighbours and all: a SIGINT handler that
// freed a 256 KiB buffer while the program waited in cudaDeviceSynchronize (or in a cudaMalloc's
// wait for a fence) gave its 2 MiB page to the driver, and the next growth handed it out over
// seven buffers the program still owned; a free of a slice inside a page failed with
// cudaErrorInvalidValue, and an exit() from the handler ended in the program's own error check
// on such a free. The pools cannot be entered there: the interrupted call may hold their locks.
// So a runtime free (cudaFree, cudaFreeAsync) made inside a call is queued on the thread and
// answered cudaSuccess; the call, once it is over, makes the queued frees as the program's own
// (guarded() in exports_common.h), or they go with the process when it exits. Queueing is a
// fetch-add and a few stores in thread-local memory, which a handler may do. A full queue (a
// handler freeing more than kCapacity buffers) drops the rest: leaked, said once, never freed
// wrongly. Driver frees (cuMemFree) cannot be told from the real runtime's own, and still pass
// through (docs/limits.md).
//
// Depends on hooks.h and the log.
#include "interpose/deferred_frees.h"

#include <cxxabi.h>

#include "interpose/hooks.h"
#include "interpose/log.h"

namespace poolcuda::deferred {

namespace {
std::atomic<std::uint64_t> g_dropped{0};
std::atomic<bool> g_dropped_said{false};
}  // namespace

void queue(void* ptr, cudaStream_t stream, Kind kind) {
  const unsigned at = detail::t_taken.fetch_add(1, std::memory_order_relaxed);
  if (at >= kCapacity) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Free& slot = detail::t_frees[at];
  slot.ptr = ptr;
  slot.stream = stream;
  slot.kind = kind;
  slot.ready.store(true, std::memory_order_release);
}

void drain() {
  // Taken in order. A handler that runs meanwhile queues behind, and this loop takes it too: the
  // count goes back to 0 only if it is still what the loop took.
  for (unsigned at = 0;;) {
    unsigned taken = detail::t_taken.load(std::memory_order_acquire);
    if (at >= taken || at >= kCapacity) {
      if (detail::t_taken.compare_exchange_strong(taken, 0, std::memory_order_acq_rel)) break;
      continue;
    }
    Free& slot = detail::t_frees[at++];
    // A handler that interrupted this drain between its two steps has finished by now.
    if (!slot.ready.exchange(false, std::memory_order_acquire)) continue;
    try {
      InsideHook inside;
      if (slot.kind == plain)
        hooks::free(slot.ptr);
      else
        hooks::free_async(slot.ptr, slot.stream, slot.kind == async_per_thread);
    } catch (const abi::__forced_unwind&) {
      throw;  // a cancellation (Note [Cancellation] in pools/no_cancel.h)
    } catch (...) {  // a host allocation failed: that free is lost, as a dropped one is
    }
  }
  const std::uint64_t dropped = g_dropped.load(std::memory_order_relaxed);
  if (dropped != 0 && !g_dropped_said.exchange(true))
    log_format(LogLevel::basic,
               "%llu frees made inside a call of the library's (a signal handler's) were not "
               "made: more than %u waited on one thread; their memory stays allocated",
               static_cast<unsigned long long>(dropped), kCapacity);
}

}  // namespace poolcuda::deferred
