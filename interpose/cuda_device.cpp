// CudaDevice: pools/device.h over CUDA (see cuda_device.h).
//
// Note [Fence streams]
// A free fence must be passed only once the device has executed everything issued, on every
// stream, before the free. The legacy default stream waits for all prior work of every blocking
// stream (per-thread default streams included) before it runs anything recorded on it, so one
// event there covers all of them. Non-blocking streams do not order with it, so each live
// non-blocking stream the program created gets an event of its own, unless it has nothing
// queued when the fence is recorded: then everything issued on it before the free has run, and
// whatever is issued on it later is not the old owner's (the program makes no new use of memory
// it freed). Such a stream is only asked (one query, no event to record and later query and
// recycle): a program that keeps thousands of idle streams (a stream per request slot) paid an
// event on each at every batch of frees, 40 to 76 ms a pair with 8,000 streams on the stand-in,
// against under 1 ms plain. A stream destroyed with work pending is fine: its event was recorded
// before the destroy and still completes.
// Recording on the legacy stream while a blocking stream captures would invalidate that
// capture (and recording on a capturing stream would become part of the graph), so while any
// capture is open on the device no fence of its own pools is recorded at all: the manager keeps
// the epoch open and tries again later (another device's free on one of its streams records an
// event still, unless that stream captures: Note [Frees on another device's stream]). The
// capture hooks count the captures they see begin and end, and a begin happens under the
// stream table's lock, which a fence holds from its check to its last record: a capture that
// begins on another thread can never fall between the two. Captures begun behind the hooks'
// back are found by asking the legacy stream, this thread's default stream and every tracked
// stream.
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
// Note [Streams destroyed while capturing]
// A stream that is capturing takes no record of ours (it would go into the graph), so a stream
// destroyed while it captures (the destroy ends its capture as failed, or leaves the capture it
// joined to its origin) left no tail, and its work queued before the capture still runs after
// the destroy. The memory that work used, freed after the destroy or inside the capture (legal
// in relaxed mode; such a free waits in the open epoch until the capture ends), went to a new
// owner behind no fence of that work: the old owner's late write landed in the new owner's
// buffer. So the hooks mark a tracked stream with an event of ours just before it begins a
// capture (under the stream table's lock, as the begin runs) and just before it waits on an
// event while a capture is open (the wait may join it to that capture: the mark is kept only if
// it did). The mark covers everything queued before the capture; what is queued during it is
// captured, never run. A destroy while the stream captures adopts the mark as the stream's
// tail. A stream keeps its latest mark until its next one or its destroy; a mark that completed
// covers nothing any more and goes back to the event cache at the next look. Not covered: a
// capture begun, or joined, behind the hooks' back (the driver's cuStreamWaitEvent included).
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
// Note [Frees on another device's stream]
// cudaFreeAsync(ptr, s) may name a stream of another device than ptr's: a device-1 stream that
// wrote device-0 memory through peer access frees it where it used it. Only s orders the free
// (Note [Stream-ordered frees] in pools/memory_manager.cpp), and no fence of device 0's streams
// waits for s. So such a free's fence is an event of s's device recorded on s: the fence of
// device 0's pools holds it beside its own events (as a borrowed peer event, given back to its
// device's cache when the fence goes, unless that device was reset meanwhile). The stream is
// named as the program named it, with its own device current: a tracked stream is found in the
// table with its device, and the legacy and per-thread handles, which mean the current device's
// streams, travel as a token that carries that device (other_device_stream()). Nothing else
// stands in for that event (device 0's batch records none on device 1), so it is recorded
// whenever the stream itself does not capture, a capture on device 1 open or not, and past the
// pools' limit of frees fenced on streams of their own.
//
// Depends on pools/device.h, real_cuda.h and stream_table.h.
#include "interpose/cuda_device.h"

#include <algorithm>
#include <optional>

#include "interpose/budget.h"
#include "interpose/log.h"
#include "interpose/own_call.h"
#include "interpose/real_cuda.h"
#include "interpose/real_driver.h"
#include "interpose/registry.h"
#include "interpose/release_worker.h"
#include "interpose/stream_order.h"
#include "interpose/stream_table.h"
#include "pools/no_cancel.h"

namespace poolcuda {

namespace {

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
  std::vector<PeerEvent> peers;     // other devices' (Note [Frees on another device's stream])
  std::uint64_t generation = 0;     // the device's generation when its events were taken
};

namespace {

// Note [Frees on another device's stream]: the legacy (1) or per-thread (2) handle of `device`.
// Bit 62 is set in no user-space address, bit 63 marks the lanes of tracked streams.
constexpr StreamToken kOtherDeviceStream = StreamToken{1} << 62;

bool names_other_device_stream(StreamToken token) {
  return (token & (StreamToken{3} << 62)) == kOtherDeviceStream;
}

}  // namespace

CudaDevice::CudaDevice(int device, StreamTable& streams) : device_(device), streams_(streams) {
  total_bytes_ = memory_info().total_bytes;
}

// Devices live as long as the process (Note [Exit] in lifecycle.cpp); nothing to release.
CudaDevice::~CudaDevice() = default;

AllocStatus CudaDevice::allocate(std::uint64_t size, DevicePtr* out) {
  return allocate_charged(size, out, &budget::charge);
}

AllocStatus CudaDevice::allocate_if_room(std::uint64_t size, DevicePtr* out) {
  return allocate_charged(size, out, &budget::charge_if_room);
}

AllocStatus CudaDevice::allocate_charged(std::uint64_t size, DevicePtr* out,
                                         bool (*charge)(int, std::uint64_t)) {
  OwnCallScope scope(device_);
  if (!scope.ok()) return AllocStatus::failed;  // Note [Own calls]
  // Over the budget looks like a full device: the pools trim and retry (Note [Budget]).
  if (!charge(device_, size)) return AllocStatus::out_of_memory;
  budget::ChargeScope charged(device_, size);
  void* ptr = nullptr;
  // Never through the runtime's last-error slot (Note [Quiet growth] in own_api.cpp).
  cudaError_t result = own::quiet_malloc(&ptr, static_cast<std::size_t>(size));
  if (result == cudaSuccess) {
    charged.keep();
    budget::count_growth(device_, size);
    *out = reinterpret_cast<DevicePtr>(ptr);
    return AllocStatus::ok;
  }
  return result == cudaErrorMemoryAllocation ? AllocStatus::out_of_memory : AllocStatus::failed;
}

// Pages go to the release worker: the driver's free synchronizes the device and must never run
// on an allocating thread (Note [Release worker] in release_worker.cpp). The page stays charged
// to the budget until that free returns (Note [Budget] in budget.cpp).
void CudaDevice::release(DevicePtr ptr, std::uint64_t size) {
  ReleaseWorker::instance().release(device_, reinterpret_cast<void*>(ptr), size);
}

std::uint64_t CudaDevice::releasing_bytes() {
  return ReleaseWorker::instance().waiting_bytes(device_);
}

std::uint64_t CudaDevice::growth_room() {
  return budget::room(device_).value_or(kNoGrowthLimit);
}

std::uint64_t CudaDevice::release_in_flight() {
  return ReleaseWorker::instance().in_flight(device_);
}

bool CudaDevice::flush_releases(std::uint32_t max_microseconds) {
  return ReleaseWorker::instance().flush(device_, max_microseconds);
}

DeviceMemoryInfo CudaDevice::driver_memory_info() {
  OwnCallScope scope(device_);
  if (!scope.ok()) return {};  // another device's numbers (Note [Own calls])
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (own::cudaMemGetInfo()(&free_bytes, &total_bytes) != cudaSuccess) return {};
  device_bytes_.store(total_bytes, std::memory_order_relaxed);
  return {free_bytes, total_bytes};
}

DeviceMemoryInfo CudaDevice::memory_info() {
  const DeviceMemoryInfo driver = driver_memory_info();
  if (driver.total_bytes == 0) return {};
  std::size_t free_bytes = driver.free_bytes;
  std::size_t total_bytes = driver.total_bytes;
  // Under a budget the device is, to the pools, as large as the budget: everything they scale
  // with its size (the layout, the padding budgets, the thread caches' bound) scales with the
  // budget, and what is free is what the budget has left.
  if (const std::optional<std::uint64_t> limit = budget::limit(device_)) {
    total_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(total_bytes, *limit));
    free_bytes = static_cast<std::size_t>(
        std::min<std::uint64_t>(free_bytes, budget::room(device_).value_or(*limit)));
  }
  return {free_bytes, total_bytes};
}

cudaEvent_t CudaDevice::take_event() {
  {
    std::lock_guard<RankedMutex> hold(mutex_);
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

CudaDevice::Fence* CudaDevice::new_fence() {
  Fence* fence = nullptr;
  std::uint64_t generation = 0;
  {
    std::lock_guard<RankedMutex> hold(mutex_);
    generation = generation_;
    if (!fences_.empty()) {
      fence = fences_.back();
      fences_.pop_back();
    }
  }
  if (fence == nullptr) fence = new Fence;
  fence->generation = generation;
  return fence;
}

void CudaDevice::recycle(Fence* fence) {
  for (const PeerEvent& peer : fence->peers) peer.owner->return_peer_event(peer);
  fence->peers.clear();
  std::lock_guard<RankedMutex> hold(mutex_);
  // Events from before a device reset are dead: never reuse them (forget_events).
  if (fence->generation == generation_)
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

// Caller holds mutex_: the stream's mark, taken out of the list, or null.
cudaEvent_t CudaDevice::take_capture_mark(cudaStream_t stream) {
  for (auto it = capture_marks_.begin(); it != capture_marks_.end(); ++it) {
    if (it->first != stream) continue;
    const cudaEvent_t mark = it->second;
    capture_marks_.erase(it);
    return mark;
  }
  return nullptr;
}

CudaDevice::CaptureMark CudaDevice::mark_capture(cudaStream_t stream) {
  const auto& tracked = streams_.streams();
  if (std::none_of(tracked.begin(), tracked.end(), [&](const TrackedStream& t) {
        return t.stream == stream && t.device == device_;
      })) {
    return {};
  }
  OwnCallScope scope(device_);
  if (!scope.ok() || capture_state(stream) != CaptureState::none) return {};
  CaptureMark mark;
  {
    std::lock_guard<RankedMutex> hold(mutex_);
    mark.generation = generation_;
  }
  mark.event = take_event();
  if (mark.event == nullptr) return {};
  if (own::cudaEventRecord()(mark.event, stream) != cudaSuccess) {
    keep_capture_mark(stream, mark, false);
    return {};
  }
  return mark;
}

void CudaDevice::keep_capture_mark(cudaStream_t stream, const CaptureMark& mark, bool captured) {
  if (mark.event == nullptr) return;
  OwnCallScope scope(device_);
  std::lock_guard<RankedMutex> hold(mutex_);
  if (mark.generation != generation_) return;  // reset meanwhile: the event is dead
  if (!captured) {
    events_.push_back(mark.event);
    return;
  }
  if (const cudaEvent_t older = take_capture_mark(stream)) events_.push_back(older);
  // The marks whose work is done cover nothing any more.
  if (scope.ok()) {
    std::erase_if(capture_marks_, [&](const std::pair<cudaStream_t, cudaEvent_t>& held) {
      if (own::cudaEventQuery()(held.second) == cudaErrorNotReady) return false;
      events_.push_back(held.second);
      return true;
    });
  }
  capture_marks_.emplace_back(stream, mark.event);
}

void CudaDevice::adopt_stream_tail(cudaStream_t stream) {
  OwnCallScope scope(device_);
  // An event of another device would poison the cache (Note [Own calls]).
  if (!scope.ok()) return;
  // A capturing stream would take the record into its graph; its capture ends with the destroy.
  // Its mark from before the capture is its tail (Note [Streams destroyed while capturing]). A
  // stale handle (Note [Stale streams]) has nothing left to mark.
  if (capture_state(stream) != CaptureState::none) {
    std::lock_guard<RankedMutex> hold(mutex_);
    if (const cudaEvent_t mark = take_capture_mark(stream)) {
      prune_tails(nullptr);
      tails_.push_back(mark);
    }
    return;
  }
  std::uint64_t generation = 0;
  {
    std::lock_guard<RankedMutex> hold(mutex_);
    generation = generation_;
    if (const cudaEvent_t mark = take_capture_mark(stream)) events_.push_back(mark);
  }
  cudaEvent_t tail = take_event();
  if (tail == nullptr) return;
  const bool recorded = own::cudaEventRecord()(tail, stream) == cudaSuccess;
  std::lock_guard<RankedMutex> hold(mutex_);
  if (generation != generation_) return;  // reset meanwhile: the event is dead
  prune_tails(nullptr);  // keeps the list as short as the work still running
  (recorded ? tails_ : events_).push_back(tail);
}

// Caller holds the stream table's lock and an OwnCallScope. Drops the stale streams it meets
// (Note [Stale streams]).
bool CudaDevice::capture_open() {
  if (hooked_captures_.load(std::memory_order_acquire) > 0) return true;
  if (is_capturing(cudaStreamLegacy)) return true;
  // A capture on this thread's per-thread stream begun through the hooks is counted above;
  // behind their back, only on a stream this thread was seen using.
  if (stream_order::per_thread_stream_seen() && is_capturing(cudaStreamPerThread)) return true;
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

  Fence* fence = new_fence();
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
    // Nothing queued: nothing an earlier owner issued is left there (Note [Fence streams]).
    const cudaError_t idle = own::cudaStreamQuery()(tracked.stream);
    if (idle == cudaSuccess) continue;
    const cudaError_t result = handle_gone(idle) ? idle : record(tracked.stream);
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
    std::lock_guard<RankedMutex> hold(mutex_);
    if (!tails_.empty()) prune_tails(&fence->tails);  // Note [Destroyed streams]
  }
  return reinterpret_cast<FenceHandle>(fence);
}

Device::StreamPlace CudaDevice::stream_place(StreamToken token) {
  if (names_other_device_stream(token))
    return static_cast<int>((token & ~kOtherDeviceStream) >> 2) == device_
               ? StreamPlace::this_device
               : StreamPlace::other_device;
  const auto stream = reinterpret_cast<cudaStream_t>(token);
  if (stream == cudaStreamLegacy || stream == cudaStreamPerThread) return StreamPlace::this_device;
  auto table = streams_.lock();
  for (const TrackedStream& candidate : streams_.streams())
    if (candidate.stream == stream)
      return candidate.device == device_ ? StreamPlace::this_device : StreamPlace::other_device;
  return StreamPlace::unknown;
}

CudaDevice::PeerEvent CudaDevice::record_if_other_device(StreamToken token) {
  auto stream = reinterpret_cast<cudaStream_t>(token);
  int stream_device = device_;
  if (names_other_device_stream(token)) {
    stream_device = static_cast<int>((token & ~kOtherDeviceStream) >> 2);
    stream = (token & 3) == 1 ? cudaStreamLegacy : cudaStreamPerThread;
  }
  // The table stays locked while the event is recorded: a stream it holds is not destroyed
  // meanwhile (as in fence_record_on).
  auto table = streams_.lock();
  if (stream != cudaStreamLegacy && stream != cudaStreamPerThread) {
    const TrackedStream* tracked = nullptr;
    for (const TrackedStream& candidate : streams_.streams())
      if (candidate.stream == stream) tracked = &candidate;
    if (tracked == nullptr) {
      // Not under the table's lock: what follows makes driver calls and takes the device's
      // locks.
      table.unlock();
      return record_on_unknown_stream(stream);
    }
    stream_device = tracked->device;
  }
  if (stream_device == device_) return {};
  CudaDevice* other = Registry::instance().device(stream_device);
  return other == nullptr ? PeerEvent{} : other->record_for_peer(stream);
}

StreamToken CudaDevice::other_device_stream(int device, StreamToken stream) {
  const auto handle = reinterpret_cast<cudaStream_t>(stream);
  if (handle != cudaStreamLegacy && handle != cudaStreamPerThread) return stream;
  return kOtherDeviceStream | (static_cast<StreamToken>(device) << 2) |
         (handle == cudaStreamLegacy ? 1 : 2);
}

CudaDevice::PeerEvent CudaDevice::record_for_peer(cudaStream_t stream) {
  OwnCallScope scope(device_);
  if (!scope.ok()) return {};
  // Only the stream is asked, even while a capture the hooks saw is open here: the free has no
  // other fence (the fallback, the memory's own device's events, never waits for this stream).
  // An event on a stream that does not capture changes no other stream's capture (the legacy
  // stream answers "capturing" while a blocking stream does).
  if (is_capturing(stream)) return {};
  PeerEvent peer{this, nullptr, 0};
  {
    std::lock_guard<RankedMutex> hold(mutex_);
    peer.generation = generation_;
  }
  peer.event = take_event();
  if (peer.event == nullptr) return {};
  if (own::cudaEventRecord()(peer.event, stream) != cudaSuccess) {
    return_peer_event(peer);
    return {};
  }
  return peer;
}

// Note [Frees on streams the library never saw]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A managed slab's fence records on the streams the stream table holds, and a stream made in a
// context of cuCtxCreate (or behind the library's back) is not among them. Device pages belong
// to the primary context, but managed memory is valid in every context, so such a stream may
// use a slab allocation: a stream-ordered free of one on that stream went back to its slab at
// once, and the slab handed the bytes to a new allocation while the stream still wrote them (a
// memset queued behind a host function landed in the new owner's buffer, where the plain run's
// free waited for it). So the free waits, as for another device's stream, for an event of this
// device that follows the stream:
// - an event and the stream it is recorded on must share a context, so a first event is made in
//   the stream's own (cuStreamGetCtx), with the driver's calls, and recorded there;
// - a stream of the library's own in this device's primary context (the relay, never seen by
//   the program) waits for it, which CUDA allows across contexts, and that first event is
//   destroyed at once (CUDA releases it once it completes);
// - the free holds a pooled event of this device recorded on the relay.
// So no event of another context outlives the free's call: none is queried while another
// thread destroys it, nor after the program destroyed its context. The calls run in relaxed
// capture mode, as every own call does (Note [Own calls]). Where the stream captures, or no
// event can be recorded, the memory stays allocated (`keep`): it is never reused while the
// stream may still use it, and a synchronize, which could wait for a host function waiting for
// this very thread, is never made.
CudaDevice::PeerEvent CudaDevice::record_on_unknown_stream(cudaStream_t stream) {
  PeerEvent keep;
  keep.keep = true;
  const CUstream handle = stream;  // the runtime's handle is the driver's
  CUevent first = nullptr;
  {
    RelaxedCaptureScope relaxed;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    CUcontext context = nullptr;
    if (real_driver::cuStreamIsCapturing()(handle, &capture) != CUDA_SUCCESS ||
        capture != CU_STREAM_CAPTURE_STATUS_NONE ||
        real_driver::cuStreamGetCtx()(handle, &context) != CUDA_SUCCESS || context == nullptr ||
        real_driver::cuCtxPushCurrent_v2()(context) != CUDA_SUCCESS)
      return keep;
    if (real_driver::cuEventCreate()(&first, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
        real_driver::cuEventRecord()(first, handle) != CUDA_SUCCESS) {
      real_driver::cuEventDestroy_v2()(first);
      first = nullptr;
    }
    CUcontext popped = nullptr;
    real_driver::cuCtxPopCurrent_v2()(&popped);
  }
  if (first == nullptr) return keep;
  PeerEvent relayed;
  {
    OwnCallScope scope(device_);
    std::lock_guard<std::mutex> hold(relay_mutex_);
    std::uint64_t generation = 0;
    {
      std::lock_guard<RankedMutex> caches(mutex_);
      generation = generation_;
    }
    if (scope.ok() && (relay_ == nullptr || relay_generation_ != generation)) {
      // A relay from before a reset went with it.
      CUstream made = nullptr;
      relay_ = real_driver::cuStreamCreate()(&made, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS
                   ? made
                   : nullptr;
      relay_generation_ = generation;
    }
    if (scope.ok() && relay_ != nullptr &&
        real_driver::cuStreamWaitEvent()(relay_, first, 0) == CUDA_SUCCESS)
      relayed = record_for_peer(relay_);
  }
  real_driver::cuEventDestroy_v2()(first);
  return relayed.event != nullptr ? relayed : keep;
}

// An event is asked, and waited for, with its own device current.
bool CudaDevice::peer_event_passed(const PeerEvent& peer) {
  {
    // An event from before a reset: the reset waited for the work it followed.
    std::lock_guard<RankedMutex> hold(mutex_);
    if (peer.generation != generation_) return true;
  }
  OwnCallScope scope(device_);
  return !scope.ok() || own::cudaEventQuery()(peer.event) != cudaErrorNotReady;
}

void CudaDevice::peer_event_wait(const PeerEvent& peer) {
  OwnCallScope scope(device_);
  if (scope.ok()) own::cudaEventSynchronize()(peer.event);
}

void CudaDevice::return_peer_event(const PeerEvent& peer) {
  std::lock_guard<RankedMutex> hold(mutex_);
  // An event from before a reset is dead (forget_events).
  if (peer.generation == generation_) events_.push_back(peer.event);
}

FenceHandle CudaDevice::fence_record_on(StreamToken token, StreamToken& lane) {
  auto stream = reinterpret_cast<cudaStream_t>(token);
  int stream_device = device_;
  lane = token;
  if (names_other_device_stream(token)) {
    stream_device = static_cast<int>((token & ~kOtherDeviceStream) >> 2);
    stream = (token & 3) == 1 ? cudaStreamLegacy : cudaStreamPerThread;
  }
  OwnCallScope scope(device_);
  if (!scope.ok()) return kNoFence;  // Note [Own calls]
  auto table = streams_.lock();
  if (stream != cudaStreamLegacy && stream != cudaStreamPerThread) {
    bool known = false;
    for (const TrackedStream& tracked : streams_.streams()) {
      if (tracked.stream == stream) {
        known = true;
        stream_device = tracked.device;
        // The stream's creation, not its handle, which a later stream may be given: the top bit
        // keeps it apart from the two fixed handles (no user-space address has it).
        lane = tracked.serial | (StreamToken{1} << 63);
        break;
      }
    }
    if (!known) return kNoFence;
  }
  if (stream_device != device_) {
    // Note [Frees on another device's stream]
    CudaDevice* other = Registry::instance().device(stream_device);
    if (other == nullptr) return kNoFence;
    const PeerEvent peer = other->record_for_peer(stream);
    if (peer.event == nullptr) return kNoFence;
    Fence* fence = new_fence();
    fence->peers.push_back(peer);
    return reinterpret_cast<FenceHandle>(fence);
  }
  // An event on a stream that does not capture changes no other stream's capture (the legacy
  // stream answers "capturing" while a blocking stream does), so only this stream is asked;
  // captures begun through the hooks count as before, without a query.
  if (hooked_capture_open() || is_capturing(stream)) return kNoFence;
  Fence* fence = new_fence();
  cudaEvent_t event = take_event();
  if (event != nullptr) fence->events.push_back(event);
  if (event == nullptr || own::cudaEventRecord()(event, stream) != cudaSuccess) {
    recycle(fence);
    return kNoFence;
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
  for (const PeerEvent& peer : fence->peers)
    if (!peer.owner->peer_event_passed(peer)) return false;
  return true;
}

void CudaDevice::fence_wait(FenceHandle handle) {
  NoCancel no_cancel;  // a wait plain CUDA's call would not make (Note [Cancellation])
  OwnCallScope scope(device_);
  auto* fence = reinterpret_cast<Fence*>(handle);
  for (cudaEvent_t event : fence->events) own::cudaEventSynchronize()(event);
  for (cudaEvent_t event : fence->tails) own::cudaEventSynchronize()(event);
  for (const PeerEvent& peer : fence->peers) peer.owner->peer_event_wait(peer);
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

// Note [Room for what the pools do not serve] in pooling.cpp. Not while a capture is open: a
// trim records fences, which a capture must never see.
bool CudaDevice::give_back_elsewhere(WaitBound& bound) {
  Registry& registry = Registry::instance();
  const CapturePolicy* capture = registry.capture(device_);
  return (capture == nullptr || !capture->open()) && registry.trim_managed(device_, bound);
}

bool CudaDevice::synchronize() {
  NoCancel no_cancel;  // Note [Cancellation]
  OwnCallScope scope(device_);
  if (!scope.ok()) return false;  // Note [Own calls]
  // Checked under the stream table's lock, as a fence is (Note [Capture begin and fences] in
  // capture_hooks.cpp): a capture begun since the caller asked capture_active() would be
  // invalidated by the synchronize, in every capture mode. The wait itself runs without the
  // lock (it may last as long as a parked stream), and a begin meanwhile waits for it.
  {
    auto table = streams_.lock();
    if (capture_open()) return false;
    syncs_in_flight_.fetch_add(1, std::memory_order_acq_rel);
  }
  const bool synchronized = own::cudaDeviceSynchronize()() == cudaSuccess;
  syncs_in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  return synchronized;
}

void CudaDevice::forget_events() {
  std::lock_guard<RankedMutex> hold(mutex_);
  events_.clear();
  tails_.clear();
  capture_marks_.clear();
  ++generation_;
}

}  // namespace poolcuda
