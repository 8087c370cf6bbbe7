// The release worker (see release_worker.h).
//
// Note [Release worker]
// ~~~~~~~~~~~~~~~~~~~~~
// The pools return idle pages on their own schedule: a dealloc period expiring on an
// allocation, a trim, out-of-memory recovery. The real cudaFree waits for every stream of the
// device, so calling it from the allocating thread turns a cudaMalloc, which never waits on
// streams, into one that can block forever (a stream parked on a host function that this very
// thread would release after cudaMalloc returns). So pages go to a thread of the library's,
// which frees them one by one; the allocating thread returns at once. Each device has a thread
// of its own (a lane), started at its first page: a free that waits for one device's long
// kernels must not hold back the pages of another, whose growths wait for them (with one thread
// for every device, a program churning memory on device 0 beside a busy device 1 spent 500 times
// as long in cudaMalloc as under plain CUDA). A free the driver refuses for a stream capture
// (Note [Releases during capture] below) holds its page back, to be retried when a capture ends
// (wake()) or every kRetryMillis. Out-of-memory recovery waits, bounded, for the device's
// queue to drain before it asks the driver again (flush()).
// A thread that cannot be created leaves the lane's pages queued: the next release tries again,
// and meanwhile flush(), which runs with no lock of the pools held, frees them on the flushing
// thread (freeing them at release, under a shard's lock, would stall every thread of the shard
// behind the device). The threads are created with every signal blocked, so the program's
// signals are never handled on them; they never exit (the process ends around them, their queues
// unreleased: the memory goes with the process). A forked child passes every call through and
// never touches them.
//
// Note [Releases during capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream capture forbids potentially unsafe calls such as cudaFree only to threads in global or
// thread-local capture mode: a thread in relaxed mode may free while any capture is open, its
// own included (the CUDA documentation of cudaThreadExchangeStreamCaptureMode, and what an H200
// did). The pages' frees are the library's own calls, made in relaxed mode (Note [Own calls] in
// own_call.h), so they go on while captures are open. They used to wait for every capture to
// end: a capture's own allocation then failed for lack of the memory the pools had just given
// up for it (out-of-memory recovery inside the capture), where the plain run succeeded. A free
// the driver still refuses for a capture (cudaErrorStreamCaptureUnsupported and the like) holds
// its page back, never lost: the pools count it as returned, the device gets it when a capture
// ends or at the next retry, and cudaDeviceReset frees it with everything else
// (forget_device). A capture's begin still marks the lane (no free starts while it is marked)
// and lets a free already inside the driver finish first, for at most a second: a free that
// meets a capture's begin is the one order no GPU was seen to accept. The bound keeps a program
// that begins a capture while one of its streams is parked (the driver's free then waits for
// the park, which this very thread may be the one to lift) from hanging where plain CUDA would
// not; past it the begin goes ahead.
//
// Note [Spinning before sleeping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A growth past the held bound waits for the pages given up before it to reach the driver
// (Note [Releases before growth] in pools/memory_manager.cpp): the lane's thread must wake, free,
// and wake the flusher. Each of those wakes is a futex sleep and wake, about 25 us on the 2-core
// build machine (Note [Spinning before parking] in pools/lock_order.h), while the stand-in's free
// itself takes a few: on the 1 GiB random traces, where a quarter of the pairs grow past the
// bound, the waits were most of the time, and two threads made fewer pairs per second than
// one. So a lane's thread that runs out of pages, and a flush whose pages are not back yet,
// first watch the lane's change count, with the lock released, for kSpinBeforeSleep; only then
// do they sleep. Measured on the stand-in, interleaved runs: `rmm-100k-1GiB` went from 0.12M
// to 0.25M pairs per second with one thread, and from 0.06-0.09M to 0.29-0.35M with two. The
// price is CPU: at most kSpinBeforeSleep per page freed and per flush, about what a real
// driver's free of a large page takes anyway; a program whose pools give no page back pays
// nothing. Held-back pages (a capture open) are retried on their timer, not watched.
// A futex wake often puts the woken thread on the waker's CPU, so the two sides may share one
// CPU while the other idles. Spinning there holds off the very thread it waits for; sleeping
// there costs a futex sleep and wake per handoff, and waking a vCPU that went idle costs a
// hypervisor exit on top. So each side publishes a hint of where it runs: the lane's thread its
// CPU at each pass of its loop, a program thread its CPU when it queues a page or flushes (the
// last one wins), and kAsleep while it sleeps in the lane's waits (sched_getcpu: with glibc 2.35
// or later usually a read of the rseq area, no system call). A watcher spins while the other
// side was last seen on another CPU, and otherwise yields its CPU (sched_yield) between looks,
// for as long as that side may want the CPU: a flush, while the lane's thread is awake (it has
// the flush's pages in hand), or for kWakeGrace from the flush's start while it sleeps (the page
// just queued woke it); the lane's thread, for kWakeGrace after each page it freed (the flush
// waiting for that page shows its CPU only once it has the lock back). A yield hands the CPU
// straight to a runnable other side: a context switch with no futex, and no wake-up of an idle
// CPU; with nothing else runnable it returns at once. The lane's thread yields no longer than
// that: one that kept yielding beside a program thread that is not flushing would stay on that
// thread's CPU, where a wake lets the scheduler put it on an idle one. A watcher stops, and
// sleeps, when none of that holds, when it does not know where it runs, at kSpinBeforeSleep in
// any case, and instead of yielding when it is a real-time thread (a yield hands the CPU to
// threads of its own priority only; the lane's thread inherits the policy of the program thread
// that starts it). A signal() wakes the condition variable only when someone sleeps on it (its
// notify takes a lock of its own that the woken thread then fights for), and a flush signals at
// its start only when it has held-back pages to retry (that signal used to end the lane
// thread's watch, which then slept).
// Interleaved runs on the 2-core stand-in machine, pairs per second, before → after (median of
// 5 to 7): `rmm-10k-1GiB` 227k → 899k, `rmm-1k-1GiB` 194k → 486k, `rmm-100k-1GiB` 232k → 614k
// (plain cudaMalloc 600-740k), their two-thread traces 138-257k → 214k-1.10M, `training` 1.92M
// → 3.35M; peak reserved ÷ peak live unchanged. Pinned to one CPU, where a watch used to be
// left out (a spinning watcher held the very CPU the other side needed, and the replays ran
// 3.4 times as long), a watch that yields pays too: `rmm-10k-1GiB` 390k → 760k, `training`
// 2.4M → 3.3M.
//
// Depends on the real-function table, OwnCallScope, the library's threads and the log.
#include "interpose/release_worker.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "interpose/budget.h"
#include "interpose/foreign_frees.h"
#include "interpose/hook_guard.h"
#include "interpose/log.h"
#include "interpose/own_call.h"
#include "interpose/own_api.h"
#include "interpose/threads.h"
#include "pools/lock_order.h"
#include "pools/no_cancel.h"

namespace poolcuda {

namespace {

constexpr int kRetryMillis = 20;
// How long a lane's thread with nothing to do, and a flush whose pages are not yet back, watch
// for the change they wait for before they sleep (Note [Spinning before sleeping]).
constexpr std::chrono::microseconds kSpinBeforeSleep{50};

struct Page {
  void* ptr;
  std::uint64_t ticket;
  std::uint64_t size;
  bool held_before = false;  // back in the queue after a capture held it back
};

bool in_range(int device) { return device >= 0 && device < ReleaseWorker::kMaxDevices; }

// A side of a lane that sleeps in one of its waits (or whose CPU is unknown).
constexpr int kAsleep = -1;

// How long a watcher keeps watching a side that was asleep and may be waking up (a flush's lane
// thread, a lane thread's flush): longer than such a wake takes on the build machine (about
// 12 us), far shorter than the watch.
constexpr std::chrono::microseconds kWakeGrace{20};

}  // namespace

// One device's pages and thread. Everything here is under State::mutex.
struct ReleaseLane {
  int device = -1;
  // The lane's own: a lane waiting to retry held-back pages must not be woken by every other
  // lane's free (two lanes with pages held back would spin against each other).
  std::condition_variable_any changed;
  std::deque<Page> queue;        // not yet tried
  std::deque<Page> held_back;    // a capture was open on the device, or a reset is under way
  std::uint64_t in_flight = 0;   // the ticket being freed now, or 0
  void* in_flight_ptr = nullptr;
  std::uint64_t in_flight_size = 0;
  std::uint64_t in_flight_boundary = 0;  // next_foreign_free_ticket() before its driver free
  bool resetting = false;
  int captures_beginning = 0;  // Note [Releases during capture]
  bool started = false;
  bool start_failed = false;   // said once
  bool freeing_inline = false;  // a flush frees the queue itself (no thread)
  ReleaseWorker::State* state = nullptr;
  // Bumped (under State::mutex) by every signal(): what a watcher reads without the lock.
  std::atomic<std::uint64_t> changes{0};
  // Where each side runs now, for a watcher on the other (Note [Spinning before sleeping]): the
  // CPU of the lane's thread while it is awake, and of the program thread that last queued a
  // page or flushed while that thread is awake; kAsleep while it sleeps in a flush of this lane
  // (or the lane's thread in its own waits).
  std::atomic<int> thread_cpu{kAsleep};
  std::atomic<int> client_cpu{kAsleep};
  // Threads inside a wait on `changed` now, under State::mutex like every signal().
  int sleepers = 0;

  // A page of this lane's left the library for good: the driver took it back (or refused it, or
  // its device is beyond reach: a needless retry at worst). Under State::mutex, in the step that
  // takes the page off waiting_bytes() (Note [Room that arrived meanwhile] in pooling.cpp).
  static void count_returned() {
    ReleaseWorker::returned_.fetch_add(1, std::memory_order_release);
  }

  // Wakes whoever waits for this lane: its thread, a flush, a capture's begin or a reset. Only
  // a sleeper needs the condition variable's wake (Note [Spinning before sleeping]).
  void signal() {
    changes.fetch_add(1, std::memory_order_release);
    if (sleepers > 0) changed.notify_all();
  }

  // Runs `wait`, a wait on `changed` with State::mutex held, counted among the sleepers.
  template <typename Wait>
  auto sleep(Wait&& wait) {
    ++sleepers;
    struct Awake {
      int& sleepers;
      ~Awake() { --sleepers; }
    } awake{sleepers};
    return wait();
  }

  // The smallest ticket of this lane not yet released, or `next` when none is waiting.
  std::uint64_t low_water(std::uint64_t next) const {
    std::uint64_t low = in_flight != 0 ? in_flight : next;
    for (const Page& p : queue) low = std::min(low, p.ticket);
    for (const Page& p : held_back) low = std::min(low, p.ticket);
    return low;
  }
  // Bytes of the pages in `pages`; with `fresh_only`, of those never held back.
  static std::uint64_t bytes_of(const std::deque<Page>& pages, bool fresh_only = false) {
    std::uint64_t bytes = 0;
    for (const Page& p : pages) bytes += fresh_only && p.held_before ? 0 : p.size;
    return bytes;
  }
  void retry_held_back() {
    while (!held_back.empty()) {
      queue.push_back(held_back.front());
      queue.back().held_before = true;
      held_back.pop_front();
    }
  }
};

struct ReleaseWorker::State {
  RankedMutex mutex{LockRank::device};
  std::uint64_t next_ticket = 1;
  // Made as a device gets its pools (add_lane) or at its first use, and never destroyed (Note
  // [Exit] in lifecycle.cpp): a lane's queues and condition variable each allocate when made,
  // and all 64 at once cost the first pooled allocation of a process about 300 us on the 2-core
  // build machine.
  ReleaseLane* lanes[kMaxDevices] = {};

  // The lane of a device in range (in_range(device)), made now if it was not.
  ReleaseLane& lane(int device) {
    if (lanes[device] == nullptr) {
      auto* made = new ReleaseLane;
      made->device = device;
      made->state = this;
      lanes[device] = made;
    }
    return *lanes[device];
  }
  // The lane of a device in range, or nullptr when it has none yet.
  const ReleaseLane* find_lane(int device) const { return lanes[device]; }
};

ReleaseWorker& ReleaseWorker::instance() {
  static ReleaseWorker* worker = new ReleaseWorker;  // never destroyed (Note [Exit])
  return *worker;
}

ReleaseWorker::State& ReleaseWorker::state() const {
  static State* s = new State;
  return *s;
}

void ReleaseWorker::add_lane(int device) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  s.lane(device);
}

namespace {

// Frees one page with the real cudaFree on the calling thread; false when the driver refused it
// for a stream capture (the page must wait: Note [Releases during capture]).
bool free_now(int device, const Page& page, std::uint64_t boundary) {
  OwnCallScope scope(device);
  // A device that cannot be made current: its memory is beyond our reach.
  if (!scope.ok()) return true;
  const cudaError_t result = own::cudaFree()(page.ptr);
  if (result == cudaErrorStreamCaptureUnsupported || result == cudaErrorStreamCaptureInvalidated ||
      result == cudaErrorStreamCaptureImplicit) {
    own::cudaGetLastError()();
    return false;  // the page waits, still ours
  }
  library_freed(page.ptr, boundary);  // still counted as ours (in flight) until after this
  if (result != cudaSuccess)
    log_format(LogLevel::basic, "device %d: returning a page (%p) failed: CUDA error %d", device,
               page.ptr, static_cast<int>(result));
  return true;
}

// The lane's device made current on its thread for good, so that each page's OwnCallScope finds
// it current and never switches back. A new thread's current device is 0, and cudaSetDevice
// initializes the primary context of the device it names: switching back to 0 after every page
// made a context on device 0 in a program that only ever used device 1 (each rank of a job with
// one GPU per rank would then hold memory on the first GPU, or be refused it in exclusive-process
// mode). A failure is left to free_now's scope, which then reports the device out of reach.
void adopt_device(int device) {
  InsideHook inside;  // the runtime reaches the driver through the hooks
  if (own::cudaSetDevice()(device) != cudaSuccess) own::cudaGetLastError()();
}

// Frees the lane's oldest queued page with `lock` (on State::mutex) released meanwhile, or holds
// it back while a reset runs, while a capture is beginning on the device, or when the driver
// refuses the free for a capture.
void free_front(ReleaseLane& lane, std::unique_lock<RankedMutex>& lock) {
  const Page page = lane.queue.front();
  lane.queue.pop_front();
  if (lane.resetting || lane.captures_beginning > 0) {
    lane.held_back.push_back(page);  // end_reset drops it, or capture_begun retries it
    lane.signal();                   // a flush waiting for the queue to empty
    return;
  }
  lane.in_flight = page.ticket;
  lane.in_flight_ptr = page.ptr;
  lane.in_flight_size = page.size;
  lane.in_flight_boundary = next_foreign_free_ticket();  // before the driver's free
  const std::uint64_t boundary = lane.in_flight_boundary;
  lock.unlock();
  const bool freed = free_now(lane.device, page, boundary);
  // Only now is the page's room the budget's again (Note [Budget] in budget.cpp); before the
  // lock, so that a flush that sees the page gone sees the room too, and a reset (which waits
  // for the free in flight, then forgets every charge) comes after.
  if (freed) budget::uncharge(lane.device, page.size);
  lock.lock();
  lane.in_flight = 0;
  lane.in_flight_ptr = nullptr;
  lane.in_flight_size = 0;
  if (freed)
    ReleaseLane::count_returned();
  else
    lane.held_back.push_back(page);
  lane.signal();
}

// The calling thread's CPU now (usually a read of the thread's rseq area, no system call), or
// kAsleep when unknown.
int current_cpu() {
  const int cpu = ::sched_getcpu();
  return cpu >= 0 ? cpu : kAsleep;
}

// Whether a yield of the calling thread hands its CPU to an ordinary thread: not for a
// real-time one, which keeps the CPU (Note [Spinning before sleeping]).
bool yields_to_ordinary_threads() {
  const int policy = ::sched_getscheduler(0);
  return policy == SCHED_OTHER || policy == SCHED_BATCH || policy == SCHED_IDLE;
}

// How a watcher waits for the other side of its lane (Note [Spinning before sleeping]): not at
// all (it sleeps instead), spinning while that side runs on another CPU, or yielding its CPU
// to that side.
enum class Watch { stop, spin, yield };

// One side of a lane watching the other: where it runs (kAsleep when unknown) and where it
// publishes that, and where the other side publishes its own.
struct Watcher {
  int cpu;
  std::atomic<int>& published;
  const std::atomic<int>& other;
  bool may_yield;  // yields_to_ordinary_threads()

  // How to watch now. `waking`: the other side, if asleep or on this CPU, may be waking up now
  // (or, for a flush, holds its pages: it runs as soon as it gets the CPU).
  Watch how(bool waking) const {
    const int theirs = other.load(std::memory_order_relaxed);
    if (theirs != kAsleep && cpu != kAsleep && theirs != cpu) return Watch::spin;
    if (theirs != kAsleep && cpu == kAsleep) return Watch::stop;  // where this side runs is unknown
    return waking && may_yield ? Watch::yield : Watch::stop;
  }
};

// Watches, with `lock` released, until `lane.changes` is no longer `seen`, `until` passes or
// `how()` says stop (Note [Spinning before sleeping]). A yield may move the watcher to another
// CPU: it looks again where it runs after each.
template <typename How>
void watch_changes(ReleaseLane& lane, std::uint64_t seen, std::unique_lock<RankedMutex>& lock,
                   std::chrono::steady_clock::time_point until, Watcher& self, How&& how) {
  lock.unlock();
  Watch mode = how();
  for (unsigned i = 1;
       mode != Watch::stop && lane.changes.load(std::memory_order_acquire) == seen; ++i) {
    if (mode == Watch::yield) {
      ::sched_yield();
      self.cpu = current_cpu();
      self.published.store(self.cpu, std::memory_order_relaxed);
    } else {
      cpu_relax();
    }
    if (mode == Watch::yield || i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= until) break;
      mode = how();
    }
  }
  lock.lock();
}

void* lane_main(void* arg);

// Starts the lane's thread; false (said once in the log) when it cannot be created.
bool start_lane(ReleaseLane& lane) {
  pthread_t thread;
  // Note [Library threads' CPUs] in threads.cpp. Not again after a failed start: each later
  // page retries it, perhaps under a shard's lock, and the scan reads /proc once per thread.
  cpu_set_t cpus;
  const bool cpus_read = !lane.start_failed && program_cpus(&cpus);
  if (!start_library_thread(&lane_main, &lane, &thread, cpus_read ? &cpus : nullptr)) {
    if (!lane.start_failed)
      log_format(LogLevel::basic, "cannot start the release thread of device %d; its pages are "
                 "freed when the pools wait for them", lane.device);
    lane.start_failed = true;
    return false;
  }
  lane.started = true;
  ::pthread_setname_np(thread, "poolcuda-free");
  return true;
}

void* lane_main(void* arg) {
  auto* lane = static_cast<ReleaseLane*>(arg);
  ReleaseWorker::State* s = lane->state;
  adopt_device(lane->device);
  std::unique_lock<RankedMutex> lock(s->mutex);
  // Set as each page is freed: how long the thread then watches for the next one, and for the
  // flush it woke to come back (Note [Spinning before sleeping]).
  std::chrono::steady_clock::time_point watch_until{};
  std::chrono::steady_clock::time_point grace_until{};
  Watcher self{kAsleep, lane->thread_cpu, lane->client_cpu, yields_to_ordinary_threads()};
  for (;;) {
    self.cpu = current_cpu();
    lane->thread_cpu.store(self.cpu, std::memory_order_relaxed);
    if (lane->queue.empty()) {
      // The next page comes from a program thread: worth watching for while one runs on
      // another CPU, and yielding to only while the flush this thread just woke comes back.
      // Past that, a thread that yields and never sleeps would stay on the program thread's
      // CPU: a wake lets the scheduler put it on an idle one.
      const auto how = [&] { return self.how(std::chrono::steady_clock::now() < grace_until); };
      if (lane->held_back.empty()) {
        if (std::chrono::steady_clock::now() < watch_until && how() != Watch::stop) {
          watch_changes(*lane, lane->changes.load(std::memory_order_relaxed), lock, watch_until,
                        self, how);
        } else {
          lane->thread_cpu.store(kAsleep, std::memory_order_relaxed);
          lane->sleep([&] { lane->changed.wait(lock); });
        }
      } else {
        lane->thread_cpu.store(kAsleep, std::memory_order_relaxed);
        lane->sleep(
            [&] { lane->changed.wait_for(lock, std::chrono::milliseconds(kRetryMillis)); });
        // Retry the held-back pages: a capture may have ended behind the hooks' back.
        if (!lane->resetting) lane->retry_held_back();
      }
      continue;
    }
    free_front(*lane, lock);
    const auto freed_at = std::chrono::steady_clock::now();
    watch_until = freed_at + kSpinBeforeSleep;
    grace_until = freed_at + kWakeGrace;
  }
}

}  // namespace

void ReleaseWorker::release(int device, void* ptr, std::uint64_t size) {
  State& s = state();
  if (!in_range(device)) {
    // No lane to queue it on (the registry pools no such device): never dropped, freed now.
    if (!free_now(device, Page{ptr, 0, size}, next_foreign_free_ticket()))
      log_format(LogLevel::basic, "device %d: a page (%p) kept: a capture is open", device, ptr);
    return;
  }
  std::lock_guard<RankedMutex> hold(s.mutex);
  ReleaseLane& lane = s.lane(device);
  lane.client_cpu.store(current_cpu(), std::memory_order_relaxed);
  lane.queue.push_back(Page{ptr, s.next_ticket++, size});
  // No thread (Note [Release worker]): the page waits in the queue, the next release tries
  // again, and a flush frees the queue itself meanwhile; never here, where the caller may hold a
  // shard's lock, since the free waits for the device. Not while a flush frees inline: the lane
  // has one free in flight at a time.
  if (!lane.started && !lane.freeing_inline && !start_lane(lane)) return;
  lane.signal();
}

bool ReleaseWorker::flush(int device, std::uint32_t max_microseconds) {
  if (!in_range(device)) return true;  // release() freed its pages already
  State& s = state();
  std::unique_lock<RankedMutex> lock(s.mutex);
  ReleaseLane& lane = s.lane(device);
  const std::uint64_t target = s.next_ticket;
  // Held-back pages are tried once more now (not during a reset: they stay held back until it
  // ends); once everything left comes back (a capture is still open, a reset under way), waiting
  // longer would not release it.
  if (!lane.resetting && !lane.held_back.empty()) {
    lane.retry_held_back();
    lane.signal();
  }
  NoCancel no_cancel;  // a wait inside the program's call (Note [Cancellation])
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::microseconds(max_microseconds);
  const auto done = [&] {
    return lane.low_water(target) >= target ||
           (lane.queue.empty() && lane.in_flight == 0 && !lane.held_back.empty());
  };
  // A lane whose thread could not start: the thread is tried once more, and failing that the
  // flushing thread, which holds no lock of the pools, frees the queue itself, one flusher at a
  // time (a lane has one free in flight), until its time runs out. A free once begun waits for
  // the device, as the program's own cudaFree would have. A flusher that stops at its deadline
  // leaves the rest to another whose time is not up.
  const auto queue_left = [&] {
    return !lane.started && !lane.freeing_inline && !lane.queue.empty();
  };
  Watcher self{current_cpu(), lane.client_cpu, lane.thread_cpu, false};
  lane.client_cpu.store(self.cpu, std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  const auto watch_until = std::min(now + kSpinBeforeSleep, deadline);
  // Worth watching while the lane's thread is awake (on this CPU it has the pages in hand), and
  // for a moment while it wakes from the page queued just before.
  const auto grace_until = now + kWakeGrace;
  const auto how = [&] {
    return self.how(lane.thread_cpu.load(std::memory_order_relaxed) != kAsleep ||
                    std::chrono::steady_clock::now() < grace_until);
  };
  if (!done() && !queue_left()) self.may_yield = yields_to_ordinary_threads();
  while (!done() && !queue_left() && std::chrono::steady_clock::now() < watch_until &&
         how() != Watch::stop)
    watch_changes(lane, lane.changes.load(std::memory_order_relaxed), lock, watch_until, self,
                  how);
  for (;;) {
    if (queue_left() && !start_lane(lane)) {
      lane.freeing_inline = true;
      do {  // one page at least: a flusher that lost its core past the deadline still helps
        free_front(lane, lock);
      } while (!lane.queue.empty() && std::chrono::steady_clock::now() < deadline);
      lane.freeing_inline = false;
      lane.signal();
    }
    lane.client_cpu.store(kAsleep, std::memory_order_relaxed);
    const bool woke = lane.sleep([&] {
      return lane.changed.wait_until(lock, deadline, [&] { return done() || queue_left(); });
    });
    lane.client_cpu.store(current_cpu(), std::memory_order_relaxed);
    if (!woke || done() || std::chrono::steady_clock::now() >= deadline) break;
  }
  return lane.low_water(target) >= target;
}

void ReleaseWorker::wake() {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  for (ReleaseLane* lane : s.lanes) {
    if (lane == nullptr || lane->resetting || lane->held_back.empty()) continue;
    lane->retry_held_back();
    lane->signal();
  }
}

void ReleaseWorker::capture_beginning(int device, std::uint32_t max_microseconds) {
  if (!in_range(device)) return;
  State& s = state();
  std::unique_lock<RankedMutex> lock(s.mutex);
  ReleaseLane& lane = s.lane(device);
  ++lane.captures_beginning;
  NoCancel no_cancel;  // inside the program's call (Note [Cancellation])
  lane.sleep([&] {
    return lane.changed.wait_for(lock, std::chrono::microseconds(max_microseconds),
                                 [&] { return lane.in_flight == 0; });
  });
}

void ReleaseWorker::capture_begun(int device) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  ReleaseLane& lane = s.lane(device);
  --lane.captures_beginning;
  // What was held back meanwhile is tried again.
  if (lane.captures_beginning == 0 && !lane.resetting) lane.retry_held_back();
  lane.signal();
}

void ReleaseWorker::begin_reset(int device) {
  if (!in_range(device)) return;
  State& s = state();
  std::unique_lock<RankedMutex> lock(s.mutex);
  ReleaseLane& lane = s.lane(device);
  lane.resetting = true;
  lane.queue.clear();
  lane.held_back.clear();
  NoCancel no_cancel;  // inside the program's cudaDeviceReset (Note [Cancellation])
  lane.sleep([&] { lane.changed.wait(lock, [&] { return lane.in_flight == 0; }); });
  lane.signal();
}

void ReleaseWorker::end_reset(int device) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  ReleaseLane& lane = s.lane(device);
  lane.resetting = false;
  lane.queue.clear();
  lane.held_back.clear();
  lane.signal();
}

namespace {

// Whether a lane has a page queued or held back, or one being freed (`in_flight` says which of
// those count), that `match` takes. Under the state's lock.
template <typename Lanes, typename InFlight, typename Match>
bool any_page(const Lanes& lanes, InFlight in_flight, Match match) {
  for (const ReleaseLane* lane : lanes) {
    if (lane == nullptr) continue;
    if (in_flight(*lane)) return true;
    for (const Page& p : lane->queue)
      if (match(p.ptr, p.size)) return true;
    for (const Page& p : lane->held_back)
      if (match(p.ptr, p.size)) return true;
  }
  return false;
}

}  // namespace

bool ReleaseWorker::owns(const void* ptr, std::uint64_t ticket) const {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  return any_page(
      s.lanes,
      [&](const ReleaseLane& lane) {
        return lane.in_flight_ptr == ptr && ticket < lane.in_flight_boundary;
      },
      [&](const void* page, std::uint64_t) { return page == ptr; });
}

bool ReleaseWorker::holds(const void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const auto within = [address](const void* base, std::uint64_t size) {
    const auto start = reinterpret_cast<std::uintptr_t>(base);
    return address >= start && address - start < size;
  };
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  return any_page(
      s.lanes,
      [&](const ReleaseLane& lane) {
        return lane.in_flight != 0 && within(lane.in_flight_ptr, lane.in_flight_size);
      },
      within);
}

bool ReleaseWorker::wait_while_freeing(const void* ptr, std::uint64_t ticket,
                                       WaitBound& bound) const {
  State& s = state();
  std::unique_lock<RankedMutex> hold(s.mutex);
  for (ReleaseLane* lane : s.lanes) {
    if (lane == nullptr) continue;
    const auto freeing = [&] {
      return lane->in_flight != 0 && lane->in_flight_ptr == ptr &&
             lane->in_flight_boundary <= ticket;
    };
    if (!freeing()) continue;
    NoCancel no_cancel;  // the caller's entry stays registered until its end()
    return bound.retry([&] {
      return lane->sleep(
          [&] { return lane->changed.wait_for(hold, bound.left(), [&] { return !freeing(); }); });
    });
  }
  return true;
}

namespace {

// `read(lane)` of `device`'s lane, under the state's lock; 0 when it has none.
template <typename Read>
std::uint64_t from_lane(ReleaseWorker::State& s, int device, Read read) {
  if (!in_range(device)) return 0;
  std::lock_guard<RankedMutex> hold(s.mutex);
  const ReleaseLane* lane = s.find_lane(device);
  return lane != nullptr ? read(*lane) : 0;
}

}  // namespace

std::uint64_t ReleaseWorker::waiting_bytes(int device) const {
  return from_lane(state(), device, [](const ReleaseLane& lane) {
    return lane.in_flight_size + ReleaseLane::bytes_of(lane.queue) +
           ReleaseLane::bytes_of(lane.held_back);
  });
}

std::uint64_t ReleaseWorker::queued_bytes(int device) const {
  return from_lane(state(), device, [](const ReleaseLane& lane) {
    return ReleaseLane::bytes_of(lane.queue, true);
  });
}

std::uint64_t ReleaseWorker::in_flight(int device) const {
  return from_lane(state(), device, [](const ReleaseLane& lane) { return lane.in_flight; });
}

}  // namespace poolcuda
