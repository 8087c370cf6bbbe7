// CudaDevice: pools/device.h over the real CUDA runtime (see cuda_device.h).
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
// Note [Own calls]
// Calls made on the library's own behalf must not change what the program observes: each runs
// on this object's device (switching the thread's current device and back when they differ),
// in relaxed capture mode (a global-mode capture on another thread forbids "unsafe" calls on
// ours), and an error it leaves in the runtime's last-error slot is cleared again when the slot
// was clean before. (A slot already holding the program's error cannot be restored if one of
// our calls replaced it; our calls fail only when the device itself is failing.)
//
// Depends on pools/device.h, real_cuda.h and stream_table.h.
#include "interpose/cuda_device.h"

#include "interpose/real_cuda.h"
#include "interpose/stream_table.h"

namespace poolcuda {

namespace {

// Note [Own calls].
class OwnCallScope {
 public:
  explicit OwnCallScope(int device) {
    prior_error_ = real::cudaPeekAtLastError()();
    int current = -1;
    if (real::cudaGetDevice()(&current) == cudaSuccess && current != device &&
        real::cudaSetDevice()(device) == cudaSuccess) {
      restore_device_ = current;
    }
    mode_ = cudaStreamCaptureModeRelaxed;
    mode_switched_ = real::cudaThreadExchangeStreamCaptureMode()(&mode_) == cudaSuccess;
  }
  ~OwnCallScope() {
    if (mode_switched_) real::cudaThreadExchangeStreamCaptureMode()(&mode_);
    if (restore_device_ >= 0) real::cudaSetDevice()(restore_device_);
    if (prior_error_ == cudaSuccess && real::cudaPeekAtLastError()() != cudaSuccess) {
      real::cudaGetLastError()();
    }
  }
  OwnCallScope(const OwnCallScope&) = delete;
  OwnCallScope& operator=(const OwnCallScope&) = delete;

 private:
  cudaError_t prior_error_ = cudaSuccess;
  int restore_device_ = -1;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool mode_switched_ = false;
};

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t result = real::cudaStreamIsCapturing()(stream, &status);
  // cudaErrorStreamCaptureImplicit on the legacy stream means a blocking stream captures.
  return result != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

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
  release_deferred();  // Note [Releases during capture]: memory the device may need now
  void* ptr = nullptr;
  cudaError_t result = real::cudaMalloc()(&ptr, static_cast<std::size_t>(size));
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
  real::cudaFree()(reinterpret_cast<void*>(ptr));
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
  for (DevicePtr ptr : ready) real::cudaFree()(reinterpret_cast<void*>(ptr));
}

DeviceMemoryInfo CudaDevice::memory_info() {
  OwnCallScope scope(device_);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (real::cudaMemGetInfo()(&free_bytes, &total_bytes) != cudaSuccess) return {};
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
  if (real::cudaEventCreateWithFlags()(&event, cudaEventDisableTiming) != cudaSuccess) {
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
    if (real::cudaEventQuery()(tail) != cudaErrorNotReady) {
      events_.push_back(tail);
      return true;
    }
    if (pending != nullptr) pending->push_back(tail);
    return false;
  });
}

void CudaDevice::adopt_stream_tail(cudaStream_t stream) {
  OwnCallScope scope(device_);
  // A capturing stream would take the record into its graph; its capture ends with the destroy.
  if (is_capturing(stream)) return;
  cudaEvent_t tail = take_event();
  if (tail == nullptr) return;
  const bool recorded = real::cudaEventRecord()(tail, stream) == cudaSuccess;
  std::lock_guard<std::mutex> hold(mutex_);
  prune_tails(nullptr);  // keeps the list as short as the work still running
  (recorded ? tails_ : events_).push_back(tail);
}

// Caller holds the stream table's lock and an OwnCallScope.
bool CudaDevice::capture_open() {
  if (is_capturing(cudaStreamLegacy) || is_capturing(cudaStreamPerThread)) return true;
  for (const TrackedStream& tracked : streams_.streams()) {
    if (tracked.device == device_ && is_capturing(tracked.stream)) return true;
  }
  return false;
}

FenceHandle CudaDevice::fence_record() {
  OwnCallScope scope(device_);
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
    if (event == nullptr) return false;
    fence->events.push_back(event);
    return real::cudaEventRecord()(event, stream) == cudaSuccess;
  };
  bool recorded = record(cudaStreamLegacy);
  for (const TrackedStream& tracked : streams_.streams()) {
    if (!recorded) break;
    if (tracked.device == device_ && tracked.non_blocking) recorded = record(tracked.stream);
  }
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
      if (real::cudaEventQuery()(event) == cudaErrorNotReady) return false;
    }
  }
  return true;
}

void CudaDevice::fence_wait(FenceHandle handle) {
  OwnCallScope scope(device_);
  auto* fence = reinterpret_cast<Fence*>(handle);
  for (cudaEvent_t event : fence->events) real::cudaEventSynchronize()(event);
  for (cudaEvent_t event : fence->tails) real::cudaEventSynchronize()(event);
}

void CudaDevice::fence_destroy(FenceHandle handle) {
  // The events are kept for the next fence: recording a completed or pending event again is
  // legal, and creating events is a driver call.
  recycle(reinterpret_cast<Fence*>(handle));
}

void CudaDevice::synchronize() {
  OwnCallScope scope(device_);
  real::cudaDeviceSynchronize()();
}

void CudaDevice::forget_events() {
  std::lock_guard<std::mutex> hold(mutex_);
  events_.clear();
  tails_.clear();
  deferred_.clear();
}

}  // namespace poolcuda
