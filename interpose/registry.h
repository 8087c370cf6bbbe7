// The process-wide registry: one MemoryManager and one CudaDevice per device index, published
// at the device's first use (its first allocation, capture, reset or stream) and never destroyed
// (Note [Exit] in lifecycle.cpp), the managed-memory chain of a device (created on its first
// cudaMallocManaged), the table of streams the program created, and the counts of real calls the
// hooks forwarded. A device's pools may be built ahead, at cudaFree(NULL) (Note [Pools made
// ahead] in registry.cpp).
// Lookups are one atomic load per call; creation takes a mutex once per device.
//
// Depends on pools/ and the CUDA device; knows nothing of the exported entry points.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "capture/capture_policy.h"
#include "interpose/cuda_device.h"
#include "interpose/cuda_managed.h"
#include "interpose/stream_table.h"
#include "pools/lock_order.h"
#include "pools/managed_slabs.h"
#include "pools/memory_manager.h"
#include "pools/report.h"

namespace poolcuda {

// The interposer's own per-device counters (its part of each device's report):
// X(member, json key, text label). Counted per current device.
#define POOLCUDA_PASSTHROUGH_COUNTERS(X) \
  X(mallocs, "cuda_malloc", "cudaMalloc")  \
  X(frees, "cuda_free", "cudaFree")        \
  X(managed_mallocs, "cuda_malloc_managed", "cudaMallocManaged")

struct PassthroughCounters {
#define POOLCUDA_ATOMIC(member, key, label) std::atomic<std::uint64_t> member{0};
  POOLCUDA_PASSTHROUGH_COUNTERS(POOLCUDA_ATOMIC)
#undef POOLCUDA_ATOMIC
};

class Registry {
 public:
  static constexpr int kMaxDevices = 64;

  // The one registry of the process (allocated once, never destroyed: late frees after exit
  // handlers still find it). The lookups below are inline: every hooked call makes several.
  static Registry& instance() {
    static Registry* registry = new Registry;
    return *registry;
  }

  // The device's manager, or nullptr when it has none yet (or `device` is out of range).
  MemoryManager* manager(int device) const {
    return in_range(device) ? managers_[device].load(std::memory_order_acquire) : nullptr;
  }
  CudaDevice* device(int device) const {
    return in_range(device) ? devices_[device].load(std::memory_order_acquire) : nullptr;
  }
  // The device's capture policy; exists exactly when its manager does.
  CapturePolicy* capture(int device) const {
    return in_range(device) ? captures_[device].load(std::memory_order_acquire) : nullptr;
  }

  // The device's manager, created now if needed with the configured layout and options.
  // nullptr when the device cannot be used (its memory size cannot be read): the caller passes
  // the call through, the next call tries again, and the failure is logged once per device.
  MemoryManager* manager_or_create(int device) {
    if (MemoryManager* existing = manager(device)) return existing;
    return create_manager(device);
  }

  // Builds the device's pools ahead of its first allocation, without announcing them: the
  // device counts as used only when manager_or_create() first takes them (Note [Pools made
  // ahead] in registry.cpp). Nothing when they exist or cannot be made (logged at first use).
  void prepare(int device);

  StreamTable& streams() { return streams_; }

  // The device's managed-memory chain, or nullptr when it has none.
  ManagedSlabs* managed(int device) const {
    return in_range(device) ? managed_[device].load(std::memory_order_acquire) : nullptr;
  }
  // The chain, created now if needed (with the device's manager) with the configured slab
  // size. nullptr when managed memory passes through: managed:off, the device cannot be used,
  // or not every device has concurrent managed access (logged once).
  ManagedSlabs* managed_or_create(int device);
  // Every device index with a chain is below this bound (for pointer scans).
  int managed_bound() const { return managed_bound_.load(std::memory_order_acquire); }
  // cudaDeviceReset: the device's slabs are gone with its memory. Call before the device's
  // forget_events() (the chain destroys its fences into the device's caches).
  // The chain makes no new slab from freeze_managed() to thaw_managed() (Note [Managed reset]),
  // also one made in between.
  void freeze_managed(int device);
  void forget_managed(int device);
  void thaw_managed(int device);
  // Returns once no device's chain is making a slab (ManagedSlabs::await_new_slab).
  void await_new_managed_slabs() const;
  // Empty managed slabs of the device go back to the driver (a lagging fence waited for), and
  // the call waits for the release thread to free them, so that a retried allocation finds the
  // room, both within `bound`; true when any went back.
  bool trim_managed(int device, WaitBound& bound);

  // Real cudaMalloc / cudaFree / cudaMallocManaged calls made on the program's behalf without
  // a pool (size 0, NULL, foreign pointers, requests larger than the device or that no pool
  // accepts), per current device (nullptr when out of range).
  PassthroughCounters* passthrough(int device);

  // Conditions logged once per device.
  enum class Once {
    unreadable_size,
    no_pool_accepts,
    managed_unpooled,
    managed_full,
    managed_pinned,
    managed_held_for_capture,
    managed_kept_unordered,
    held_for_other_capture,
    count
  };
  // True for the first caller only, per condition and device (false when out of range).
  bool first_time(Once what, int device);

  // The devices that have a manager, in order.
  std::vector<int> devices() const;
  // The device with a manager when exactly one has one, else -1. One atomic load: a free can
  // search that device's pools first without asking the runtime which device is current.
  int sole_device() const { return sole_device_.load(std::memory_order_acquire); }

  // A snapshot of one device's manager (takes its lock). `device` must be one devices() listed.
  ManagerReport report(int device) const;

  // The whole report from snapshots (report()): every manager's section with the interposer's
  // own parts added.
  ReportDocument document(const ReportHeader& header,
                          const std::vector<ManagerReport>& managers) const;

 private:
  Registry() = default;
  static bool in_range(int device) { return device >= 0 && device < kMaxDevices; }
  MemoryManager* create_manager(int device);  // manager_or_create's slow path
  // What a device's pools are made of, before they are published.
  struct Built {
    CudaDevice* device = nullptr;
    MemoryManager* manager = nullptr;
    CapturePolicy* capture = nullptr;
    std::uint32_t auto_shards = 0;  // the count shards:auto chose, or 0 when shards are set
  };
  // Makes the device's objects into *out (under create_mutex_); false when its memory size
  // cannot be read (logged once unless `quiet`).
  bool build(int device, bool quiet, Built* out);

  std::atomic<MemoryManager*> managers_[kMaxDevices] = {};
  std::atomic<CudaDevice*> devices_[kMaxDevices] = {};
  std::atomic<CapturePolicy*> captures_[kMaxDevices] = {};
  PassthroughCounters passthrough_[kMaxDevices];
  std::atomic<ManagedSlabs*> managed_[kMaxDevices] = {};
  // freeze_managed() calls not thawed yet, under create_mutex_: a chain made meanwhile starts
  // with as many freezes.
  std::uint32_t managed_freezes_[kMaxDevices] = {};
  std::atomic<CudaManagedBacking*> managed_backings_[kMaxDevices] = {};
  std::atomic<int> managed_bound_{0};
  Built prepared_[kMaxDevices];  // made by prepare(), not yet published; under create_mutex_
  std::atomic<int> sole_device_{-1};  // -1 until the first manager, and again from the second
  std::atomic<int> managed_supported_{-1};  // -1: not asked yet; else every_device_concurrent
  std::atomic<bool> logged_[static_cast<int>(Once::count)][kMaxDevices] = {};
  RankedMutex create_mutex_{LockRank::registry};
  StreamTable streams_;
};

}  // namespace poolcuda
