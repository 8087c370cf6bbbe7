// Helpers shared by the managed-slab unit tests: a chain of slabs over host memory (a HostDevice,
// the HostManagedBacking over it, and the ManagedSlabs) and byte checks of its allocations.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>

#include "pools/host_managed_backing.h"
#include "pools/managed_slabs.h"

namespace poolcuda::test {

inline constexpr std::uint64_t kGranule = 512;
inline constexpr std::uint32_t kNoWait = 0;
inline constexpr std::uint32_t kLongWait = 10000000;  // a trim's bound on waiting for fences

// A HostDevice, the backing over it, and a chain of `max_slabs` slabs of `slab` bytes.
struct Chain {
  explicit Chain(std::uint64_t slab = 4 * KiB, std::uint32_t max_slabs = 4,
                 std::uint64_t capacity = 256 * MiB, bool fences = true,
                 std::uint32_t disuse = 8)
      : device(capacity, kGranule), backing(device), slabs(backing, options(slab, max_slabs,
                                                                             fences, disuse)) {}

  static ManagedOptions options(std::uint64_t slab, std::uint32_t max_slabs, bool fences,
                                std::uint32_t disuse) {
    ManagedOptions o;
    o.slab_size = slab;
    o.granule = kGranule;
    o.max_slabs = max_slabs;
    o.fences = fences;
    o.disuse_period = disuse;
    // Requests of any share of these small slabs take slabs; test_managed_slabs.cpp's case on
    // large requests sets the share the library uses.
    o.opening_share = 1;
    return o;
  }

  DevicePtr allocate(std::uint64_t size, std::uint64_t alignment = kGranule) {
    const ManagedAllocation a = slabs.allocate(size, alignment);
    REQUIRE_MESSAGE(a.ptr != 0, describe(a.error));
    return a.ptr;
  }
  ManagedReport report() const { return slabs.report(); }

  HostDevice device;
  HostManagedBacking backing;
  ManagedSlabs slabs;
};

inline bool all_bytes(DevicePtr ptr, std::uint64_t size, unsigned char value) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(ptr);
  if (size == 0) return true;
  // Every byte equals the first when the range equals itself shifted by one: one memcmp, where
  // a loop over the bytes costs most of this test's time under ThreadSanitizer.
  return bytes[0] == value && std::memcmp(bytes, bytes + 1, size - 1) == 0;
}

inline void fill(DevicePtr ptr, std::uint64_t size, unsigned char value) {
  std::memset(reinterpret_cast<void*>(ptr), value, size);
}

}  // namespace poolcuda::test
