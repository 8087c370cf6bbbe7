// ManagedBacking: the seam between the managed-memory slabs (managed_slabs.h) and the memory
// behind them. The interposer implements it over CUDA (interpose/cuda_managed.*), the tests over
// host memory (host_managed_backing.*). It is separate from Device (device.h) because its
// callers differ: Device methods always run under a MemoryManager's lock, while these run from
// any thread at once (zero() on the lock-free allocation path, the rest on the chain's slow
// path), so every implementation must be thread-safe.
//
// Depends on device.h for AllocStatus and FenceHandle only; names no CUDA symbol.
#pragma once

#include <cstdint>

#include "pools/device.h"

namespace poolcuda {

class ManagedBacking {
 public:
  virtual ~ManagedBacking() = default;

  // Allocates one slab of `size` bytes (a multiple of the chain's granule), addressable from the
  // host and every device, aligned to at least the granule. Every byte of a fresh slab reads as
  // zero. On out_of_memory nothing is left behind that the program could observe.
  virtual AllocStatus allocate_slab(std::uint64_t size, DevicePtr* out) = 0;

  // Returns a slab obtained from allocate_slab() with the same size. Called only when no
  // allocation in it is live and its free fence has passed. May synchronize the device; may
  // defer the release (while a capture is open) but never fails from the caller's view.
  virtual void release_slab(DevicePtr base, std::uint64_t size) = 0;

  // Makes the `size` bytes at `ptr` (inside a slab) read as zero from the host and from every
  // device by the time it returns. Called without any lock held, from many threads at once, on
  // disjoint ranges. False when the bytes could not be zeroed (the device failed).
  virtual bool zero(DevicePtr ptr, std::uint64_t size) = 0;

  // Free fences, as in Device: a fence recorded after all work issued so far that may touch
  // the slabs; kNoFence when none can be recorded now (a capture is open). fence_passed never
  // blocks; fence_wait_for blocks at most about `max_microseconds` and says whether the fence
  // passed; fence_wait blocks until it has (only where the real cudaFree would have waited).
  // Every recorded fence is destroyed exactly once.
  virtual FenceHandle fence_record() = 0;
  virtual bool fence_passed(FenceHandle fence) = 0;
  virtual bool fence_wait_for(FenceHandle fence, std::uint32_t max_microseconds) = 0;
  virtual void fence_wait(FenceHandle fence) = 0;
  virtual void fence_destroy(FenceHandle fence) = 0;
};

// A backing whose fences are a Device's. Only for a Device whose fence methods are thread-safe
// (CudaDevice and HostDevice are; the Device contract alone does not promise it, since its
// callers hold a manager's lock).
class DeviceFencedBacking : public ManagedBacking {
 public:
  explicit DeviceFencedBacking(Device& device) : fences_(device) {}

  FenceHandle fence_record() override { return fences_.fence_record(); }
  bool fence_passed(FenceHandle fence) override { return fences_.fence_passed(fence); }
  bool fence_wait_for(FenceHandle fence, std::uint32_t max_microseconds) override {
    return fences_.fence_wait_for(fence, max_microseconds);
  }
  void fence_wait(FenceHandle fence) override { fences_.fence_wait(fence); }
  void fence_destroy(FenceHandle fence) override { fences_.fence_destroy(fence); }

 private:
  Device& fences_;
};

}  // namespace poolcuda
