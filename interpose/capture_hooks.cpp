// The stream-capture hooks: cudaStreamBeginCapture, cudaStreamBeginCaptureToGraph and
// cudaStreamEndCapture (and their per-thread-default-stream variants) tell the device's capture
// policy when a window opens and closes, and a stream destroyed mid-capture closes the capture
// it began as failed. They only translate: what a window does with memory is capture/'s business
// (Note [Capture windows] in capture/capture_policy.cpp).
//
// Note [Capture begin and fences]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A fence records an event on the legacy stream, which invalidates any capture that a blocking
// stream has open on the device. So the real begin runs under the stream table's lock, the lock
// a fence holds from its check for open captures to its last record, and the device's count of
// open captures goes up before that lock is released: a begin and a fence never interleave.
// A free_fence:sync free's device-wide synchronize invalidates a capture begun while it waits,
// so it checks for open captures under the same lock, but waits without it (a parked stream can
// hold it up for as long as the program likes, and stream creation, fences and frees need the
// lock meanwhile): a begin that finds one under way lets go of the lock and waits for it, up to
// the same second it gives a page free in flight, then begins anyway.
// Before the lock, the policy primes the persistent pool (Note [Priming]) and drains the pin
// releases of graphs that are gone, so the window finds that memory free.
//
// Note [Streams that leave a capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Destroying the stream that began a capture ends the capture: nothing can end it with a graph
// any more, so its window closes as failed. A stream that only joined a capture (it waited on an
// event recorded in it) can also be destroyed while the capture is open; that does not end the
// capture, which its origin may still end with a graph whose nodes include the joined stream's
// work (or CUDA invalidates it, and its end reports the failure). So the window stays open until
// the origin's end, whatever CUDA decides, and the hooks remember which stream began each
// capture the policy has open. A capture id is unique in the process.
//
// Note [A capturing stream's device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Asking CUDA for the device of a stream that is capturing (cuStreamGetDevice, which the
// runtime's cudaStreamGetDevice calls) fails with cudaErrorStreamCaptureUnsupported and
// invalidates the capture, in every capture mode and from any thread: seen on an H200 with
// driver 580. The capture-info query is legal on a capturing stream. So stream_device() asks
// for the capture first, and for a capturing stream answers the device recorded when that
// capture began through the library (a stream that joined it has the origin's capture id);
// only a capture begun behind the library's back falls back to the current device. A stream
// that begins capturing on another thread between the two queries is the program's own race:
// it hands the stream to this call while another thread begins a capture on it.
//
// Note [Invalidated captures' ids]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Asked about an invalidated capture, CUDA answers its status but no id (0; an H200 with driver
// 580 closed no window for such a capture until the library stopped relying on the id). The
// window of an invalidated capture must still close when its stream's end reports the failure,
// or its memory stays pinned for a graph that will never exist. So a capture without an id is
// taken to be the one its stream began, which the hooks remember; an invalidated capture that
// the stream only joined is closed by its origin's end.
//
// The runtime's and the driver's entry points both come here (hooks.h): the queries below go
// through the library's own-call table, which uses the driver in a process without a runtime.
//
// Depends on the registry, the capture policy, the graph owner and the own-call table.
#include "interpose/hooks.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "interpose/graph_owner.h"
#include "interpose/own_api.h"
#include "interpose/own_call.h"
#include "interpose/registry.h"
#include "interpose/release_worker.h"
#include "interpose/stream_order.h"
#include "pools/lock_order.h"

namespace poolcuda::hooks {

namespace {

// The stream that began each open capture (Note [Streams that leave a capture]). A leaf lock:
// nothing else is taken while it is held. Open captures are few: a vector does.
class Origins {
 public:
  void add(unsigned long long id, cudaStream_t stream, int device, cudaStreamCaptureMode mode) {
    std::lock_guard<RankedMutex> hold(mutex_);
    open_.push_back(Entry{id, stream, device, std::this_thread::get_id(), mode});
    count_.store(open_.size(), std::memory_order_release);
  }
  // Note [Captures ended while they begin]: a begin of a capture on `stream` is under way, from
  // before the real call until the hooks have recorded what it began (or that it began none).
  void beginning(cudaStream_t stream) {
    std::lock_guard<RankedMutex> hold(mutex_);
    beginning_.push_back(stream);
  }
  void begun(cudaStream_t stream) {
    std::lock_guard<RankedMutex> hold(mutex_);
    const auto it = std::find(beginning_.begin(), beginning_.end(), stream);
    if (it != beginning_.end()) beginning_.erase(it);
  }
  // Waits, at most a second, until no begin on `stream` is under way.
  void await_begun(cudaStream_t stream) {
    const auto under_way = [&] {
      std::lock_guard<RankedMutex> hold(mutex_);
      return std::find(beginning_.begin(), beginning_.end(), stream) != beginning_.end();
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (under_way() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  // Whether `id` was there: of two threads closing one capture, one only removes it.
  bool remove(unsigned long long id) {
    std::lock_guard<RankedMutex> hold(mutex_);
    const bool removed = std::erase_if(open_, [&](const Entry& entry) { return entry.id == id; });
    count_.store(open_.size(), std::memory_order_release);
    return removed;
  }
  // The open capture that `stream` began (its id and device), or {0, -1}. cudaStreamPerThread
  // names another stream on each thread and device: only the calling thread's capture on it,
  // on `device`, counts.
  std::pair<unsigned long long, int> begun_by(cudaStream_t stream, int device) {
    std::lock_guard<RankedMutex> hold(mutex_);
    const std::thread::id self = std::this_thread::get_id();
    for (const Entry& entry : open_) {
      if (entry.stream == stream &&
          (stream != cudaStreamPerThread || (entry.thread == self && entry.device == device)))
        return {entry.id, entry.device};
    }
    return {0, -1};
  }
  // The captures the calling thread began on its per-thread streams, still open: (id, device).
  std::vector<std::pair<unsigned long long, int>> own_per_thread() {
    std::lock_guard<RankedMutex> hold(mutex_);
    const std::thread::id self = std::this_thread::get_id();
    std::vector<std::pair<unsigned long long, int>> found;
    for (const Entry& entry : open_) {
      if (entry.stream == cudaStreamPerThread && entry.thread == self)
        found.emplace_back(entry.id, entry.device);
    }
    return found;
  }
  // A reset of `device` ended its captures (cudaStreamEndCapture then answers an error).
  void forget_device(int device) {
    std::lock_guard<RankedMutex> hold(mutex_);
    std::erase_if(open_, [&](const Entry& entry) { return entry.device == device; });
    count_.store(open_.size(), std::memory_order_release);
  }
  bool began(unsigned long long id, cudaStream_t stream) {
    std::lock_guard<RankedMutex> hold(mutex_);
    for (const Entry& entry : open_) {
      if (entry.id == id) return entry.stream == stream;
    }
    return false;
  }
  // Whether an open capture forbids unsafe calls to the calling thread in `thread_mode` (Note
  // [Unsafe calls in a capture]).
  bool forbid_here(cudaStreamCaptureMode thread_mode) {
    if (thread_mode == cudaStreamCaptureModeRelaxed) return false;
    std::lock_guard<RankedMutex> hold(mutex_);
    const std::thread::id self = std::this_thread::get_id();
    for (const Entry& entry : open_) {
      if (entry.thread == self ? entry.mode != cudaStreamCaptureModeRelaxed
                               : thread_mode == cudaStreamCaptureModeGlobal &&
                                     entry.mode == cudaStreamCaptureModeGlobal)
        return true;
    }
    return false;
  }
  // Without the lock: a managed allocation asks on every call.
  bool any() const { return count_.load(std::memory_order_acquire) != 0; }
  // Whether a capture is open on another device than `device`.
  bool elsewhere(int device) {
    if (!any()) return false;
    std::lock_guard<RankedMutex> hold(mutex_);
    for (const Entry& entry : open_) {
      if (entry.device != device) return true;
    }
    return false;
  }
  // The device of the open capture `id`, or -1 when the library did not see it begin.
  int device(unsigned long long id) {
    std::lock_guard<RankedMutex> hold(mutex_);
    for (const Entry& entry : open_) {
      if (entry.id == id) return entry.device;
    }
    return -1;
  }

 private:
  struct Entry {
    unsigned long long id;
    cudaStream_t stream;
    int device;
    std::thread::id thread;  // the one that began it
    cudaStreamCaptureMode mode;
  };
  RankedMutex mutex_{LockRank::device};
  std::vector<Entry> open_;
  std::vector<cudaStream_t> beginning_;  // one per begin under way
  std::atomic<std::size_t> count_{0};  // open_.size()
};

Origins& origins() {
  static auto* table = new Origins;  // never destroyed: hooks may run during exit
  return *table;
}

struct OpenCapture {
  int device = -1;
  unsigned long long id = 0;
  explicit operator bool() const { return id != 0; }
};

// The handle the queries below take: with `per_thread`, 0 names the per-thread stream.
cudaStream_t normal_handle(cudaStream_t stream, bool per_thread) {
  return per_thread && stream == nullptr ? cudaStreamPerThread : stream;
}

// Clears what a failed query of the library's left in the last-error slot, when the slot was
// clean before it (an error of the program's stays).
void clear_own_error(cudaError_t before) {
  if (before == cudaSuccess) own::cudaGetLastError()();
}

int current_device_or_none() {
  const cudaError_t before = own::cudaPeekAtLastError()();
  int device = -1;
  if (own::cudaGetDevice()(&device) == cudaSuccess) return device;
  clear_own_error(before);
  return -1;
}

// The capture open on `stream` now (an empty value when none is, or the stream is gone). CUDA
// reports no id for an invalidated capture (Note [Invalidated captures' ids]).
OpenCapture open_capture(cudaStream_t stream, int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t result =
      own::cudaStreamGetCaptureInfo()(stream, &status, &id, nullptr, nullptr, nullptr, nullptr);
  if (result != cudaSuccess || status == cudaStreamCaptureStatusNone) return {};
  if (id == 0) {
    const auto [begun, begun_device] = origins().begun_by(stream, device);
    return OpenCapture{begun_device >= 0 ? begun_device : device, begun};
  }
  return OpenCapture{device, id};
}

}  // namespace

// Note [A capturing stream's device].
int stream_device(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return current_device_or_none();
  }
  RelaxedCaptureScope relaxed;  // another thread's global capture must not judge the queries
  const cudaError_t before = own::cudaPeekAtLastError()();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t asked =
      own::cudaStreamGetCaptureInfo()(stream, &status, &id, nullptr, nullptr, nullptr, nullptr);
  if (asked == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    // Note [Invalidated captures' ids]: without an id, the capture the stream began.
    // (cudaStreamPerThread returned above: no device is needed to tell captures apart here.)
    const int device = id != 0 ? origins().device(id) : origins().begun_by(stream, -1).second;
    return device >= 0 ? device : current_device_or_none();
  }
  int device = -1;
  if (asked == cudaSuccess && own::cudaStreamGetDevice()(stream, &device) == cudaSuccess) {
    return device;
  }
  // A runtime without cudaStreamGetDevice, or a handle CUDA refused: the current device's.
  clear_own_error(before);
  return current_device_or_none();
}

namespace {

void close_if_ended(const OpenCapture& capture, cudaStream_t stream, cudaGraph_t graph,
                    bool stream_gone = false);

// Note [Per-thread captures at thread exit]
// A thread's per-thread stream goes with the thread, and a capture it left open there with it
// (the stand-in ends it so; nothing can end it afterwards, nor instantiate its graph). The
// library's record of it stayed: the device's capture window never closed, so every later free
// on the device was held for a graph that could never exist, and allocation loops ran out of
// memory. So a thread that begins a capture on its per-thread stream gets a key whose
// destructor, at its exit, closes the captures it still has open there, as failed ones. The
// runtime's own thread-exit handlers may have run first and destroyed the per-thread stream
// (the stand-in's do), so from there on the library asks nothing about it: closing a capture
// may record a free fence, which asked whether the per-thread stream was capturing, and that
// query crashed inside the stand-in.
void per_thread_captures_abandoned(void*) {
  stream_order::per_thread_stream_gone();
  for (const auto& [id, device] : origins().own_per_thread())
    close_if_ended(OpenCapture{device, id}, cudaStreamPerThread, nullptr, true);
}

void watch_thread_exit() {
  static pthread_key_t key;
  static const bool keyed = ::pthread_key_create(&key, &per_thread_captures_abandoned) == 0;
  if (keyed) (void)::pthread_setspecific(key, reinterpret_cast<void*>(1));
}

}  // namespace

int begin_capture(cudaStream_t handle, bool per_thread, cudaStreamCaptureMode mode,
                  const std::function<int()>& real) {
  Registry& registry = Registry::instance();
  const cudaStream_t stream = normal_handle(handle, per_thread);
  const int device = stream_device(stream);
  if (device < 0 || registry.manager_or_create(device) == nullptr) return real();
  CapturePolicy& policy = *registry.capture(device);
  stream_order::capture_beginning(device);  // Note [Stream-ordered reuse]
  policy.drain_releases();
  policy.prime();
  int result = 0;
  OpenCapture capture;
  // Note [Captures ended while they begin]: marked from just before the real call until the end.
  struct Begun {
    cudaStream_t stream;
    bool marked = false;
    void mark() {
      origins().beginning(stream);
      marked = true;
    }
    ~Begun() {
      if (marked) origins().begun(stream);
    }
  } begun{stream};
  // Note [Releases during capture] in release_worker.cpp: a free of the device's pages that
  // began before the capture is seen to begin would invalidate it.
  constexpr std::uint32_t kFreeWaitMicros = 1000000;
  ReleaseWorker::instance().capture_beginning(device, kFreeWaitMicros);
  {
    auto table = registry.streams().lock();  // Note [Capture begin and fences]
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::microseconds(kFreeWaitMicros);
    while (registry.device(device)->synchronizing() &&
           std::chrono::steady_clock::now() < deadline) {
      table.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      table.lock();
    }
    // Note [Streams destroyed while capturing] in cuda_device.cpp.
    CudaDevice& cuda_device = *registry.device(device);
    const CudaDevice::CaptureMark mark = cuda_device.mark_capture(stream);
    begun.mark();
    result = real();
    if (result == 0) {
      capture = open_capture(stream, device);
      if (capture) cuda_device.capture_began();
    }
    cuda_device.keep_capture_mark(stream, mark, result == 0);
  }
  ReleaseWorker::instance().capture_begun(device);
  if (capture) {
    origins().add(capture.id, stream, device, mode);
    policy.begin(capture.id);
    if (stream == cudaStreamPerThread) watch_thread_exit();
  }
  return result;
}

namespace {

// Note [Captures ended while they begin]
// Another thread may end a capture, or destroy its stream, as soon as the real begin returns,
// and so before the hooks have recorded it (the policy's window, the capture's origin): that
// close found nothing open, and the capture stayed open in the library for good. The device
// counted it open, so every later free on it was held for a graph that would never come, and
// allocation loops ran out of memory where plain CUDA did not (in about one begin in a
// thousand, with a thread ending the capture as soon as it saw it). So a begin is marked under
// way on its stream from before the real call until it has recorded what it began, and a close
// that finds nothing recorded waits for any begin on that stream under way (at most a second;
// the begin waits for nothing the closer holds), then looks again, whether it waited or not (the
// begin may have finished between the two looks), and closes what it recorded, with the closer's
// graph. (Closing from the beginning thread instead, once it had recorded the capture,
// could win against an end that had made a graph, and handed the graph's memory out again.) Of
// two threads closing one capture, the one that removes its origin closes it.

// After a call that may have ended `capture` (an end, a stream destroy): when it did, the
// policy closes it, pinning its memory to `graph` when there is one. `stream_gone`: its origin
// stream was destroyed, so it ended, and asking about the dead handle would leave an error in
// the program's last-error slot.
void close_if_ended(const OpenCapture& capture, cudaStream_t stream, cudaGraph_t graph,
                    bool stream_gone) {
  if (!capture) return;
  Registry& registry = Registry::instance();
  CapturePolicy* policy = registry.capture(capture.device);
  if (policy == nullptr) return;
  // Note [Captures ended while they begin]: recorded by a begin under way (or by one that
  // finished since the first look), or begun behind our back.
  if (!policy->is_open(capture.id)) {
    origins().await_begun(stream);
    if (!policy->is_open(capture.id)) return;
  }
  if (!stream_gone && open_capture(stream, capture.device).id == capture.id) return;  // open
  if (!origins().remove(capture.id)) return;  // another thread closed it
  registry.device(capture.device)->capture_ended();
  PinSet* set = policy->end(capture.id, graph != nullptr);
  if (set != nullptr && !attach_to_graph(graph, capture.device, set)) policy->release(set);
  ReleaseWorker::instance().wake();  // pages held back by the capture may go now
}

}  // namespace

int end_capture(cudaStream_t handle, bool per_thread, cudaGraph_t* graph,
                const std::function<int()>& real) {
  const cudaStream_t stream = normal_handle(handle, per_thread);
  const OpenCapture capture = open_capture(stream, stream_device(stream));
  const int result = real();
  const bool made_graph = result == 0 && graph != nullptr && *graph != nullptr;
  close_if_ended(capture, stream, made_graph ? *graph : nullptr);
  return result;
}

void stream_destroyed_while_capturing(cudaStream_t stream, int device,
                                      unsigned long long capture_id, bool destroyed) {
  // A stream that joined the capture leaves it open (Note [Streams that leave a capture]). Its
  // begin may still be recording it (Note [Captures ended while they begin]).
  if (!origins().began(capture_id, stream)) {
    origins().await_begun(stream);
    if (!origins().began(capture_id, stream)) return;
  }
  close_if_ended(OpenCapture{device, capture_id}, stream, nullptr, destroyed);
}

// Note [Unsafe calls in a capture]
// CUDA refuses a potentially unsafe call (an allocation, a free) on a thread, and invalidates the
// captures that forbid it, when the thread's capture mode (cudaThreadExchangeStreamCaptureMode)
// is global or thread-local and the thread itself has a capture open that was not begun in
// relaxed mode, or when the thread's mode is global and another thread has a capture open that
// was begun in global mode; a thread in relaxed mode is never refused. The hooks record each
// capture's mode and thread as it begins, so the library can tell which of its answers the plain
// call would have given: the calls it makes legal in a capture (pooled allocations and frees)
// need not ask; the others (managed memory) answer as the plain call does. The thread's mode is
// read by exchanging it twice. Captures begun behind the hooks' back are not counted.
void device_captures_forgotten(int device) { origins().forget_device(device); }

cudaError_t wait_event(cudaStream_t handle, bool per_thread,
                       const std::function<cudaError_t()>& real) {
  if (!origins().any()) return real();  // no capture to join that the hooks know of
  Registry& registry = Registry::instance();
  const cudaStream_t stream = normal_handle(handle, per_thread);
  CudaDevice* device = nullptr;
  CudaDevice::CaptureMark mark;
  // The wait runs under the table's lock too (it never blocks): another thread's wait on the
  // same stream could otherwise join it to the capture between this mark's check and its
  // record, and the record would go into the program's graph.
  auto table = registry.streams().lock();
  for (const TrackedStream& tracked : registry.streams().streams()) {
    if (tracked.stream == stream) device = registry.device(tracked.device);
  }
  if (device != nullptr) mark = device->mark_capture(stream);
  if (mark.event == nullptr) {
    table.unlock();
    return real();
  }
  const cudaError_t result = real();
  device->keep_capture_mark(stream, mark, result == cudaSuccess && capturing(stream));
  return result;
}

bool any_capture_open() { return origins().any(); }

bool capture_open_elsewhere(int device) { return origins().elsewhere(device); }

bool unsafe_calls_refused_here() {
  if (!origins().any()) return false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (own::cudaThreadExchangeStreamCaptureMode()(&mode) != cudaSuccess) return false;
  cudaStreamCaptureMode back = mode;
  own::cudaThreadExchangeStreamCaptureMode()(&back);
  return origins().forbid_here(mode);
}

unsigned long long stream_capture_id(cudaStream_t stream, int* device) {
  *device = stream_device(stream);
  return open_capture(stream, *device).id;
}

}  // namespace poolcuda::hooks
