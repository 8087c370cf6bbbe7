// The process-wide registry: one MemoryManager and one CudaDevice per device index, created
// lazily on a device's first allocation and never destroyed (Note [Exit] in lifecycle.cpp), the
// managed-memory chain of a device (created on its first cudaMallocManaged), the table of
// streams the program created, and the counts of real calls the hooks forwarded.
// Lookups are one atomic load per call; creation takes a mutex once per device.
//
// Depends on pools/ and the CUDA device; knows nothing of the exported entry points.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "interpose/cuda_device.h"
#include "interpose/cuda_managed.h"
#include "interpose/stream_table.h"
#include "pools/managed_slabs.h"
#include "pools/memory_manager.h"
#include "pools/report.h"

namespace poolcuda {

class Registry {
 public:
  static constexpr int kMaxDevices = 64;

  // The one registry of the process (allocated once, never destroyed).
  static Registry& instance();

  // The device's manager, or nullptr when it has none yet (or `device` is out of range).
  MemoryManager* manager(int device) const;
  CudaDevice* device(int device) const;

  // The device's manager, created now if needed with the configured layout and options.
  // nullptr when the device cannot be used (its memory size cannot be read): the caller passes
  // the call through, the next call tries again, and the failure is logged once per device.
  MemoryManager* manager_or_create(int device);

  StreamTable& streams() { return streams_; }

  // The device's managed-memory chain, or nullptr when it has none.
  ManagedSlabs* managed(int device) const;
  // The chain, created now if needed (with the device's manager) with the configured slab
  // size. nullptr when managed memory passes through: managed:off, the device cannot be used,
  // or not every device has concurrent managed access (logged once).
  ManagedSlabs* managed_or_create(int device);
  // Every device index with a chain is below this bound (for pointer scans).
  int managed_bound() const { return managed_bound_.load(std::memory_order_acquire); }
  // cudaDeviceReset: the device's slabs are gone with its memory. Call before the device's
  // forget_events() (the chain destroys its fences into the device's caches).
  void forget_managed(int device);
  // Empty managed slabs of the device go back to the driver; true when any did.
  bool trim_managed(int device);

  // Real cudaMalloc / cudaFree calls made on the program's behalf without a pool (size 0,
  // NULL, foreign pointers, requests larger than the device or that no pool accepts), per
  // current device.
  void count_forwarded_malloc(int device);
  void count_forwarded_free(int device);
  void count_forwarded_managed(int device);  // real cudaMallocManaged calls

  // Conditions logged once per device.
  enum class Once { unreadable_size, no_pool_accepts, managed_unpooled, managed_full, count };
  // True for the first caller only, per condition and device (false when out of range).
  bool first_time(Once what, int device);

  // A snapshot of every existing manager, in device order (takes each manager's lock in turn).
  std::vector<ManagerReport> reports() const;

 private:
  Registry() = default;

  std::atomic<MemoryManager*> managers_[kMaxDevices] = {};
  std::atomic<CudaDevice*> devices_[kMaxDevices] = {};
  std::atomic<std::uint64_t> forwarded_mallocs_[kMaxDevices] = {};
  std::atomic<std::uint64_t> forwarded_frees_[kMaxDevices] = {};
  std::atomic<std::uint64_t> forwarded_managed_[kMaxDevices] = {};
  std::atomic<ManagedSlabs*> managed_[kMaxDevices] = {};
  std::atomic<CudaManagedBacking*> managed_backings_[kMaxDevices] = {};
  std::atomic<int> managed_bound_{0};
  std::atomic<int> managed_supported_{-1};  // -1: not asked yet; else every_device_concurrent
  std::atomic<bool> logged_[static_cast<int>(Once::count)][kMaxDevices] = {};
  std::mutex create_mutex_;
  StreamTable streams_;
};

}  // namespace poolcuda
