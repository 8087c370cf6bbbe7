// HostManagedBacking: the managed-memory backing (managed_backing.h) over a HostDevice, for
// tests and benchmarks. Slabs are the HostDevice's host memory (zeroed when allocated, as a
// driver's fresh managed memory reads), so the HostDevice's capacity, fault injection, call
// counts and fences (immediate, or passed only when the test completes them) all apply to the
// slabs too. Adds what the managed tests need: counts of zeroing calls and bytes, a switch that
// makes zeroing fail, and a count of zeroings of memory the device no longer holds (a slab the
// test released behind the chain's back, as a reset does; such memory is not written).
// Thread-safe (the HostDevice locks; the counters are atomic).
#pragma once

#include <atomic>
#include <cstdint>

#include "pools/host_device.h"
#include "pools/managed_backing.h"

namespace poolcuda {

class HostManagedBacking final : public DeviceFencedBacking {
 public:
  explicit HostManagedBacking(HostDevice& device)
      : DeviceFencedBacking(device), device_(device) {}

  AllocStatus allocate_slab(std::uint64_t size, DevicePtr* out) override;
  void release_slab(DevicePtr base, std::uint64_t size) override;
  bool zero(DevicePtr ptr, std::uint64_t size) override;

  // --- Test controls -------------------------------------------------------------------------
  void fail_zeroing(bool fail) { fail_zeroing_.store(fail); }
  std::uint64_t zero_calls() const { return zero_calls_.load(); }
  std::uint64_t zero_bytes() const { return zero_bytes_.load(); }
  std::uint64_t stale_zeroes() const { return stale_zeroes_.load(); }

 private:
  HostDevice& device_;
  std::atomic<bool> fail_zeroing_{false};
  std::atomic<std::uint64_t> zero_calls_{0};
  std::atomic<std::uint64_t> zero_bytes_{0};
  std::atomic<std::uint64_t> stale_zeroes_{0};
};

}  // namespace poolcuda
