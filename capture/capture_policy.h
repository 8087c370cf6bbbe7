// CapturePolicy: what a device's memory does while CUDA stream captures are open, as plain C++
// over a MemoryManager (no CUDA header; the interposer translates CUDA calls into these
// events). It owns which captures are open, each capture's touched slices and the pins it takes
// on them, the graphs' pin sets until CUDA says a graph is gone, the priming profiles, and the
// capture_share memory. DESIGN.md decision 5; Note [Capture windows] in capture_policy.cpp.
//
// Thread-safe: one mutex per policy (rank `capture`, taken before the manager's); open() and
// post_release() take no lock at all.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pools/lock_order.h"
#include "pools/memory_manager.h"
#include "pools/report_tree.h"

namespace poolcuda {

using CaptureId = std::uint64_t;

class CapturePolicy;

// What one finished capture's graph keeps alive until CUDA destroys the graph's last copy:
// a pin on every slice the capture touched, or (capture_share) a share in the device's shared
// capture memory. Handed to CUDA as a user object's payload (interpose/graph_owner.cpp).
struct PinSet {
  CapturePolicy* owner = nullptr;
  std::vector<RetainedSlice> pins;
  std::uint64_t bytes = 0;
  bool shared = false;
  PinSet* next_release = nullptr;  // the lock-free release queue
};

// The capture part of a device's report: X(member, label, unit, detail).
#define POOLCUDA_CAPTURE_NUMBERS(X)                                  \
  X(open_captures, "open", count, normal)                            \
  X(graphs, "graphs holding memory", count, normal)                  \
  X(pinned_slices, "pinned slices", count, normal)                   \
  X(pinned_bytes, "pinned", bytes, normal)                           \
  X(shared_bytes, "shared", bytes, normal)                           \
  X(primed_bytes, "primed", bytes, normal)                           \
  X(profile_bytes, "largest profile", bytes, normal)                 \
  X(captures, "captures", count, normal)                             \
  X(failed_captures, "failed", count, normal)                        \
  X(window_allocations, "allocations in windows", count, normal)     \
  X(from_driver, "of which from the driver", count, normal)

struct CaptureStats {
#define POOLCUDA_CAPTURE_MEMBER(member, label, unit, detail) std::uint64_t member = 0;
  POOLCUDA_CAPTURE_NUMBERS(POOLCUDA_CAPTURE_MEMBER)
#undef POOLCUDA_CAPTURE_MEMBER
};

// The device section's "capture" part.
ReportSection describe(const CaptureStats& stats);

struct CaptureOptions {
  // capture_share:on: graphs captured on the device share one pool of pinned memory (Note
  // [Shared capture memory]); valid only when no two of them ever run at the same time.
  bool share = false;
};

class CapturePolicy {
 public:
  CapturePolicy(MemoryManager& manager, CaptureOptions options);
  ~CapturePolicy();  // releases nothing (Note [Exit] in interpose/lifecycle.cpp)
  CapturePolicy(const CapturePolicy&) = delete;
  CapturePolicy& operator=(const CapturePolicy&) = delete;

  // True while a capture is open on the device: one atomic load, for the hot path.
  bool open() const { return open_.load(std::memory_order_acquire) != 0; }
  // Whether frees must come through free(): a window is open, or shared capture memory exists.
  bool routes_frees() const {
    return open() || shared_count_.load(std::memory_order_acquire) != 0;
  }
  // Whether capture `id` is open here (begun through begin()).
  bool is_open(CaptureId id) const;

  // Automatic priming (Note [Priming]): tops the persistent pool up to the largest profile seen.
  // Called before the capture begins, outside its window; records the window's fence first, also
  // with nothing to prime (Note [Releases inside a window] in pools/manager_api.cpp).
  void prime();

  // Opens a window for capture `id`; a second begin of an open id changes nothing.
  // `explicit_priming`: the window starts in a priming phase (warm-up), whose freed slices stay
  // held until priming_end() (or end()) and then serve the recorded run.
  void begin(CaptureId id, bool explicit_priming = false);
  void priming_end(CaptureId id);

  // Inside a window: from the persistent pool (or shared capture memory), touched by every
  // open capture. Outside one it is a plain reservation.
  Reservation allocate(std::uint64_t size);

  // Inside a window: the slice stays held (touched, never handed out again until its graphs
  // are gone); outside one a plain free, except that shared capture memory stays shared.
  // `stream`: a stream-ordered free's (Note [Stream-ordered frees of pinned slices] in
  // pools/manager_api.cpp); kNoStream for a plain one.
  FreeOutcome free(DevicePtr ptr, StreamToken stream = kNoStream);

  // Closes capture `id`. `ok` (the capture produced a graph): returns the pins its graph keeps,
  // or nullptr when it touched nothing. Otherwise (failed or invalidated) every touched slice is
  // released at once and nullptr comes back. An id that is not open returns nullptr.
  PinSet* end(CaptureId id, bool ok);

  // The graph of `set` is gone: its pins go (held slices go through their free fence).
  void release(PinSet* set);

  // From any thread, even one that must not take a lock (CUDA's user-object destructor):
  // queues the release for drain_releases().
  void post_release(PinSet* set) noexcept;
  bool releases_pending() const {
    return pending_.load(std::memory_order_acquire) != nullptr;
  }
  void drain_releases();

  // cudaDeviceReset: every capture of the device is gone and the manager forgot its slices.
  // Open windows close, pins and profiles are dropped (pin sets still owned by CUDA objects
  // are released as no-ops when they come back).
  void forget();

  CaptureStats stats() const;

 private:
  struct Capture;
  struct SharedSlice;

  void touch_allocation(DevicePtr ptr, std::uint64_t size);
  void finish_priming(Capture& capture);
  Reservation allocate_shared(std::uint64_t size);
  FreeOutcome free_shared(DevicePtr ptr, bool in_window, StreamToken stream);
  void release_pins(std::vector<RetainedSlice>& pins);
  void release_shared_if_unused();

  MemoryManager& manager_;
  const CaptureOptions options_;
  mutable RankedMutex mutex_{LockRank::capture};
  std::atomic<std::uint32_t> open_{0};
  std::atomic<std::uint64_t> shared_count_{0};  // slices in shared capture memory
  std::atomic<PinSet*> pending_{nullptr};
  std::unordered_map<CaptureId, std::unique_ptr<Capture>> captures_;
  std::unordered_set<PinSet*> graphs_;      // pin sets CUDA still holds
  CaptureProfile largest_profile_;
  std::uint64_t largest_profile_bytes_ = 0;
  // capture_share: every slice of the shared memory, by address, and those free for reuse by
  // size.
  std::unordered_map<DevicePtr, std::unique_ptr<SharedSlice>> shared_;
  std::multimap<std::uint64_t, DevicePtr> shared_free_;
  std::uint64_t shared_graphs_ = 0;
  CaptureStats stats_;
};

}  // namespace poolcuda
