// HostDevice, the test double every pools test relies on: capacity, fault injection, forbid
// mode, call counts, alignment, fences, the capture flag; and the Device interface's default
// bounded fence wait, which the CUDA device inherits.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "pools/host_device.h"

using namespace poolcuda;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Only what the default fence_wait_for uses: fence_passed, true from the `passes_at`th query.
class PollDevice final : public Device {
 public:
  explicit PollDevice(std::uint64_t passes_at) : passes_at_(passes_at) {}
  AllocStatus allocate(std::uint64_t, DevicePtr*) override { return AllocStatus::failed; }
  void release(DevicePtr, std::uint64_t) override {}
  DeviceMemoryInfo memory_info() override { return {}; }
  std::uint64_t alignment() const override { return 512; }
  FenceHandle fence_record() override { return 1; }
  bool fence_passed(FenceHandle) override { return ++queries >= passes_at_; }
  void fence_wait(FenceHandle) override { ++unbounded_waits; }
  void fence_destroy(FenceHandle) override {}
  bool synchronize() override { return true; }

  std::atomic<std::uint64_t> queries{0};
  std::uint64_t unbounded_waits = 0;

 private:
  std::uint64_t passes_at_;
};

}  // namespace

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
  device.set_capture_open(true);
  CHECK(device.fence_record() == kNoFence);
}

TEST_CASE("host_device_capture_flag") {
  HostDevice device;
  CHECK_FALSE(device.capture_active());
  CHECK(device.synchronize());
  device.set_capture_open(true);
  CHECK(device.capture_active());
  CHECK(device.fence_record() == kNoFence);
  CHECK_FALSE(device.synchronize());  // refused: a real one would invalidate the capture
  CHECK(device.synchronize_during_capture() == 1);
  device.set_capture_open(false);
  CHECK_FALSE(device.capture_active());
  CHECK(device.fence_record() != kNoFence);
  CHECK(device.synchronize());
  CHECK(device.synchronize_during_capture() == 1);
  CHECK(device.calls().capture_active == 3);
}

TEST_CASE("host_device_bounded_fence_wait_by_mode") {
  HostDevice device;
  const FenceHandle passed = device.fence_record();  // immediate
  CHECK(device.fence_wait_for(passed, 0));
  // on_wait: a bounded wait reaches the fence (and every earlier one), however short.
  device.set_fence_mode(HostDevice::FenceMode::on_wait);
  const FenceHandle f1 = device.fence_record(), f2 = device.fence_record();
  CHECK_FALSE(device.fence_passed(f1));
  CHECK(device.fence_wait_for(f2, 0));
  CHECK(device.fence_passed(f1));
  // manual and parked: the wait expires after its bound, and not before.
  for (auto mode : {HostDevice::FenceMode::manual, HostDevice::FenceMode::parked}) {
    device.set_fence_mode(mode);
    const FenceHandle f = device.fence_record();
    const Clock::time_point start = Clock::now();
    CHECK_FALSE(device.fence_wait_for(f, 3000));
    const double took = seconds_since(start);
    CHECK(took >= 0.003);
    CHECK(took < 1.0);
    CHECK_FALSE(device.fence_passed(f));
    device.complete_fences();
    CHECK(device.fence_wait_for(f, 0));
  }
  CHECK(device.calls().fence_wait_for == 6);
  for (FenceHandle f = passed; f < passed + 5; ++f) device.fence_destroy(f);
  CHECK(device.outstanding_fences() == 0);
}

TEST_CASE("host_device_bounded_wait_sees_a_completion_from_another_thread") {
  HostDevice device;
  device.set_fence_mode(HostDevice::FenceMode::parked);
  const FenceHandle f = device.fence_record();
  std::thread other([&] {
    while (device.calls().fence_wait_for == 0) std::this_thread::yield();
    device.complete_fences();
  });
  // The bound is long: only a missed wake-up would use it up.
  CHECK(device.fence_wait_for(f, 30'000'000));
  other.join();
  device.fence_destroy(f);
}

TEST_CASE("host_device_parked_fence_wait_blocks_until_completed") {
  HostDevice device;
  device.set_fence_mode(HostDevice::FenceMode::parked);
  const FenceHandle f = device.fence_record();
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    device.fence_wait(f);
    returned.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(returned.load());
  device.complete_fences();
  waiter.join();
  CHECK(returned.load());
  device.fence_destroy(f);
}

TEST_CASE("device_default_fence_wait_for_polls_until_the_fence_passes") {
  PollDevice device(50);
  const Clock::time_point start = Clock::now();
  CHECK(device.fence_wait_for(1, 10'000'000));
  CHECK(seconds_since(start) < 5.0);
  CHECK(device.queries.load() == 50);
  CHECK(device.unbounded_waits == 0);
}

TEST_CASE("device_default_fence_wait_for_never_blocks_past_its_bound") {
  PollDevice never(UINT64_MAX);
  for (std::uint32_t bound : {0U, 1U, 2000U, 20'000U}) {
    const std::uint64_t before = never.queries.load();
    const Clock::time_point start = Clock::now();
    CHECK_FALSE(never.fence_wait_for(1, bound));
    const double took = seconds_since(start);
    CHECK(took >= bound * 1e-6);
    CHECK(took < bound * 1e-6 + 0.5);  // scheduling noise only
    CHECK(never.queries.load() > before);
    // Backoff: sleeps grow to 50 us, so a 20 ms wait polls hundreds of times, not millions.
    if (bound == 20'000U) CHECK(never.queries.load() - before < 5000);
  }
  CHECK(never.unbounded_waits == 0);
}

}  // TEST_SUITE
