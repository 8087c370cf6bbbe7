// HostManagedBacking (see host_managed_backing.h).
#include "pools/host_managed_backing.h"

#include <cstring>

namespace poolcuda {

AllocStatus HostManagedBacking::allocate_slab(std::uint64_t size, DevicePtr* out) {
  // HostDevice's memory is a fresh anonymous mapping: it reads as zero, as a driver's fresh
  // managed memory does.
  return device_.allocate(size, out);
}

void HostManagedBacking::release_slab(DevicePtr base, std::uint64_t size) {
  device_.release(base, size);
}

bool HostManagedBacking::zero(DevicePtr ptr, std::uint64_t size) {
  if (fail_zeroing_.load()) return false;
  if (!device_.owns(ptr)) {
    stale_zeroes_.fetch_add(1);
    return true;
  }
  std::memset(reinterpret_cast<void*>(ptr), 0, size);
  zero_calls_.fetch_add(1);
  zero_bytes_.fetch_add(size);
  return true;
}

}  // namespace poolcuda
