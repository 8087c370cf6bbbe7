// HostManagedBacking (see host_managed_backing.h).
#include "pools/host_managed_backing.h"

#include <cstring>

namespace poolcuda {

AllocStatus HostManagedBacking::allocate_slab(std::uint64_t size, DevicePtr* out) {
  const AllocStatus status = device_.allocate(size, out);
  // HostDevice hands out malloc'd memory; a driver's fresh managed memory reads as zero.
  if (status == AllocStatus::ok) std::memset(reinterpret_cast<void*>(*out), 0, size);
  return status;
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
