// HostDevice, the test double every pools test relies on: capacity, fault injection, forbid
// mode, call counts, alignment, fences.
#include <doctest/doctest.h>

#include <cstring>

#include "pools/host_device.h"

using namespace poolcuda;

TEST_SUITE("unit") {

TEST_CASE("host_device_allocates_aligned_writable_memory_within_capacity") {
  HostDevice device(4096, 50);
  CHECK(device.alignment() == 50);
  DevicePtr a = 0, b = 0, c = 0;
  REQUIRE(device.allocate(2000, &a) == AllocStatus::ok);
  REQUIRE(device.allocate(2050, &b) == AllocStatus::ok);
  CHECK(a % 50 == 0);
  CHECK(b % 50 == 0);
  std::memset(reinterpret_cast<void*>(a), 1, 2000);
  CHECK(device.allocate(50, &c) == AllocStatus::out_of_memory);
  CHECK(device.allocate(30, &c) == AllocStatus::failed);  // not a multiple of the alignment
  CHECK(device.outstanding_allocations() == 2);
  CHECK(device.outstanding_bytes() == 4050);
  CHECK(device.memory_info().free_bytes == 46);
  CHECK(device.memory_info().total_bytes == 4096);
  CHECK(device.owns(a + 1999));
  CHECK_FALSE(device.owns(a + 2000));
  device.release(a, 1000);  // wrong size: refused and recorded
  CHECK(device.bad_releases() == 1);
  device.release(a, 2000);
  device.release(b, 2050);
  CHECK(device.outstanding_allocations() == 0);
  CHECK(device.bad_releases() == 1);
}

TEST_CASE("host_device_fails_the_nth_allocation") {
  HostDevice device(1 * MiB, 512);
  device.fail_nth_allocation(3, AllocStatus::failed);
  DevicePtr p[4] = {};
  CHECK(device.allocate(512, &p[0]) == AllocStatus::ok);
  CHECK(device.allocate(512, &p[1]) == AllocStatus::ok);
  CHECK(device.allocate(512, &p[2]) == AllocStatus::failed);
  CHECK(device.allocate(512, &p[3]) == AllocStatus::ok);
  CHECK(device.calls().allocate == 4);
  device.release(p[0], 512);
  device.release(p[1], 512);
  device.release(p[3], 512);
}

TEST_CASE("host_device_forbid_mode_records_every_call") {
  HostDevice device(1 * MiB, 512);
  std::vector<std::string> seen;
  device.on_forbidden_call([&](const char* m) { seen.emplace_back(m); });
  device.forbid_calls(true);
  DevicePtr p = 0;
  REQUIRE(device.allocate(512, &p) == AllocStatus::ok);
  device.release(p, 512);
  device.synchronize();
  (void)device.memory_info();
  CHECK(device.forbidden_calls() == 4);
  CHECK(seen == std::vector<std::string>{"allocate", "release", "synchronize", "memory_info"});
  device.forbid_calls(false);
  device.synchronize();
  CHECK(device.forbidden_calls() == 4);
  CHECK(device.calls().synchronize == 2);
}

TEST_CASE("host_device_fences_immediate_manual_and_refused") {
  HostDevice device;
  const FenceHandle f1 = device.fence_record();
  CHECK(f1 != kNoFence);
  CHECK(device.fence_passed(f1));
  device.set_fence_mode(HostDevice::FenceMode::manual);
  const FenceHandle f2 = device.fence_record();
  const FenceHandle f3 = device.fence_record();
  CHECK_FALSE(device.fence_passed(f2));
  device.fence_wait(f2);
  CHECK(device.fence_passed(f2));
  CHECK_FALSE(device.fence_passed(f3));
  device.complete_fences();
  CHECK(device.fence_passed(f3));
  CHECK(device.outstanding_fences() == 3);
  for (FenceHandle f : {f1, f2, f3}) device.fence_destroy(f);
  CHECK(device.outstanding_fences() == 0);
  device.refuse_fences(true);
  CHECK(device.fence_record() == kNoFence);
}

}  // TEST_SUITE
