// The one seam between the pools and a real device. The pools call only this interface; the
// interposer implements it over CUDA (interpose/cuda_device.*) and the tests over host memory
// (pools/host_device.*). Each method states its contract: preconditions, whether it may be
// called while a graph capture is open on the device, and its thread-safety.
//
// Every method is called with the owning MemoryManager's lock held, so an implementation never
// sees two calls from the same manager at once, and it must never call back into the manager.
#pragma once

#include <cstdint>

#include "pools/types.h"

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

  // Returns memory obtained from allocate() with the same size. May synchronize the device.
  // During capture: never called (the manager defers releases until no capture is open).
  virtual void release(DevicePtr ptr, std::uint64_t size) = 0;

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

  // True once the device has executed past the fence. Never blocks. During capture: allowed.
  virtual bool fence_passed(FenceHandle fence) = 0;

  // Blocks until the device has executed past the fence. Used on the out-of-memory path, by
  // drain_fences(), and when fence-pending memory exceeds its bound (the oldest fence only).
  virtual void fence_wait(FenceHandle fence) = 0;

  // Destroys a fence returned by fence_record(), passed or not.
  virtual void fence_destroy(FenceHandle fence) = 0;

  // Blocks until all work issued to the device has finished (free_fence:sync).
  // During capture: never called.
  virtual void synchronize() = 0;
};

}  // namespace poolcuda
