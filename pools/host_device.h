// HostDevice: the Device interface over host memory, for tests and benchmarks. Addresses are
// real host pointers (tests may write and verify bytes). Adds what tests need to prove things
// about the pools: a capacity limit, fault injection (fail the Nth allocation), a forbid mode
// that records any Device call (to prove a path never reaches the device), call counters and
// outstanding-allocation counts (leak checks), a configurable alignment, fences that pass at
// once, when waited on, or only when the test completes them, and an open-capture flag.
// Thread-safe (one internal mutex; complete_fences() may come from another thread).
//
// Unlike a real device, the alignment may be any value > 0 (the seed's tests use 10, 32, 50).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_map>

#include "pools/device.h"

namespace poolcuda {

class HostDevice final : public Device {
 public:
  enum class FenceMode : std::uint8_t {
    immediate,  // every fence has passed as soon as it is recorded (default)
    // A device behind the host that reaches any fence soon after it is waited on: fences pass
    // at complete_fences(), fence_wait() or fence_wait_for().
    on_wait,
    // Fences pass only at complete_fences() or fence_wait(); fence_wait_for() returns false
    // after its bound unless complete_fences() comes (from another thread) meanwhile.
    manual,
    // A stream parked by a host function: fences pass only at complete_fences(); fence_wait()
    // blocks until then, fence_wait_for() as under manual.
    parked,
  };

  struct Calls {
    std::uint64_t allocate = 0, release = 0, memory_info = 0, alignment = 0, fence_record = 0,
                  fence_passed = 0, fence_wait = 0, fence_wait_for = 0, fence_destroy = 0,
                  synchronize = 0, capture_active = 0;
    std::uint64_t total() const {
      return allocate + release + memory_info + alignment + fence_record + fence_passed +
             fence_wait + fence_wait_for + fence_destroy + synchronize + capture_active;
    }
  };

  // `capacity`: bytes the device can hand out (also its total memory). `alignment` > 0.
  explicit HostDevice(std::uint64_t capacity = 1 * GiB, std::uint64_t alignment = 512);
  ~HostDevice() override;  // frees what is still allocated (the leak check is the test's job)

  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override;
  void release(DevicePtr ptr, std::uint64_t size) override;
  DeviceMemoryInfo memory_info() override;
  std::uint64_t alignment() const override;
  FenceHandle fence_record() override;
  // A fence on one stream: passed at once unless park_stream() parked that stream; then it
  // passes only at complete_fences() or synchronize(), or at fence_wait() of it under every mode
  // but parked (never at fence_wait_for()). Counted as a fence_record call.
  FenceHandle fence_record_on(StreamToken stream, StreamToken& lane) override;
  bool fence_passed(FenceHandle fence) override;
  void fence_wait(FenceHandle fence) override;
  bool fence_wait_for(FenceHandle fence, std::uint32_t max_microseconds) override;
  void fence_destroy(FenceHandle fence) override;
  bool synchronize() override;
  bool capture_active() override;

  // --- Test controls -------------------------------------------------------------------------
  void set_capacity(std::uint64_t capacity);
  // Reports a different total memory than the capacity (e.g. to resolve presets for 16 GiB).
  void set_total_memory(std::uint64_t total);
  // The `n`th allocate() call from now (1 = the next) fails with `status`.
  void fail_nth_allocation(std::uint64_t n, AllocStatus status = AllocStatus::out_of_memory);
  // While set, every Device call is counted in forbidden_calls() and passed to the hook.
  void forbid_calls(bool forbid);
  void on_forbidden_call(std::function<void(const char* method)> hook);
  std::uint64_t forbidden_calls() const;
  void set_fence_mode(FenceMode mode);
  void complete_fences();  // every fence recorded so far has passed; wakes fence waits
  void park_stream(StreamToken stream);  // its fence_record_on() fences are held back
  // A stream capture opens or ends: while open, fence_record() returns kNoFence,
  // capture_active() is true, and synchronize() refuses (false) and counts in
  // synchronize_during_capture() (a real device-wide synchronize would invalidate the capture).
  void set_capture_open(bool open);
  std::uint64_t synchronize_during_capture() const;

  Calls calls() const;
  std::uint64_t outstanding_allocations() const;
  std::uint64_t outstanding_bytes() const;
  std::uint64_t peak_outstanding_bytes() const;  // the most outstanding_bytes() ever were
  std::uint64_t outstanding_fences() const;  // recorded, not destroyed
  std::uint64_t bad_releases() const;        // release() of an unknown pointer or wrong size
  bool owns(DevicePtr ptr) const;            // ptr lies inside a live allocation

 private:
  void enter(const char* method) const;  // called with mutex_ held
  bool passed_locked(FenceHandle fence) const;  // called with mutex_ held

  struct Block {
    void* base;             // the mapping
    std::uint64_t mapped;   // its length
    std::uint64_t size;     // what was asked for
  };

  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t total_;
  std::uint64_t alignment_;
  std::uint64_t used_ = 0;
  std::uint64_t used_peak_ = 0;
  std::unordered_map<DevicePtr, Block> blocks_;
  std::uint64_t fail_countdown_ = 0;
  AllocStatus fail_status_ = AllocStatus::out_of_memory;
  bool forbid_ = false;
  mutable std::uint64_t forbidden_ = 0;
  std::function<void(const char*)> forbidden_hook_;
  FenceMode fence_mode_ = FenceMode::immediate;
  bool capture_open_ = false;
  std::uint64_t synchronize_during_capture_ = 0;
  std::condition_variable fences_completed_;  // signalled by complete_fences()
  FenceHandle next_fence_ = 1;
  FenceHandle completed_upto_ = 0;
  std::set<FenceHandle> live_fences_;
  std::set<StreamToken> parked_streams_;
  std::set<FenceHandle> passed_apart_;  // stream fences of streams not parked: passed at once
  std::set<FenceHandle> held_back_;     // stream fences of parked streams, not passed yet
  std::uint64_t bad_releases_ = 0;
  mutable Calls calls_;
};

}  // namespace poolcuda
