// The one seam between the pools and a real device. The pools call only this interface; the
// interposer implements it over CUDA (interpose/cuda_device.*) and the tests over host memory
// (pools/host_device.*). Each method states its contract: preconditions, whether it may be
// called while a graph capture is open on the device, and its thread-safety.
//
// Methods that cannot wait for the device are called with the owning MemoryManager's lock held
// (release among them: it only hands the page to another thread); those that can (fence waits,
// synchronize, flush_releases) are called without it, from any thread, so those must be
// thread-safe. An implementation must never call back into the
// manager (Note [Outside the lock] in memory_manager.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include "pools/no_cancel.h"
#include "pools/types.h"
#include "pools/wait_bound.h"

namespace poolcuda {

enum class AllocStatus : std::uint8_t {
  ok,
  out_of_memory,  // the device is full; trimming idle pages may help
  failed,         // anything else (invalid device, driver failure); retrying will not help
};

struct DeviceMemoryInfo {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};

// An opaque fence token. kNoFence means "no fence": never passed to fence_* methods.
using FenceHandle = std::uint64_t;
inline constexpr FenceHandle kNoFence = 0;

class Device {
 public:
  virtual ~Device() = default;

  // Allocates `size` bytes (size > 0 and a multiple of alignment()). On ok, *out holds an
  // address aligned to alignment() that stays valid until release(). On out_of_memory the
  // implementation leaves no sticky error behind that the program could observe.
  // During capture: allowed; the implementation makes the call legal (relaxed capture mode).
  virtual AllocStatus allocate(std::uint64_t size, DevicePtr* out) = 0;

  // As allocate(), for a page the pools can do without: one wider than the request needs, tried
  // before a narrower one. A refusal is then not the program's, and an implementation's own
  // limit (a budget) neither logs nor counts it. The default: allocate().
  virtual AllocStatus allocate_if_room(std::uint64_t size, DevicePtr* out) {
    return allocate(size, out);
  }

  // Returns memory obtained from allocate() with the same size. Called under the manager's
  // lock (Note [Outside the lock] in memory_manager.cpp), so it must not block: the driver's
  // free synchronizes the device, so an implementation over CUDA hands the release to a thread
  // of its own and returns at once (an allocation must never block on a stream the program
  // parked); flush_releases() waits for it.
  // During capture: may be called while a capture is open (cleanup and out-of-memory recovery
  // know nothing of captures); the implementation must defer the driver call until no capture
  // is open.
  virtual void release(DevicePtr ptr, std::uint64_t size) = 0;

  // Waits at most `max_microseconds` until every release handed over before the call has
  // reached the driver; true when it has. Without the manager's lock. The default: releases are
  // synchronous, nothing to wait for.
  virtual bool flush_releases(std::uint32_t max_microseconds) {
    (void)max_microseconds;
    return true;
  }

  // Out-of-memory recovery, without the manager's lock: memory of this device that others keep
  // for no live allocation (the interposer's empty managed slabs) goes back to the driver, and
  // the call waits until it has arrived, within the recovery's `bound`. True when any went. The
  // default: none.
  virtual bool give_back_elsewhere(WaitBound& bound) {
    (void)bound;
    return false;
  }

  // Bytes handed to release() that have not reached the driver yet (out-of-memory recovery
  // counts them as memory the device will get back). The default: releases are synchronous.
  virtual std::uint64_t releasing_bytes() { return 0; }

  // The release inside the driver's free now, as a number no other release has, or 0 when none
  // is. A wait for releases that runs out reads it to tell a release thread stuck behind a
  // parked stream (the same release before and after the wait) from one that is merely slow (it
  // moved on, or never got a core to start). The default: releases are synchronous.
  virtual std::uint64_t release_in_flight() { return 0; }

  // Bytes allocate() may still take under a limit of the implementation's own (a budget), which
  // refuses as out_of_memory whatever memory_info() says is free; bytes handed to release()
  // count as back only once they reached the driver (releasing_bytes() until then).
  // Out-of-memory recovery sizes what it gives back by it (Note [Recovery in two steps] in
  // memory_manager.cpp). The default: no such limit. Cheap, never blocks.
  virtual std::uint64_t growth_room() { return kNoGrowthLimit; }
  static constexpr std::uint64_t kNoGrowthLimit = ~std::uint64_t{0};

  // Free and total memory of the device as the driver sees it (pooled idle bytes count as used).
  // During capture: allowed.
  virtual DeviceMemoryInfo memory_info() = 0;

  // Alignment of every address allocate() returns and of every slice the pools hand out.
  // Constant for the device's life; at least 256 (what cudaMalloc guarantees).
  virtual std::uint64_t alignment() const = 0;

  // Records a fence after all work issued so far, on every stream that can touch this device's
  // memory. Returns kNoFence when no fence can be recorded now (a capture is open); the caller
  // keeps its epoch open and tries again later. Never blocks.
  virtual FenceHandle fence_record() = 0;

  // Records a fence after all work issued so far on `stream` alone, from the calling thread
  // (a per-thread default stream is the caller's): what a stream-ordered free waits for (Note
  // [Stream-ordered frees] in memory_manager.cpp). kNoFence when it cannot now (a capture is
  // open, the stream is unknown); the caller then fences the free as any other. Never blocks.
  // The default: never.
  // `lane` receives what names this stream for as long as it lives and never a later stream
  // (a destroyed stream's handle may be the next stream's): the frees that wait in one lane pass
  // in the order recorded only while they are frees of one stream.
  virtual FenceHandle fence_record_on(StreamToken stream, StreamToken& lane) {
    lane = stream;
    return kNoFence;
  }

  // True once the device has executed past the fence. Never blocks. During capture: allowed.
  virtual bool fence_passed(FenceHandle fence) = 0;

  // Blocks, without limit, until the device has executed past the fence. Used only where the
  // real cudaFree would have waited too: drain_fences() and a capped pool full of fence-pending
  // memory (Note [Free fences]). Called without the manager's lock.
  virtual void fence_wait(FenceHandle fence) = 0;

  // Waits at most `max_microseconds` for the device to execute past the fence; true when it
  // has. Never blocks longer than the bound (beyond scheduling noise), so a fence that cannot
  // pass while the caller waits (a stream parked by a host function only the caller releases)
  // costs the bound, never a deadlock. Used on the allocation path when fence-pending memory
  // exceeds its bound (Note [Free fences]) and by out-of-memory recovery (Note [Recovery and
  // parked streams]). The default polls fence_passed(): a yield first, then sleeps that grow to
  // kMaxPollSleep; an implementation with a cheaper timed wait may
  // override it. Called without the manager's lock.
  virtual bool fence_wait_for(FenceHandle fence, std::uint32_t max_microseconds) {
    using Clock = std::chrono::steady_clock;
    if (fence_passed(fence)) return true;
    NoCancel no_cancel;  // Note [Cancellation]
    const Clock::time_point deadline = Clock::now() + std::chrono::microseconds(max_microseconds);
    std::chrono::microseconds sleep{0};
    for (;;) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return false;
      if (sleep.count() == 0) {
        std::this_thread::yield();
        sleep = std::chrono::microseconds(1);
      } else {
        std::this_thread::sleep_for(
            std::min<Clock::duration>(sleep, deadline - now));
        sleep = std::min(sleep * 2, kMaxPollSleep);
      }
      if (fence_passed(fence)) return true;
    }
  }

  // Destroys a fence returned by fence_record(), passed or not. Thread-safe: the last waiter of
  // a fence may destroy it without the manager's lock.
  virtual void fence_destroy(FenceHandle fence) = 0;

  // Blocks until all work issued to the device has finished (free_fence:sync); false when it
  // did not, and then nothing freed before may be reused on its account. Called without the
  // manager's lock.
  // During capture: not called while capture_active() says one is open; one that opens between
  // that question and this call makes it answer false without synchronizing (a device-wide
  // synchronize would invalidate the capture).
  virtual bool synchronize() = 0;

  // True while a stream capture is open that a device-wide synchronize would invalidate; the
  // manager then retires free_fence:sync frees through a pending epoch instead. Cheap (called
  // on every such free). The default: no capture is ever open. (Not named capture_open: a
  // same-named private helper of an implementation, one that needs a lock of its own held,
  // would silently override it.)
  virtual bool capture_active() { return false; }

  // Where a stream-ordered free's `stream` runs: on this device (its legacy or per-thread stream,
  // or a stream the library saw created here), on another device, or on a stream the library
  // never saw created, whose device it cannot tell. The default: this device.
  enum class StreamPlace : std::uint8_t { this_device, other_device, unknown };
  virtual StreamPlace stream_place(StreamToken) { return StreamPlace::this_device; }

 protected:
  static constexpr std::chrono::microseconds kMaxPollSleep{50};
};

}  // namespace poolcuda
