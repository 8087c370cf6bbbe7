// CudaManagedBacking: the managed-memory backing (pools/managed_backing.h) over the real CUDA
// runtime for one device. Slabs are real cudaMallocManaged(cudaMemAttachGlobal) allocations made on
// that device and charged to its budget (`limit`), released through the release worker as the
// device's pages are (never on an allocating thread, dropped by a device reset); fences are the
// device's own (CudaDevice::fence_record and friends, which are thread-safe); zeroing is a host
// memset (Note [Managed zeroing] in cuda_managed.cpp). Every CUDA call goes through OwnCallScope
// (Note [Own calls] in own_call.h).
//
// Depends on pools/managed_backing.h, the CUDA device, the budget, the release worker and the
// real-function table.
#pragma once

#include <cstdint>

#include "interpose/cuda_device.h"
#include "pools/managed_backing.h"

namespace poolcuda {

class CudaManagedBacking final : public DeviceFencedBacking {
 public:
  // `device` must outlive the backing.
  explicit CudaManagedBacking(CudaDevice& device)
      : DeviceFencedBacking(device), device_(device) {}

  AllocStatus allocate_slab(std::uint64_t size, DevicePtr* out) override;
  void release_slab(DevicePtr base, std::uint64_t size) override;
  bool zero(DevicePtr ptr, std::uint64_t size) override;

  // True when every device of the process reports concurrent managed access, the condition
  // for serving managed memory from slabs at all (Note [Managed attach] in managed_hooks.cpp).
  // An own call on `device`.
  static bool every_device_concurrent(int device);

 private:
  CudaDevice& device_;
};

}  // namespace poolcuda
