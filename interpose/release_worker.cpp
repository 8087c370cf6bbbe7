// The release worker (see release_worker.h).
//
// Note [Release worker]
// ~~~~~~~~~~~~~~~~~~~~~
// The pools return idle pages on their own schedule: a dealloc period expiring on an
// allocation, a trim, out-of-memory recovery. The real cudaFree waits for every stream of the
// device, so calling it from the allocating thread turns a cudaMalloc, which never waits on
// streams, into one that can block forever (a stream parked on a host function that this very
// thread would release after cudaMalloc returns). So pages go to this thread, which frees them
// one by one; the allocating thread returns at once. While a stream capture is open on the
// page's device the free would invalidate it (Note [Releases during capture] below), so the page
// is held back and retried when a capture ends (wake()) or, as a fallback for captures begun
// behind the hooks' back, every kRetryMillis. Out-of-memory recovery waits, bounded, for the
// queue to drain before it asks the driver again (flush()).
// The thread is created with every signal blocked, so the program's signals are never handled
// on it; it never exits (the process ends around it, its queue unreleased: the memory goes
// with the process). A forked child passes every call through and never touches it.
//
// Note [Releases during capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cudaFree synchronizes the device, which is illegal while any capture is open on it: the call
// fails and invalidates the program's capture. The pools count a held-back page as returned;
// the device gets it back once the capture is over. cudaDeviceReset frees it with everything
// else (forget_device).
//
// Depends on the real-function table, OwnCallScope, the library's threads and the log.
#include "interpose/release_worker.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "interpose/foreign_frees.h"
#include "interpose/log.h"
#include "interpose/own_call.h"
#include "interpose/own_api.h"
#include "interpose/threads.h"
#include "pools/lock_order.h"

namespace poolcuda {

namespace {

constexpr int kRetryMillis = 20;

struct Page {
  int device;
  void* ptr;
  std::uint64_t ticket;
  std::uint64_t size;
};

constexpr int kMaxDevices = 64;

}  // namespace

struct ReleaseWorker::State {
  RankedMutex mutex{LockRank::device};
  std::condition_variable_any changed;
  std::deque<Page> queue;        // not yet tried
  std::deque<Page> held_back;    // a capture was open on their device
  std::uint64_t next_ticket = 1;
  std::uint64_t in_flight = 0;   // the ticket being freed now, or 0
  int in_flight_device = -1;
  void* in_flight_ptr = nullptr;
  std::uint64_t in_flight_size = 0;
  std::uint64_t in_flight_boundary = 0;  // next_foreign_free_ticket() before its driver free
  bool resetting[kMaxDevices] = {};
  bool started = false;
  std::function<bool(int)> capture_open = [](int) { return false; };

  // The smallest ticket not yet released (everything below it went to the driver).
  std::uint64_t low_water() const {
    std::uint64_t low = in_flight != 0 ? in_flight : next_ticket;
    for (const Page& p : queue) low = std::min(low, p.ticket);
    for (const Page& p : held_back) low = std::min(low, p.ticket);
    return low;
  }
};

ReleaseWorker& ReleaseWorker::instance() {
  static ReleaseWorker* worker = new ReleaseWorker;  // never destroyed (Note [Exit])
  return *worker;
}

ReleaseWorker::State& ReleaseWorker::state() const {
  static State* s = new State;
  return *s;
}

void ReleaseWorker::set_capture_check(std::function<bool(int)> check) {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  s.capture_open = std::move(check);
}

namespace {

void* worker_main(void* arg) {
  auto* s = static_cast<ReleaseWorker::State*>(arg);
  std::unique_lock<RankedMutex> lock(s->mutex);
  for (;;) {
    if (s->queue.empty()) {
      if (s->held_back.empty()) {
        s->changed.wait(lock);
      } else {
        s->changed.wait_for(lock, std::chrono::milliseconds(kRetryMillis));
        // Retry the held-back pages: a capture may have ended behind the hooks' back.
        while (!s->held_back.empty()) {
          s->queue.push_back(s->held_back.front());
          s->held_back.pop_front();
        }
      }
      continue;
    }
    Page page = s->queue.front();
    s->queue.pop_front();
    if (page.device >= 0 && page.device < kMaxDevices && s->resetting[page.device]) {
      s->held_back.push_back(page);  // end_reset drops it
      continue;
    }
    s->in_flight = page.ticket;
    s->in_flight_device = page.device;
    s->in_flight_ptr = page.ptr;
    s->in_flight_size = page.size;
    s->in_flight_boundary = next_foreign_free_ticket();  // before the driver's free
    const std::uint64_t boundary = s->in_flight_boundary;
    const std::function<bool(int)> capture_open = s->capture_open;
    lock.unlock();
    bool freed = false;
    if (!capture_open(page.device)) {
      OwnCallScope scope(page.device);
      if (scope.ok()) {
        const cudaError_t result = own::cudaFree()(page.ptr);
        library_freed(page.ptr, boundary);  // still counted as ours (in flight) until after this
        freed = true;
        if (result != cudaSuccess)
          log_format(LogLevel::basic, "device %d: returning a page (%p) failed: CUDA error %d",
                     page.device, page.ptr, static_cast<int>(result));
      } else {
        freed = true;  // the device cannot be made current: its memory is beyond our reach
      }
    }
    lock.lock();
    s->in_flight = 0;
    s->in_flight_device = -1;
    s->in_flight_ptr = nullptr;
    s->in_flight_size = 0;
    if (!freed) s->held_back.push_back(page);
    s->changed.notify_all();
  }
}

}  // namespace

void ReleaseWorker::release(int device, void* ptr, std::uint64_t size) {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  s.queue.push_back(Page{device, ptr, s.next_ticket++, size});
  if (!s.started) {
    s.started = true;
    pthread_t thread;
    if (!start_library_thread(&worker_main, &s, &thread)) {
      // No thread: free here, as the driver would have. Only a program that cannot create a
      // thread at all gets the synchronizing free on its own thread.
      log_format(LogLevel::basic, "cannot start the release thread; pages are freed inline");
      s.started = false;
      Page page = s.queue.back();
      s.queue.pop_back();
      const std::uint64_t boundary = next_foreign_free_ticket();  // before the driver's free
      OwnCallScope scope(page.device);
      if (scope.ok()) own::cudaFree()(page.ptr);
      library_freed(page.ptr, boundary);  // the library lock is held: the page counts as ours
      return;
    }
    ::pthread_setname_np(thread, "poolcuda-free");
  }
  s.changed.notify_all();
}

bool ReleaseWorker::flush(std::uint32_t max_microseconds) {
  State& s = state();
  std::unique_lock<RankedMutex> lock(s.mutex);
  const std::uint64_t target = s.next_ticket;
  // Held-back pages are tried once more now; once everything left comes back (a capture is
  // still open, a reset under way), waiting longer would not release it.
  while (!s.held_back.empty()) {
    s.queue.push_back(s.held_back.front());
    s.held_back.pop_front();
  }
  s.changed.notify_all();
  s.changed.wait_for(lock, std::chrono::microseconds(max_microseconds), [&] {
    return s.low_water() >= target ||
           (s.queue.empty() && s.in_flight == 0 && !s.held_back.empty());
  });
  return s.low_water() >= target;
}

void ReleaseWorker::wake() {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  while (!s.held_back.empty()) {
    s.queue.push_back(s.held_back.front());
    s.held_back.pop_front();
  }
  s.changed.notify_all();
}

void ReleaseWorker::begin_reset(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  State& s = state();
  std::unique_lock<RankedMutex> lock(s.mutex);
  s.resetting[device] = true;
  std::erase_if(s.queue, [&](const Page& p) { return p.device == device; });
  std::erase_if(s.held_back, [&](const Page& p) { return p.device == device; });
  s.changed.wait(lock, [&] { return s.in_flight_device != device; });
  s.changed.notify_all();
}

void ReleaseWorker::end_reset(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  s.resetting[device] = false;
  std::erase_if(s.queue, [&](const Page& p) { return p.device == device; });
  std::erase_if(s.held_back, [&](const Page& p) { return p.device == device; });
  s.changed.notify_all();
}

bool ReleaseWorker::owns(const void* ptr, std::uint64_t ticket) const {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  if (s.in_flight_ptr == ptr && ticket < s.in_flight_boundary) return true;
  for (const Page& p : s.queue)
    if (p.ptr == ptr) return true;
  for (const Page& p : s.held_back)
    if (p.ptr == ptr) return true;
  return false;
}

std::uint64_t ReleaseWorker::waiting() const {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  return s.queue.size() + s.held_back.size();
}

std::uint64_t ReleaseWorker::waiting_bytes(int device) const {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  std::uint64_t bytes = s.in_flight_device == device ? s.in_flight_size : 0;
  for (const Page& p : s.queue) bytes += p.device == device ? p.size : 0;
  for (const Page& p : s.held_back) bytes += p.device == device ? p.size : 0;
  return bytes;
}

std::uint64_t ReleaseWorker::in_flight() const {
  State& s = state();
  std::lock_guard<RankedMutex> hold(s.mutex);
  return s.in_flight;
}

}  // namespace poolcuda
