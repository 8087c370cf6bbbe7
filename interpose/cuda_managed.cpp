// CudaManagedBacking (see cuda_managed.h).
//
// Note [Managed zeroing]
// A recycled allocation must read as zero before its pointer is returned. Two ways: a host
// memset of the bytes, or a cudaMemsetAsync on a private non-blocking stream followed by a
// synchronize of that stream. On the stand-in the host memset costs what memset costs (tens of
// microseconds per MiB) while the device memset adds a stream round trip per allocation; see
// docs/managed.md for the figures and tools/bench/managed_bench.cpp, which measures both, also
// on a GPU through scripts/gpu-check. The library uses the host memset: it needs no CUDA call
// (so no device switch, no capture-mode bracket, nothing that could fail or serialise on a
// stream), it is legal from any thread at any time on a device with concurrent managed access
// (the only kind whose managed memory is pooled), and it never touches bytes outside the
// allocation. Its cost on a GPU is a page migration when the recycled pages are resident on
// the device; gpu-check reports that cost so the choice can be revisited with numbers.
//
// Depends on cuda_managed.h, own_call.h, the budget, the release worker and the real-function
// table.
#include "interpose/cuda_managed.h"

#include <cstring>

#include "interpose/budget.h"
#include "interpose/own_call.h"
#include "interpose/real_cuda.h"
#include "interpose/release_worker.h"

namespace poolcuda {

AllocStatus CudaManagedBacking::allocate_slab(std::uint64_t size, DevicePtr* out) {
  const int device = device_.index();
  OwnCallScope scope(device);
  if (!scope.ok()) return AllocStatus::failed;  // it would land on another device
  // Over the budget looks like a full device (Note [Budget] in budget.cpp).
  if (!budget::charge(device, size)) return AllocStatus::out_of_memory;
  budget::ChargeScope charged(device, size);
  void* ptr = nullptr;
  const cudaError_t result =
      real::cudaMallocManaged()(&ptr, static_cast<std::size_t>(size), cudaMemAttachGlobal);
  if (result == cudaSuccess) {
    charged.keep();
    budget::count_growth(device, size);
    *out = reinterpret_cast<DevicePtr>(ptr);
    return AllocStatus::ok;
  }
  return result == cudaErrorMemoryAllocation ? AllocStatus::out_of_memory : AllocStatus::failed;
}

// The real cudaFree synchronizes the device: the release worker makes it (Note [Release worker]
// in release_worker.cpp), and uncharges the slab once it has (Note [Budget] in budget.cpp).
void CudaManagedBacking::release_slab(DevicePtr base, std::uint64_t size) {
  ReleaseWorker::instance().release(device_.index(), reinterpret_cast<void*>(base), size);
}

bool CudaManagedBacking::zero(DevicePtr ptr, std::uint64_t size) {
  std::memset(reinterpret_cast<void*>(ptr), 0, static_cast<std::size_t>(size));
  return true;
}

bool CudaManagedBacking::every_device_concurrent(int device) {
  OwnCallScope scope(device);
  int count = 0;
  if (real::cudaGetDeviceCount()(&count) != cudaSuccess || count <= 0) return false;
  for (int d = 0; d < count; ++d) {
    int value = 0;
    if (real::cudaDeviceGetAttribute()(&value, cudaDevAttrConcurrentManagedAccess, d) !=
            cudaSuccess ||
        value == 0) {
      return false;
    }
  }
  return true;
}

}  // namespace poolcuda
