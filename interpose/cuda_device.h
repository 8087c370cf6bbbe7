// CudaDevice: the Device interface (pools/device.h) implemented over CUDA for one device index:
// the real runtime, or the driver in a process without one (own_api.h). It makes every call on
// the right device (switching the calling thread's current device for the call's duration when
// needed), in relaxed capture mode, and without disturbing the program's last-error state, and
// it implements free fences as CUDA events
// (Note [Fence streams] in cuda_device.cpp).
//
// Depends on pools/device.h, the own-call table and the stream table; never on a
// MemoryManager (the Device contract forbids calling back into it).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "pools/device.h"
#include "pools/lock_order.h"

namespace poolcuda {

class StreamTable;

class CudaDevice final : public Device {
 public:
  static constexpr std::uint64_t kAlignment = 512;

  // Queries the device's memory size (on the calling thread, making `device` current if
  // needed). `streams` must outlive the device.
  CudaDevice(int device, StreamTable& streams);
  ~CudaDevice() override;

  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override;
  AllocStatus allocate_if_room(std::uint64_t size, DevicePtr* out) override;
  void release(DevicePtr ptr, std::uint64_t size) override;
  bool flush_releases(std::uint32_t max_microseconds) override;
  std::uint64_t releasing_bytes() override;
  std::uint64_t release_in_flight() override;
  std::uint64_t growth_room() override;  // what the device's budget has left
  DeviceMemoryInfo memory_info() override;
  // The driver's own figures, a budget's limit not applied: zeros when they cannot be read.
  DeviceMemoryInfo driver_memory_info();
  std::uint64_t alignment() const override { return kAlignment; }
  FenceHandle fence_record() override;
  // On cudaStreamLegacy, cudaStreamPerThread (both this device's), a stream the table holds
  // (of this device or another: Note [Frees on another device's stream] in cuda_device.cpp), or
  // another device's legacy or per-thread stream named by other_device_stream(); kNoFence for
  // any other.
  FenceHandle fence_record_on(StreamToken stream, StreamToken& lane) override;
  bool fence_passed(FenceHandle fence) override;
  void fence_wait(FenceHandle fence) override;
  void fence_destroy(FenceHandle fence) override;
  bool synchronize() override;
  bool capture_active() override;
  StreamPlace stream_place(StreamToken stream) override;
  bool give_back_elsewhere(WaitBound& bound) override;  // the device's empty managed slabs

  // A tracked stream of this device is about to be destroyed: its queued work still runs after
  // cudaStreamDestroy returns, so every fence recorded from now on also waits for it (Note
  // [Destroyed streams] in cuda_device.cpp). Caller holds the stream table's lock.
  void adopt_stream_tail(cudaStream_t stream);

  // The work queued so far on a tracked stream of this device that is about to begin or join a
  // capture, marked with an event of the library's (Note [Streams destroyed while capturing] in
  // cuda_device.cpp); empty when the stream is not tracked, captures already, or no event could
  // be recorded. Caller holds the stream table's lock. keep_capture_mark() keeps it for the
  // stream when the capture began or the stream joined one (`captured`), and recycles it
  // otherwise.
  struct CaptureMark {
    cudaEvent_t event = nullptr;
    std::uint64_t generation = 0;
  };
  CaptureMark mark_capture(cudaStream_t stream);
  void keep_capture_mark(cudaStream_t stream, const CaptureMark& mark, bool captured);

  // A stream capture began (ended) on this device through the hooks (interpose/capture_hooks.cpp).
  // began() is called with the stream table's lock held, right after the real begin: a fence is
  // recorded under the same lock, so the two exclude each other (Note [Fence streams]).
  void capture_began() { hooked_captures_.fetch_add(1, std::memory_order_acq_rel); }
  // Never below zero: a close that raced a reset's forget must not hide the next capture.
  void capture_ended() {
    int open = hooked_captures_.load(std::memory_order_acquire);
    while (open > 0 &&
           !hooked_captures_.compare_exchange_weak(open, open - 1, std::memory_order_acq_rel)) {
    }
  }
  // Whether a capture begun through the hooks is open on this device.
  bool hooked_capture_open() const { return hooked_captures_.load(std::memory_order_acquire) > 0; }
  // cudaDeviceReset ended every capture of the device.
  void captures_forgotten() { hooked_captures_.store(0, std::memory_order_release); }
  // Whether a synchronize() is under way: a capture's begin waits for it (Note [Capture begin
  // and fences] in capture_hooks.cpp).
  bool synchronizing() const { return syncs_in_flight_.load(std::memory_order_acquire) > 0; }

  // cudaDeviceReset destroyed every event of the device: drop the cached events, and make sure
  // no event created or recorded before the reset is ever used again (a fence that comes back
  // from before the reset is dropped, not recycled).
  void forget_events();

  // How a stream-ordered free on `stream`, named while `device` was current, reaches the fences
  // of another device's pools: a stream the table holds stands for itself; the legacy and
  // per-thread handles, which mean the current device's streams, get a token of their own.
  static StreamToken other_device_stream(int device, StreamToken stream);

  // For another device's fence: an event of this device recorded on `stream`, one of this
  // device's streams; `event` is null when none could be recorded (the stream captures, the
  // stream is gone). Each event goes back through return_peer_event.
  struct PeerEvent {
    CudaDevice* owner = nullptr;
    cudaEvent_t event = nullptr;
    std::uint64_t generation = 0;  // the owner's, when the event was taken
    // No event: the free's memory must stay allocated, since nothing can tell when the stream
    // is past it (Note [Frees on streams the library never saw]).
    bool keep = false;
  };
  PeerEvent record_for_peer(cudaStream_t stream);
  // For a stream-ordered free of memory this device's own fences cover only for its own
  // streams (a managed slab's, Note [Managed frees on another device's stream] in pooling.cpp):
  // an event on `stream` (a token as for fence_record_on) when that is another device's stream,
  // or one that follows a stream the table does not know (Note [Frees on streams the library
  // never saw]); empty for this device's streams, or when none can be recorded (with `keep` set
  // for an unknown stream).
  PeerEvent record_if_other_device(StreamToken stream);
  bool peer_event_passed(const PeerEvent& peer);
  void peer_event_wait(const PeerEvent& peer);
  void return_peer_event(const PeerEvent& peer);

  int index() const { return device_; }
  std::uint64_t total_bytes() const { return total_bytes_; }  // under a budget, at most its limit
  // The device's own memory size, whatever the budget (0 until it was read).
  std::uint64_t device_bytes() const { return device_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Fence;

  // allocate() with the budget's charge of the caller's choice.
  AllocStatus allocate_charged(std::uint64_t size, DevicePtr* out,
                               bool (*charge)(int, std::uint64_t));

  cudaEvent_t take_event();
  // record_if_other_device() for a stream the table does not hold.
  PeerEvent record_on_unknown_stream(cudaStream_t stream);
  Fence* new_fence();  // a recycled or new record, of this generation, with no events
  void recycle(Fence* fence);
  void prune_tails(std::vector<cudaEvent_t>* pending);
  cudaEvent_t take_capture_mark(cudaStream_t stream);
  bool capture_open();
  void drop_streams(const std::vector<cudaStream_t>& gone);

  int device_;
  StreamTable& streams_;
  std::uint64_t total_bytes_ = 0;
  std::atomic<std::uint64_t> device_bytes_{0};
  RankedMutex mutex_{LockRank::device};  // guards the caches below
  std::vector<cudaEvent_t> events_;  // created, not in use
  std::vector<cudaEvent_t> tails_;   // recorded last on destroyed streams, maybe not complete
  // Streams' marks from before their captures, not complete when last looked at.
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> capture_marks_;
  std::vector<Fence*> fences_;       // recycled fence records
  std::uint64_t generation_ = 0;     // bumped by forget_events()
  std::atomic<int> hooked_captures_{0};  // captures begun through the hooks, still open
  std::atomic<int> syncs_in_flight_{0};  // synchronize() calls past their capture check
  // The library's own stream of this device, which waits for events of streams the table does
  // not know (Note [Frees on streams the library never saw]), and the generation it was made in
  // (a reset destroys it). Made at its first use, under relay_mutex_ (only mutex_ is taken
  // under it).
  std::mutex relay_mutex_;
  cudaStream_t relay_ = nullptr;
  std::uint64_t relay_generation_ = 0;
};

}  // namespace poolcuda
