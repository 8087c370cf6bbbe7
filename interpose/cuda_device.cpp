// CudaDevice: pools/device.h over CUDA (see cuda_device.h).
//
// Note [Fence streams]
// A free fence must be passed only once the device has executed everything issued, on every
// stream, before the free. The legacy default stream waits for all prior work of every blocking
// stream (per-thread default streams included) before it runs anything recorded on it, so one
// event there covers all of them. Non-blocking streams do not order with it, so each live
// non-blocking stream the program created gets an event of its own. A stream destroyed with
// work pending is fine: its event was recorded before the destroy and still completes.
// Recording on the legacy stream while a blocking stream captures would invalidate that
// capture (and recording on a capturing stream would become part of the graph), so when any
// tracked stream, the legacy stream or this thread's default stream reports an open capture,
// no fence is recorded at all: the manager keeps the epoch open and tries again later.
//
// Note [Destroyed streams]
// cudaStreamDestroy returns at once and the stream's queued work runs to completion afterwards.
// A buffer that work uses may be freed after the destroy; the fence of that free records on the
// streams still in the table, which no longer include the destroyed one, and (for a
// non-blocking stream) nothing else orders after its work. So just before the real destroy the
// stream's tail is marked with an event of our own (a "tail"), and every fence recorded later
// also waits for every tail that has not completed yet. A completed tail goes back to the event
// cache; an older fence that still lists it may then see it recorded again at a later point,
// which only makes that fence pass later, never earlier. Tails are owned by the device, never
// by a fence: fence_destroy does not recycle them.
//
// Note [Releases during capture]
// cudaFree synchronizes the device, which is illegal while any capture is open on it: the call
// fails and invalidates the program's capture. The manager returns idle pages on its own
// schedule (periodic cleanup on an allocation, out-of-memory recovery), possibly while another
// thread captures. So release() checks for an open capture the way fences do (Note [Fence
// streams]) and, if there is one, keeps the address in deferred_; the deferred addresses are
// freed by the next release or allocate (the manager's growth path, before it asks the device
// for more) that finds no capture open; never on the free path, where a synchronizing cudaFree
// does not belong. The pools already count that memory as returned; the device gets it back
// once the capture is over. cudaDeviceReset frees it with everything else (forget_events).
//
// Note [Stale streams]
// A stream can vanish without passing through the cudaStreamDestroy hook: cuStreamDestroy on
// the runtime's handle, a primary-context reset, a library with its own runtime. Its entry then
// stays in the stream table, and every capture check or event record on it fails. Counting
// such a failure as "capture open" would stop the device's fences for good (its pools would
// only grow, and releases would stay deferred). So an invalid-handle answer for a tracked
// stream means the stream is gone: the check or record that got it drops the entry (under the
// table's lock) and carries on with the other streams. Its remaining work, if any, is not
// covered; nothing could record on it anyway. Other failures still count as "capture open".
//
// Note [Own calls]
// Calls made on the library's own behalf must not change what the program observes: each runs
// on this object's device (switching the thread's current device and back when they differ),
// in relaxed capture mode (a global-mode capture on another thread forbids "unsafe" calls on
// ours), and an error it leaves in the runtime's last-error slot is cleared again when the slot
// was clean before. (A slot already holding the program's error cannot be restored if one of
// our calls replaced it; our calls fail only when the device itself is failing.) When the
// device cannot be made current, ok() is false: the calls would run on the wrong device, so
// allocate answers `failed`, fence_record kNoFence, memory_info nothing and no tail is recorded.
// The program's device is set back whenever a switch was attempted (a failed cudaSetDevice may
// still have changed it, e.g. under a sticky error). Without a runtime the same calls go to the
// driver, where "the device" is the primary context (Note [Own calls without a runtime] in
// own_api.cpp).
//
// Depends on pools/device.h, own_api.h, hook_guard.h and stream_table.h.
#include "interpose/cuda_device.h"

#include "interpose/hook_guard.h"
#include "interpose/log.h"
#include "interpose/own_api.h"
#include "interpose/stream_table.h"

namespace poolcuda {

namespace {

// Note [Own calls]. The hooks' re-entry guard covers the scope: the real runtime reaches the
// driver through the driver hooks, and calls made for the pools must not enter them again.
class OwnCallScope {
 public:
  explicit OwnCallScope(int device) {
    prior_error_ = own::cudaPeekAtLastError()();
    int current = -1;
    if (own::cudaGetDevice()(&current) != cudaSuccess) {
      ok_ = false;
    } else if (current != device) {
      restore_device_ = current;
      ok_ = own::cudaSetDevice()(device) == cudaSuccess;
    }
    mode_ = cudaStreamCaptureModeRelaxed;
    mode_switched_ = own::cudaThreadExchangeStreamCaptureMode()(&mode_) == cudaSuccess;
  }
  ~OwnCallScope() {
    if (mode_switched_) own::cudaThreadExchangeStreamCaptureMode()(&mode_);
    if (restore_device_ >= 0) own::cudaSetDevice()(restore_device_);
    if (prior_error_ == cudaSuccess && own::cudaPeekAtLastError()() != cudaSuccess) {
      own::cudaGetLastError()();
    }
  }
  OwnCallScope(const OwnCallScope&) = delete;
  OwnCallScope& operator=(const OwnCallScope&) = delete;

  // False when the scope's device could not be made current.
  bool ok() const { return ok_; }

 private:
  InsideHook inside_;
  bool ok_ = true;
  cudaError_t prior_error_ = cudaSuccess;
  int restore_device_ = -1;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool mode_switched_ = false;
};

// The answers that say a stream handle no longer exists (Note [Stale streams]).
bool handle_gone(cudaError_t result) {
  return result == cudaErrorInvalidResourceHandle || result == cudaErrorContextIsDestroyed;
}

enum class CaptureState { none, open, gone };

CaptureState capture_state(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t result = own::cudaStreamIsCapturing()(stream, &status);
  if (result == cudaSuccess) {
    return status == cudaStreamCaptureStatusNone ? CaptureState::none : CaptureState::open;
  }
  // cudaErrorStreamCaptureImplicit on the legacy stream means a blocking stream captures; any
  // other failure is taken as an open capture too, except a handle that no longer exists.
  return handle_gone(result) ? CaptureState::gone : CaptureState::open;
}

bool is_capturing(cudaStream_t stream) { return capture_state(stream) == CaptureState::open; }

}  // namespace

struct CudaDevice::Fence {
  std::vector<cudaEvent_t> events;  // owned: recycled by fence_destroy
  std::vector<cudaEvent_t> tails;   // borrowed (Note [Destroyed streams])
};

CudaDevice::CudaDevice(int device, StreamTable& streams) : device_(device), streams_(streams) {
  total_bytes_ = memory_info().total_bytes;
}

// Devices live as long as the process (Note [Exit] in lifecycle.cpp); nothing to release.
CudaDevice::~CudaDevice() = default;

AllocStatus CudaDevice::allocate(std::uint64_t size, DevicePtr* out) {
  OwnCallScope scope(device_);
  if (!scope.ok()) return AllocStatus::failed;  // Note [Own calls]
  release_deferred();  // Note [Releases during capture]: memory the device may need now
  void* ptr = nullptr;
  cudaError_t result = own::cudaMalloc()(&ptr, static_cast<std::size_t>(size));
  if (result == cudaSuccess) {
    *out = reinterpret_cast<DevicePtr>(ptr);
    return AllocStatus::ok;
  }
  return result == cudaErrorMemoryAllocation ? AllocStatus::out_of_memory : AllocStatus::failed;
}

void CudaDevice::release(DevicePtr ptr, std::uint64_t) {
  OwnCallScope scope(device_);
  {
    auto table = streams_.lock();
    if (capture_open()) {  // Note [Releases during capture]
      std::lock_guard<std::mutex> hold(mutex_);
      deferred_.push_back(ptr);
      return;
    }
  }
  release_deferred();
  own::cudaFree()(reinterpret_cast<void*>(ptr));
}

// Caller holds an OwnCallScope (and neither the table's lock nor mutex_).
void CudaDevice::release_deferred() {
  std::vector<DevicePtr> ready;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    if (deferred_.empty()) return;
  }
  {
    auto table = streams_.lock();
    if (capture_open()) return;
    std::lock_guard<std::mutex> hold(mutex_);
    ready.swap(deferred_);
  }
  for (DevicePtr ptr : ready) own::cudaFree()(reinterpret_cast<void*>(ptr));
}

DeviceMemoryInfo CudaDevice::memory_info() {
  OwnCallScope scope(device_);
  if (!scope.ok()) return {};  // another device's numbers (Note [Own calls])
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (own::cudaMemGetInfo()(&free_bytes, &total_bytes) != cudaSuccess) return {};
  return {free_bytes, total_bytes};
}

cudaEvent_t CudaDevice::take_event() {
  {
    std::lock_guard<std::mutex> hold(mutex_);
    if (!events_.empty()) {
      cudaEvent_t event = events_.back();
      events_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  if (own::cudaEventCreateWithFlags()(&event, cudaEventDisableTiming) != cudaSuccess) {
    return nullptr;
  }
  return event;
}

void CudaDevice::recycle(Fence* fence) {
  std::lock_guard<std::mutex> hold(mutex_);
  events_.insert(events_.end(), fence->events.begin(), fence->events.end());
  fence->events.clear();
  fence->tails.clear();
  fences_.push_back(fence);
}

// Caller holds mutex_ and an OwnCallScope. Completed tails go back to the cache; the others are
// appended to `pending` when it is not null.
void CudaDevice::prune_tails(std::vector<cudaEvent_t>* pending) {
  std::erase_if(tails_, [&](cudaEvent_t tail) {
    if (own::cudaEventQuery()(tail) != cudaErrorNotReady) {
      events_.push_back(tail);
      return true;
    }
    if (pending != nullptr) pending->push_back(tail);
    return false;
  });
}

void CudaDevice::adopt_stream_tail(cudaStream_t stream) {
  OwnCallScope scope(device_);
  // An event of another device would poison the cache (Note [Own calls]).
  if (!scope.ok()) return;
  // A capturing stream would take the record into its graph; its capture ends with the destroy.
  // A stale handle (Note [Stale streams]) has nothing left to mark.
  if (capture_state(stream) != CaptureState::none) return;
  cudaEvent_t tail = take_event();
  if (tail == nullptr) return;
  const bool recorded = own::cudaEventRecord()(tail, stream) == cudaSuccess;
  std::lock_guard<std::mutex> hold(mutex_);
  prune_tails(nullptr);  // keeps the list as short as the work still running
  (recorded ? tails_ : events_).push_back(tail);
}

// Caller holds the stream table's lock and an OwnCallScope. Drops the stale streams it meets
// (Note [Stale streams]).
bool CudaDevice::capture_open() {
  if (is_capturing(cudaStreamLegacy) || is_capturing(cudaStreamPerThread)) return true;
  std::vector<cudaStream_t> gone;
  bool open = false;
  for (const TrackedStream& tracked : streams_.streams()) {
    if (tracked.device != device_) continue;
    const CaptureState state = capture_state(tracked.stream);
    if (state == CaptureState::gone) gone.push_back(tracked.stream);
    if (state == CaptureState::open) {
      open = true;
      break;
    }
  }
  drop_streams(gone);
  return open;
}

// Caller holds the stream table's lock.
void CudaDevice::drop_streams(const std::vector<cudaStream_t>& gone) {
  for (cudaStream_t stream : gone) {
    TrackedStream removed;
    if (streams_.remove_locked(stream, &removed)) {
      log_format(LogLevel::basic,
                 "device %d: stream %p was destroyed without cudaStreamDestroy; no longer fenced",
                 device_, static_cast<void*>(stream));
    }
  }
}

FenceHandle CudaDevice::fence_record() {
  OwnCallScope scope(device_);
  if (!scope.ok()) return kNoFence;  // Note [Own calls]
  auto table = streams_.lock();
  if (capture_open()) return kNoFence;

  Fence* fence = nullptr;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    if (!fences_.empty()) {
      fence = fences_.back();
      fences_.pop_back();
    }
  }
  if (fence == nullptr) fence = new Fence;

  auto record = [&](cudaStream_t stream) {
    cudaEvent_t event = take_event();
    if (event == nullptr) return cudaErrorMemoryAllocation;
    fence->events.push_back(event);
    return own::cudaEventRecord()(event, stream);
  };
  bool recorded = record(cudaStreamLegacy) == cudaSuccess;
  std::vector<cudaStream_t> gone;
  for (const TrackedStream& tracked : streams_.streams()) {
    if (!recorded) break;
    if (tracked.device != device_ || !tracked.non_blocking) continue;
    const cudaError_t result = record(tracked.stream);
    if (handle_gone(result)) {
      gone.push_back(tracked.stream);  // Note [Stale streams]: the unrecorded event is harmless
    } else {
      recorded = result == cudaSuccess;
    }
  }
  drop_streams(gone);
  if (!recorded) {
    recycle(fence);
    return kNoFence;
  }
  {
    std::lock_guard<std::mutex> hold(mutex_);
    if (!tails_.empty()) prune_tails(&fence->tails);  // Note [Destroyed streams]
  }
  return reinterpret_cast<FenceHandle>(fence);
}

bool CudaDevice::fence_passed(FenceHandle handle) {
  OwnCallScope scope(device_);
  auto* fence = reinterpret_cast<Fence*>(handle);
  for (const auto* list : {&fence->events, &fence->tails}) {
    for (cudaEvent_t event : *list) {
      // Any answer but "not ready" is final: an event of a failed context never completes, and
      // holding its memory forever would help no one.
      if (own::cudaEventQuery()(event) == cudaErrorNotReady) return false;
    }
  }
  return true;
}

void CudaDevice::fence_wait(FenceHandle handle) {
  OwnCallScope scope(device_);
  auto* fence = reinterpret_cast<Fence*>(handle);
  for (cudaEvent_t event : fence->events) own::cudaEventSynchronize()(event);
  for (cudaEvent_t event : fence->tails) own::cudaEventSynchronize()(event);
}

void CudaDevice::fence_destroy(FenceHandle handle) {
  // The events are kept for the next fence: recording a completed or pending event again is
  // legal, and creating events is a driver call.
  recycle(reinterpret_cast<Fence*>(handle));
}

// free_fence:sync asks this before each synchronize: a device-wide synchronize would
// invalidate an open capture, so the manager fences that free with an epoch instead.
bool CudaDevice::capture_active() {
  OwnCallScope scope(device_);
  if (!scope.ok()) return false;
  auto table = streams_.lock();
  return capture_open();
}

void CudaDevice::synchronize() {
  OwnCallScope scope(device_);
  own::cudaDeviceSynchronize()();
}

void CudaDevice::forget_events() {
  std::lock_guard<std::mutex> hold(mutex_);
  events_.clear();
  tails_.clear();
  deferred_.clear();
}

}  // namespace poolcuda
