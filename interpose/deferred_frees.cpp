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
// So a runtime free (cudaFree, cudaFreeAsync) made inside a call is queued for the thread and
// answered cudaSuccess; the call, once it is over, makes the queued frees as the program's own
// (guarded() in exports_common.h), or they go with the process when it exits. Queueing takes a
// slot of a fixed table with a compare-and-swap and fills it: atomics and stores, which a
// handler may do. A full table (more than kSlots frees waiting in the process) drops the rest:
// leaked, said once, never freed wrongly. Driver frees (cuMemFree) cannot be told from the real
// runtime's own, and still pass through (docs/limits.md).
//
// Depends on hooks.h and the log.
#include "interpose/deferred_frees.h"

#include <cxxabi.h>

#include "interpose/hooks.h"
#include "interpose/log.h"
#include "interpose/real_cuda.h"

namespace poolcuda::deferred {

namespace {

// The queued frees of every thread, in one process-wide table: a handler cannot allocate, and a
// table per thread took 800 bytes of every thread's initial-exec storage, which a dlopen of the
// library may not find left. A slot is taken by a compare-and-swap of its owner, a thread-local
// address that no other live thread has.
constexpr unsigned kSlots = 64;

struct Slot {
  std::atomic<const void*> owner{nullptr};
  std::atomic<bool> ready{false};  // filled: its owner may take it
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  Kind kind = plain;
};

Slot g_slots[kSlots];
std::atomic<std::uint64_t> g_dropped{0};
std::atomic<bool> g_dropped_said{false};

const void* this_thread_token() { return &detail::t_queued; }

}  // namespace

void queue(void* ptr, cudaStream_t stream, Kind kind) {
  const void* me = this_thread_token();
  for (Slot& slot : g_slots) {
    const void* unowned = nullptr;
    if (!slot.owner.compare_exchange_strong(unowned, me, std::memory_order_acquire)) continue;
    slot.ptr = ptr;
    slot.stream = stream;
    slot.kind = kind;
    slot.ready.store(true, std::memory_order_release);
    detail::t_queued.fetch_add(1, std::memory_order_release);
    return;
  }
  g_dropped.fetch_add(1, std::memory_order_relaxed);
}

void drain() {
  const void* me = this_thread_token();
  // A handler that runs meanwhile counts its free again, and the next round takes it.
  while (detail::t_queued.exchange(0, std::memory_order_acquire) != 0) {
    for (Slot& slot : g_slots) {
      if (slot.owner.load(std::memory_order_acquire) != me ||
          !slot.ready.exchange(false, std::memory_order_acquire))
        continue;
      void* const ptr = slot.ptr;
      const cudaStream_t stream = slot.stream;
      const Kind kind = slot.kind;
      slot.owner.store(nullptr, std::memory_order_release);
      try {
        InsideHook inside;
        if (kind == plain) {
          hooks::free(ptr);
        } else {
          // The stream may be gone by now (destroyed after the handler returned): then the free
          // is made unordered, never lost (the handler was told it succeeded), and the refusal
          // of the stream leaves nothing in a last-error slot that was clean.
          const cudaError_t before = real::cudaPeekAtLastError()();
          if (hooks::free_async(ptr, stream, kind == async_per_thread) ==
              cudaErrorInvalidResourceHandle) {
            if (before == cudaSuccess) real::cudaGetLastError()();
            hooks::free(ptr);
          }
        }
      } catch (const abi::__forced_unwind&) {
        throw;  // a cancellation (Note [Cancellation] in pools/no_cancel.h)
      } catch (...) {  // a host allocation failed: that free is lost, as a dropped one is
      }
    }
  }
  const std::uint64_t dropped = g_dropped.load(std::memory_order_relaxed);
  if (dropped != 0 && !g_dropped_said.exchange(true))
    log_format(LogLevel::basic,
               "%llu frees made inside a call of the library's (a signal handler's) were not "
               "made: more than %u waited at once; their memory stays allocated",
               static_cast<unsigned long long>(dropped), kSlots);
}

}  // namespace poolcuda::deferred
