// Foreign frees (see foreign_frees.h).
//
// Note [Foreign frees]
// ~~~~~~~~~~~~~~~~~~~~
// A free the pools do not own goes to the real free. Between the pools' "not mine" and the
// driver's free, another thread may grow a pool, and the driver may give that new page exactly
// the address being freed: that happens whenever the pointer is stale, i.e. the driver already
// freed its allocation (a device reset frees everything, and a program racing a reset frees
// pointers from before it; a program's double free). The real free would then free the pool's
// live page, the driver would hand its address out again, and the pools would hold two pages
// at one address (plain CUDA frees someone's allocation there; the pools' trees break). The
// pools' check cannot simply be held across the real free: it synchronizes the device, and
// the pools' lock is the hot path's. So a foreign free, and only a foreign free, asks in this
// order:
//   1. register (a ticket), and while another thread's free of the same pointer is in flight,
//      wait for it to end (a guard ends as soon as its real free and its bookkeeping are done:
//      ForwardedFree in pooling.h). That free may have been right: the driver may give the
//      address to a new allocation the moment it has freed the old one, and the program may
//      free that before the first free's hook has returned (a refusal here once failed such a
//      free of a live buffer). Or the two are the program's double free, which step 2 answers
//      once the first has ended. The wait is bounded (kWaitForEarlierFree): a free still in
//      flight after it (one waiting on the device, which might wait on this thread) makes this
//      one a double free, refused without a real call. A stop of the whole process longer than
//      the bound must not end it before the first free has run again (Note [Stopped processes]
//      in pools/wait_bound.h). The release worker's driver free of a page at the pointer, begun
//      before this free registered, is waited for the same way: it may wait for the device, and
//      until it ends the driver still has the page, which a double free of the program would
//      otherwise have freed instead, leaving the worker's free to fail;
//   2. ask the driver whether any allocation covers the pointer (cudaPointerGetAttributes,
//      a query that never waits on the device); none: no real free;
//   3. ask the pools again (the managed slabs once no chain is making a slab: their lookup takes
//      no lock, so a slab whose memory the driver has just handed over, not yet in its chain,
//      would be missed, and the real free would free the whole slab under its allocations);
//      then the release worker, whose pages are the library's until the
//      driver has them back: a page still with it, or returned to the driver since step 1
//      (it marks the registered frees of that pointer), means the pointer is stale: no real
//      free. Only then the real free. The worker reads the next ticket just before the driver's
//      free of a page, and only frees registered before that count as stale: the driver may
//      hand the address to a new allocation as soon as its free is done, before the worker has
//      marked anything or cleared its page, and a free of that new allocation (which registers
//      after it was made, so after the driver's free began) is the program's own.
// A pool can take the address only once the driver has freed what was there. After step 2
// saw it live and step 3 found it neither in the pools nor with the release worker, that is
// this free (after which the pools may take it freely) or a device reset (a concurrent free of
// the same pointer waits in step 1 until this one has ended). So a reset keeps the device's
// manager and managed slabs frozen (no page or slab taken from the driver; Note [Device reset]
// in pooling.cpp) until every foreign free registered before its end has finished:
// thaw_after_foreign_frees. (The slabs used to thaw with the reset: a stale free of a
// passed-through managed pointer from before it freed the new slab the driver had put at its
// address.) The reset does not wait for them (such a free may wait on the device for long); the
// last of them thaws the device on its way out. A refused free is answered as the driver answers a
// pointer it does not know (cudaErrorInvalidValue), as plain CUDA answers a stale pointer
// when nothing new has been put at its address.
// Without a runtime in the process (a static cudart reaching the driver directly) there is no
// query (step 2 answers "live"); register and re-check still apply.
//
// Depends on the real-function table, own_api.h, the log, the release worker and the lock
// order. Runs inside a hook, under its re-entry guard, with no lock of the library held (step
// 1 may wait).
#include "interpose/foreign_frees.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <vector>

#include "interpose/log.h"
#include "interpose/own_api.h"
#include "interpose/real_cuda.h"
#include "interpose/release_worker.h"
#include "pools/lock_order.h"
#include "pools/memory_manager.h"
#include "pools/no_cancel.h"
#include "pools/wait_bound.h"

namespace poolcuda {

namespace {

// How long a free waits for another thread's free of the same pointer (step 1 of the note):
// a free that has returned from the driver ends within microseconds; one still waiting on the
// device may wait on the waiting thread itself.
constexpr std::chrono::seconds kWaitForEarlierFree{5};

struct InFlight {
  std::uint64_t ticket;
  const void* ptr;
  bool library_freed;  // the release worker returned a page at ptr meanwhile
};

struct Thaw {
  std::uint64_t ticket;  // every foreign free below it must have ended
  int device;
  void (*thaw)(int device);
};

struct State {
  RankedMutex mutex{LockRank::foreign_free};  // a leaf: nothing is taken under it
  std::uint64_t next_ticket = 1;
  std::vector<InFlight> in_flight;
  std::vector<Thaw> thaws;
  std::condition_variable_any ended;  // an entry left in_flight

  std::uint64_t low_water() const {
    std::uint64_t low = next_ticket;
    for (const InFlight& f : in_flight) low = std::min(low, f.ticket);
    return low;
  }
};

State& state() {
  static State* s = new State;  // never destroyed (Note [Exit] in lifecycle.cpp)
  return *s;
}

// False only when the driver answers that no allocation covers `ptr`; anything it cannot
// answer counts as live, so that a free plain CUDA would accept is never refused.
bool driver_knows(const void* ptr) {
  if (!own::through_runtime()) return true;
  const cudaError_t prior = real::cudaPeekAtLastError()();
  cudaPointerAttributes attributes{};
  const cudaError_t result = real::cudaPointerGetAttributes()(&attributes, ptr);
  if (prior == cudaSuccess && real::cudaPeekAtLastError()() != cudaSuccess)
    real::cudaGetLastError()();  // Note [Own calls] in own_call.h
  return result != cudaSuccess || attributes.type != cudaMemoryTypeUnregistered;
}

}  // namespace

ForeignFree::ForeignFree(const void* ptr) : ptr_(ptr) {
  State& s = state();
  {
    std::unique_lock<RankedMutex> hold(s.mutex);
    ticket_ = s.next_ticket++;
    s.in_flight.push_back(InFlight{ticket_, ptr, false});
    const auto earlier_in_flight = [&] {
      return std::any_of(s.in_flight.begin(), s.in_flight.end(), [&](const InFlight& f) {
        return f.ptr == ptr && f.ticket < ticket_;
      });
    };
    if (earlier_in_flight()) {
      // Nothing may unwind out of here: the entry is only removed by end() (Note [Cancellation]
      // in pools/no_cancel.h).
      NoCancel no_cancel;
      const auto ended = [&] { return !earlier_in_flight(); };
      WaitBound bound{kWaitForEarlierFree};
      duplicate_ = !bound.retry([&] { return s.ended.wait_for(hold, bound.left(), ended); });
    }
  }
  // The release worker's driver free of a page at the same address, begun before this free
  // registered, is an earlier free too: the driver still has the page until it ends.
  if (!duplicate_) {
    WaitBound bound{kWaitForEarlierFree};
    duplicate_ = !ReleaseWorker::instance().wait_while_freeing(ptr, ticket_, bound);
  }
  if (!duplicate_) driver_knew_ = driver_knows(ptr);
}

bool ForeignFree::may_free() const {
  if (duplicate_) {
    // Logged here, not in the constructor: an exception there would leave the entry behind.
    log_format(LogLevel::basic,
               "free of %p: an earlier free of it (another thread's, or the library's return "
               "of its page) has not returned after %lld s; "
               "answered as a double free (cudaErrorInvalidValue)",
               ptr_, static_cast<long long>(kWaitForEarlierFree.count()));
    return false;
  }
  if (!driver_knew_ || ReleaseWorker::instance().owns(ptr_, ticket_)) return false;
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  for (const InFlight& f : s.in_flight)
    if (f.ticket == ticket_) return !f.library_freed;
  return true;
}

void ForeignFree::end() {
  if (ended_) return;
  ended_ = true;
  State& s = state();
  std::unique_lock<RankedMutex> hold(s.mutex);
  std::erase_if(s.in_flight, [&](const InFlight& f) { return f.ticket == ticket_; });
  s.ended.notify_all();
  // One thaw at a time, each outside the leaf lock (a thaw takes the pools' locks).
  for (;;) {
    const std::uint64_t low = s.low_water();
    auto due = std::find_if(s.thaws.begin(), s.thaws.end(),
                            [&](const Thaw& t) { return t.ticket <= low; });
    if (due == s.thaws.end()) return;
    const Thaw thaw = *due;
    s.thaws.erase(due);
    hold.unlock();
    thaw.thaw(thaw.device);
    hold.lock();
  }
}

std::uint64_t next_foreign_free_ticket() {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  return s.next_ticket;
}

void library_freed(const void* ptr, std::uint64_t boundary) {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  for (InFlight& f : s.in_flight)
    if (f.ptr == ptr && f.ticket < boundary) f.library_freed = true;
}

void thaw_after_foreign_frees(int device, void (*thaw)(int device)) {
  State& s = state();
  {
    std::lock_guard<RankedMutex> hold(s.mutex);
    if (s.low_water() < s.next_ticket) {
      s.thaws.push_back(Thaw{s.next_ticket, device, thaw});
      return;
    }
  }
  thaw(device);
}

}  // namespace poolcuda
