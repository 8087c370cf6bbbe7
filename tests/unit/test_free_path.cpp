// The free path and the device edge of MemoryManager: pointer classification, free fences in
// all three modes, out-of-memory recovery, forget(), pins, dealloc periods, and the proof that a
// hit never reaches the device.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "pools/forwarding_device.h"
#include "pools/manager_impl.h"  // kMaxLaneFrees
#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

MemoryUsage usage_of(const Rig& rig) { return rig.manager.memory_usage(); }

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("free_classifies_foreign_double_and_interior_pointers_without_change") {
  Rig rig(custom({sliced(4096), exclusive(1 * MiB)}));
  const DevicePtr a = rig.reserve(1000);
  const DevicePtr b = rig.reserve(200 * KiB);
  REQUIRE(rig.manager.free(a) == FreeOutcome::freed);
  const MemoryUsage before = usage_of(rig);
  const std::string state = rig.manager.check_consistency();
  REQUIRE(state.empty());

  int local = 0;
  CHECK(rig.manager.free(reinterpret_cast<DevicePtr>(&local)) == FreeOutcome::not_mine);
  CHECK(rig.manager.free(0) == FreeOutcome::not_mine);
  CHECK(rig.manager.free(a) == FreeOutcome::double_free);  // pending (fence not passed)
  // Inside freed memory but never an allocation's start: not a double free.
  CHECK(rig.manager.free(a + 64) == FreeOutcome::not_allocated);
  CHECK(rig.manager.free(b + 32) == FreeOutcome::interior_pointer);
  CHECK(rig.manager.free(b + 200 * KiB - 1) == FreeOutcome::interior_pointer);
  CHECK(usage_of(rig) == before);
  CHECK(rig.manager.live_size(b) == 200 * KiB);

  rig.manager.drain_fences();
  CHECK(rig.manager.free(a) == FreeOutcome::double_free);  // now free memory, freed recently
  // Slices are carved from the top of a free range: below `a` lies free memory of its page
  // that no allocation ever started at.
  CHECK(rig.manager.free(a - 512) == FreeOutcome::not_allocated);
  CHECK(rig.manager.free(b) == FreeOutcome::freed);
  CHECK(rig.manager.free(b) == FreeOutcome::double_free);
  CHECK(rig.manager.check_consistency().empty());
  rig.manager.drain_fences();
  rig.manager.cleanup(true);
  CHECK(rig.manager.free(a) == FreeOutcome::not_mine);  // its page went back to the device
  CHECK(rig.device.outstanding_allocations() == 0);
}

TEST_CASE("events_fence_keeps_a_pending_slice_until_its_fence_passes") {
  Rig rig(custom({sliced(1024)}));
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const DevicePtr a = rig.reserve(1024);
  REQUIRE(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.manager.report().pending_fence_bytes == 1024);
  CHECK(rig.manager.idle_bytes() == 0);
  // The miss closes the epoch, the fence has not passed: the pool grows instead of reusing.
  const DevicePtr b = rig.reserve(1024);
  CHECK(b != a);
  CHECK(rig.device.calls().fence_record == 1);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
  // Once the device passes the fence, the next miss reaps it and reuses the slice.
  rig.device.complete_fences();
  const DevicePtr c = rig.reserve(1024);
  CHECK(c == a);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.device.outstanding_fences() == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("events_fence_batch_closes_an_epoch_without_a_miss") {
  HostDevice device(128 * MiB, 512);
  ManagerOptions o;
  o.layout = custom({sliced(64 * KiB)});
  o.fence_batch = 4;
  o.prompt_fence_nanos = std::uint64_t{1} << 63;
  MemoryManager manager(device, o);
  std::vector<DevicePtr> held;
  for (int i = 0; i < 8; ++i) held.push_back(manager.allocate(512).ptr);
  for (int i = 0; i < 3; ++i) manager.free(held[i]);
  CHECK(device.calls().fence_record == 0);
  manager.free(held[3]);
  CHECK(device.calls().fence_record == 1);
  // Immediate fences: the closed epoch was reaped on closing.
  CHECK(manager.report().pending_fence_bytes == 0);
  for (int i = 4; i < 8; ++i) manager.free(held[i]);
  CHECK(device.calls().fence_record == 2);
  CHECK(manager.memory_usage().number_allocs == 0);
  manager.cleanup(true);
  CHECK(device.outstanding_allocations() == 0);
}

TEST_CASE("events_fence_refused_keeps_the_epoch_open") {
  Rig rig(custom({sliced(1024)}));
  rig.device.set_capture_open(true);
  const DevicePtr a = rig.reserve(1024);
  rig.manager.free(a);
  const DevicePtr b = rig.reserve(1024);  // miss: fence refused, the slice stays pending
  CHECK(b != a);
  CHECK(rig.manager.report().pending_fence_bytes == 1024);
  CHECK_FALSE(rig.manager.drain_fences());
  CHECK(rig.manager.report().pending_fence_bytes == 1024);
  // The capture ends: the next miss closes the same epoch and reuses the slice.
  rig.device.set_capture_open(false);
  CHECK(rig.reserve(1024) == a);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("sync_fence_during_capture_waits_in_an_epoch_instead_of_synchronizing") {
  Rig rig(custom({sliced(1024)}), 32, 128 * MiB, FreeFence::sync);
  const DevicePtr a = rig.reserve(1024);
  rig.device.set_capture_open(true);
  REQUIRE(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.device.calls().synchronize == 0);
  CHECK(rig.device.synchronize_during_capture() == 0);
  CHECK(rig.manager.report().pending_fence_bytes == 1024);
  CHECK(rig.manager.idle_bytes() == 0);
  // Still capturing: the epoch cannot close, so the slice is not handed out again.
  const DevicePtr b = rig.reserve(1024);
  CHECK(b != a);
  CHECK(rig.manager.check_consistency().empty());
  // The capture ends: frees synchronize again, and the next miss closes and reaps the epoch.
  rig.device.set_capture_open(false);
  REQUIRE(rig.manager.free(b) == FreeOutcome::freed);
  CHECK(rig.device.calls().synchronize == 1);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
  CHECK(rig.reserve(1024) != 0);  // b, freed at once
  CHECK(rig.reserve(1024) == a);  // the miss closed the capture's epoch and reaped it
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.device.synchronize_during_capture() == 0);
  CHECK(rig.device.outstanding_fences() == 0);
  CHECK(rig.manager.check_consistency().empty());
}

// A capture that opens after the manager asked capture_active() and before its synchronize:
// the synchronize refuses (a device-wide one would invalidate the capture), and the freed slice
// is not handed out again until a later synchronize passes.
TEST_CASE("sync_fence_refused_synchronize_keeps_the_slice_from_reuse") {
  struct CaptureOpensLate : ForwardingDevice<HostDevice> {
    using ForwardingDevice::ForwardingDevice;
    bool capture_active() override { return false; }  // asked before the capture opened
  };
  HostDevice host(128 * MiB, 32);
  CaptureOpensLate device(host);
  ManagerOptions options;
  options.layout = custom({sliced(1024)});
  options.free_fence = FreeFence::sync;
  MemoryManager manager(device, options);
  const DevicePtr a = manager.allocate(1024).ptr;
  host.set_capture_open(true);
  REQUIRE(manager.free(a) == FreeOutcome::freed);
  CHECK(host.synchronize_during_capture() == 1);
  const DevicePtr b = manager.allocate(1024).ptr;
  CHECK(b != a);
  CHECK(manager.check_consistency().empty());
  // The capture ends: the next sync free synchronizes, and both slices are free again.
  host.set_capture_open(false);
  REQUIRE(manager.free(b) == FreeOutcome::freed);
  const DevicePtr c = manager.allocate(1024).ptr;
  CHECK((c == a || c == b));
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("sync_fence_synchronizes_then_frees") {
  Rig rig(custom({sliced(1024)}), 32, 128 * MiB, FreeFence::sync);
  const DevicePtr a = rig.reserve(1024);
  rig.manager.free(a);
  CHECK(rig.device.calls().synchronize == 1);
  CHECK(rig.device.calls().fence_record == 0);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.reserve(1024) == a);
}

TEST_CASE("none_fence_frees_at_once_with_no_device_call") {
  Rig rig(custom({sliced(1024)}), 32, 128 * MiB, FreeFence::none);
  const DevicePtr a = rig.reserve(1024);
  rig.device.forbid_calls(true);
  rig.manager.free(a);
  CHECK(rig.reserve(1024) == a);
  CHECK(rig.device.forbidden_calls() == 0);
}

TEST_CASE("stream_ordered_free_waits_for_its_own_stream_alone") {
  // Another stream is parked: every epoch's fence waits for it.
  Rig rig(custom({sliced(1024)}));
  rig.device.set_fence_mode(HostDevice::FenceMode::parked);
  const StreamToken s = 0x1000;
  const DevicePtr a = rig.reserve(1024);
  const DevicePtr b = rig.reserve(1024);
  REQUIRE(rig.manager.free(a, s) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(b) == FreeOutcome::freed);
  CHECK(rig.manager.report().pending_fence_bytes == 2048);
  CHECK(rig.manager.free(a, s) == FreeOutcome::double_free);
  CHECK(rig.manager.live_size(a) == 0);
  // The miss reaps a's fence, recorded on s alone; b's epoch still waits for the park.
  CHECK(rig.reserve(1024) == a);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
  CHECK(rig.manager.report().pending_fence_bytes == 1024);

  // A stream-ordered free on a parked stream waits like any other.
  const StreamToken parked = 0x2000;
  rig.device.park_stream(parked);
  REQUIRE(rig.manager.free(a, parked) == FreeOutcome::freed);
  const DevicePtr c = rig.reserve(1024);
  CHECK(c != a);
  CHECK(c != b);
  rig.device.complete_fences();
  CHECK(rig.reserve(1024) != c);  // a or b, whichever the pool finds first
  CHECK(rig.reserve(1024) != c);
  CHECK(rig.manager.memory_usage().bytes_reserved == 3072);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.device.outstanding_fences() == 0);
  CHECK(rig.manager.check_consistency().empty());
}

namespace {

// A device on which the program destroyed a parked stream and a new stream got its handle:
// after `reused`, fences recorded on 0x1000 go to a stream that runs, and name a lane of their
// own, as CudaDevice's lane token names a stream's creation rather than its handle.
class ReusedHandleDevice final : public ForwardingDevice<HostDevice> {
 public:
  using ForwardingDevice::ForwardingDevice;
  FenceHandle fence_record_on(StreamToken stream, StreamToken& lane) override {
    if (!reused || stream != 0x1000) return inner_.fence_record_on(stream, lane);
    const FenceHandle fence = inner_.fence_record_on(0x3000, lane);
    lane = 0x3000;
    return fence;
  }
  bool reused = false;
};

}  // namespace

TEST_CASE("a new stream on a destroyed parked stream's handle does not queue behind its frees") {
  HostDevice host(64 * MiB, 512);
  ReusedHandleDevice device(host);
  ManagerOptions o;
  o.layout = custom({exclusive(4 * GiB)});
  o.free_fence = FreeFence::events;
  o.shards = 1;
  o.prompt_fence_nanos = std::uint64_t{1} << 63;
  o.recovery_wait_micros = 200'000;
  o.log_sink = [](LogLevel, std::string_view) {};
  MemoryManager manager(device, o);
  host.park_stream(0x1000);
  const DevicePtr small = manager.allocate(MiB).ptr;
  REQUIRE(small != 0);
  REQUIRE(manager.free(small, 0x1000) == FreeOutcome::freed);  // waits for the park
  device.reused = true;  // cudaStreamDestroy, then cudaStreamCreate returns the same handle
  const DevicePtr big = manager.allocate(40 * MiB).ptr;
  REQUIRE(big != 0);
  REQUIRE(manager.free(big, 0x1000) == FreeOutcome::freed);  // the new stream runs
  // 40 MiB more fit only once big's own fence has passed: it must not wait behind the park.
  CHECK(manager.allocate(40 * MiB).ptr != 0);
  CHECK(manager.report().oom_failures == 0);
  host.complete_fences();
}

TEST_CASE("stream_ordered_frees_past_the_lane_limit") {
  // Another stream is parked: epochs never pass. The frees' own stream runs: fences that passed
  // make room in the lanes, so every free waits for its own stream only.
  const std::uint64_t n = kMaxLaneFrees + 44;
  {
    Rig rig(custom({sliced(1024)}));
    rig.device.set_fence_mode(HostDevice::FenceMode::parked);
    std::vector<DevicePtr> live;
    for (std::uint64_t i = 0; i < n; ++i) live.push_back(rig.reserve(1024));
    const std::uint64_t reserved = rig.manager.memory_usage().bytes_reserved;
    for (DevicePtr p : live) REQUIRE(rig.manager.free(p, 0x1000) == FreeOutcome::freed);
    for (std::uint64_t i = 0; i < n; ++i) CHECK(rig.reserve(1024) != 0);
    CHECK(rig.manager.memory_usage().bytes_reserved == reserved);
    CHECK(rig.manager.report().pending_fence_bytes == 0);
  }
  // The frees' own stream is parked: at most kMaxLaneFrees fences of their own, the rest in
  // epochs; all come back once the device passes them.
  Rig rig(custom({sliced(1024)}));
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  rig.device.park_stream(0x1000);
  std::vector<DevicePtr> live;
  for (std::uint64_t i = 0; i < n; ++i) live.push_back(rig.reserve(1024));
  const std::uint64_t reserved = rig.manager.memory_usage().bytes_reserved;
  for (DevicePtr p : live) REQUIRE(rig.manager.free(p, 0x1000) == FreeOutcome::freed);
  CHECK(rig.manager.report().pending_fence_bytes == n * 1024);
  CHECK(rig.device.outstanding_fences() <= kMaxLaneFrees + 1);
  CHECK(rig.manager.drain_fences());
  for (std::uint64_t i = 0; i < n; ++i) CHECK(rig.reserve(1024) != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == reserved);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
}

TEST_CASE("stream_ordered_free_joins_the_epoch_when_no_stream_fence_can_be_recorded") {
  Rig rig(custom({sliced(1024)}));
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const DevicePtr a = rig.reserve(1024);
  rig.device.set_capture_open(true);
  REQUIRE(rig.manager.free(a, 0x1000) == FreeOutcome::freed);
  rig.device.set_capture_open(false);
  // In the open epoch: the miss closes it now, and its fence has not passed.
  CHECK(rig.reserve(1024) != a);
  rig.device.complete_fences();
  CHECK(rig.reserve(1024) == a);
  CHECK(rig.device.outstanding_fences() == 0);
}

TEST_CASE("stream_ordered_frees_are_drained_waited_for_and_forgotten") {
  Rig rig(custom({sliced(1024)}));
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const StreamToken s = 0x1000;
  rig.device.park_stream(s);
  const DevicePtr a = rig.reserve(1024);
  const DevicePtr b = rig.reserve(1024);
  REQUIRE(rig.manager.free(a, s) == FreeOutcome::freed);
  // drain_fences waits for the lane's fence as for an epoch's (under manual, a wait passes it).
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.device.calls().fence_wait >= 1);
  CHECK(rig.reserve(1024) == a);
  // A device reset destroys a lane's fence with everything else.
  REQUIRE(rig.manager.free(b, s) == FreeOutcome::freed);
  REQUIRE(rig.device.outstanding_fences() == 1);
  rig.manager.forget();
  CHECK(rig.device.outstanding_fences() == 0);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("hit_path_makes_no_device_call") {
  HostDevice device(128 * MiB, 32);
  ManagerOptions o;
  o.layout = preset(PoolPreset::subslices);
  // Only the batch closes epochs here: a slow run (a sanitizer build) must not close one by time.
  o.prompt_fence_nanos = std::uint64_t{1} << 63;
  MemoryManager manager(device, o);
  std::vector<DevicePtr> warm;
  for (int i = 0; i < 4; ++i) warm.push_back(manager.allocate(4096).ptr);
  manager.free(warm.back());
  warm.pop_back();
  std::vector<std::string> offenders;
  device.on_forbidden_call([&](const char* method) { offenders.emplace_back(method); });
  device.forbid_calls(true);
  // Reservations served from free memory of an existing page, and frees below the fence batch.
  for (int round = 0; round < 50; ++round) {
    const DevicePtr p = manager.allocate(1000 + static_cast<std::uint64_t>(round)).ptr;
    REQUIRE(p != 0);
    CHECK(manager.free(p) == FreeOutcome::freed);
    if (round % 10 == 9) {  // return the pending slices outside the checked stretch
      device.forbid_calls(false);
      manager.drain_fences();
      device.forbid_calls(true);
    }
  }
  CHECK(device.forbidden_calls() == 0);
  CHECK(offenders.empty());
  // The check itself works: a miss does reach the device.
  (void)manager.allocate(100 * MiB);
  CHECK(device.forbidden_calls() > 0);
  CHECK_FALSE(offenders.empty());
}

TEST_CASE("oom_recovery_trims_idle_pages_then_retries") {
  Rig rig(custom({sliced(1 * MiB), exclusive(8 * MiB)}), 512, 4 * MiB);
  // Fill the device with sliced pages, then free them: they are idle but held.
  std::vector<DevicePtr> held;
  for (int i = 0; i < 4; ++i) held.push_back(rig.reserve(1 * MiB));
  for (DevicePtr p : held) rig.manager.free(p);  // pending behind a fence
  CHECK(rig.manager.memory_usage().bytes_reserved == 4 * MiB);
  const Reservation big = rig.manager.allocate(3 * MiB);
  REQUIRE(big.ptr != 0);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 3 * MiB);
  CHECK(rig.count_logs("out of device memory") == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("oom_path_waits_on_pending_fences") {
  Rig rig(custom({sliced(1 * MiB)}), 512, 2 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::on_wait);
  const DevicePtr a = rig.reserve(1 * MiB), b = rig.reserve(1 * MiB);
  rig.manager.free(a);
  rig.manager.fence_open_frees();  // `a` alone in a closed epoch
  rig.manager.free(b);
  // The miss closes `b`'s epoch too. Neither fence has passed and the device is full:
  // the OOM path waits for the oldest fence, trims the page it gave back and retries, which
  // succeeds, so it never waits for the second.
  const DevicePtr c = rig.reserve(512 * KiB);
  REQUIRE(c != 0);
  CHECK(rig.device.calls().fence_wait_for == 1);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.manager.report().pending_fence_bytes == 1 * MiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a_free_after_a_quiet_spell_is_fenced_at_once") {
  // The program may park the device right after a free (a host function on a stream): a
  // fence recorded later would queue behind the park. So a free records a fence when none was
  // recorded for a while; a burst of frees then batches into the open epoch.
  HostDevice device(128 * MiB, 32);
  device.set_fence_mode(HostDevice::FenceMode::manual);
  ManagerOptions o;
  o.layout = custom({sliced(64 * KiB)});
  // Longer than the default 1 ms, so that two frees in a row fall within it even on a slow run.
  o.prompt_fence_nanos = 200'000'000;
  MemoryManager manager(device, o);
  const DevicePtr a = manager.allocate(512).ptr, b = manager.allocate(512).ptr,
                  c = manager.allocate(512).ptr;
  REQUIRE(manager.free(a) == FreeOutcome::freed);
  CHECK(device.calls().fence_record == 1);
  REQUIRE(manager.free(b) == FreeOutcome::freed);
  CHECK(device.calls().fence_record == 1);  // within the period: batched
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  REQUIRE(manager.free(c) == FreeOutcome::freed);
  CHECK(device.calls().fence_record == 2);
  device.complete_fences();
  CHECK(manager.drain_fences());
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("oom_real_exhaustion_fails_cleanly_and_leaks_nothing") {
  Rig rig(custom({sliced(1 * MiB), exclusive(64 * MiB)}), 512, 4 * MiB);
  const DevicePtr a = rig.reserve(1000);
  const MemoryUsage before = usage_of(rig);
  const Reservation r = rig.manager.allocate(8 * MiB);
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::out_of_memory, 8 * MiB});
  CHECK(rig.manager.report().oom_failures == 1);
  REQUIRE(rig.count_logs("out of device memory") == 1);
  const LogLine& line = rig.logs.back();
  CHECK(line.level == LogLevel::basic);
  for (const char* part : {"requested 8388608 B", "in use 1000 B", "reserved 1048576 B", "idle",
                           "pending fence 0 B"})
    CHECK(line.text.find(part) != std::string::npos);
  CHECK(usage_of(rig) == before);
  CHECK(rig.device.outstanding_allocations() == 1);
  rig.manager.free(a);
  rig.manager.cleanup(true);
  CHECK(rig.device.outstanding_allocations() == 0);
  CHECK(rig.device.bad_releases() == 0);
}

TEST_CASE("device_failure_is_not_retried") {
  Rig rig(custom({sliced(1 * MiB)}), 512);
  rig.device.fail_nth_allocation(1, AllocStatus::failed);
  const Reservation r = rig.manager.allocate(1000);
  CHECK(r.error == Error{ErrorKind::device_error, 1000});
  CHECK(rig.device.calls().allocate == 1);
  CHECK(rig.manager.report().oom_recoveries == 0);
  // Fault injection hits only the Nth call.
  CHECK(rig.reserve(1000) != 0);
}

TEST_CASE("injected_oom_is_recovered_by_the_retry") {
  Rig rig(custom({sliced(1 * MiB)}), 512);
  rig.device.fail_nth_allocation(1, AllocStatus::out_of_memory);
  CHECK(rig.reserve(1000) != 0);
  CHECK(rig.device.calls().allocate == 2);
  CHECK(rig.manager.report().oom_recoveries == 1);
}

TEST_CASE("forget_drops_everything_destroying_only_the_closed_fences") {
  Rig rig(preset(PoolPreset::subslices));
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const DevicePtr a = rig.reserve(1000);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr w = rig.reserve(5000);
  rig.manager.set_mode(AllocationMode::automatic);
  const DevicePtr b = rig.reserve(3000);
  const DevicePtr d = rig.reserve(3000);
  rig.manager.free(b);
  rig.manager.cleanup(true);  // a closed epoch: its fence has not passed
  rig.manager.free(d);        // the open epoch: no fence yet
  REQUIRE(rig.device.outstanding_fences() == 1);
  const RetainedSlice pin = rig.manager.retain(a);
  REQUIRE(pin);
  std::vector<std::string> seen;
  rig.device.on_forbidden_call([&](const char* method) { seen.emplace_back(method); });
  rig.device.forbid_calls(true);
  rig.manager.forget();
  rig.device.forbid_calls(false);
  // The closed epoch's fence is destroyed (not leaked); nothing else reaches the device.
  CHECK(seen == std::vector<std::string>{"fence_destroy"});
  CHECK(rig.device.outstanding_fences() == 0);
  CHECK(rig.manager.memory_usage() == MemoryUsage{});
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.manager.free(a) == FreeOutcome::not_mine);
  CHECK(rig.manager.free(w) == FreeOutcome::not_mine);
  CHECK_FALSE(rig.manager.release_retained(pin));
  // Still usable afterwards.
  const DevicePtr c = rig.reserve(1000);
  CHECK(c != 0);
  CHECK(rig.manager.free(c) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a slice a graph releases inside a window waits for the window's fence if freed before") {
  // Note [Releases inside a window] in pools/manager_api.cpp.
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr early = rig.reserve(1024);
  const DevicePtr late = rig.reserve(1024);
  rig.manager.set_mode(AllocationMode::automatic);
  const RetainedSlice early_pin = rig.manager.retain(early);
  const RetainedSlice late_pin = rig.manager.retain(late);
  REQUIRE(early_pin);
  REQUIRE(late_pin);
  CHECK(rig.manager.free(early) == FreeOutcome::freed);  // held, before the window's fence
  rig.manager.record_window_fence();
  CHECK(rig.manager.free(late) == FreeOutcome::freed);  // held, after it
  // The window opens; the graph's release comes inside it, where no fence can be recorded.
  rig.manager.set_capture_window(true);
  rig.device.set_capture_open(true);
  CHECK(rig.manager.release_retained(early_pin));
  CHECK(rig.manager.release_retained(late_pin));
  CHECK(rig.manager.report().pending_fence_bytes == 2048);
  CHECK_FALSE(rig.manager.wait_for_window_fence(0));
  rig.device.complete_fences();
  CHECK(rig.manager.wait_for_window_fence(1000));
  // `early` is back inside the window; `late`, freed after the fence, waits for the next one.
  CHECK(rig.manager.report().pending_fence_bytes == 1024);
  CHECK(rig.reserve(1024) == early);
  const DevicePtr fresh = rig.reserve(1024);
  CHECK(fresh != late);
  rig.device.set_capture_open(false);
  rig.manager.set_capture_window(false);
  CHECK(rig.manager.free(early) == FreeOutcome::freed);
  CHECK(rig.manager.free(fresh) == FreeOutcome::freed);
  rig.manager.cleanup(true);
  rig.device.complete_fences();
  rig.manager.cleanup(true);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("capture begins with no free since the last window's fence record no other") {
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);  // a stream parked for good
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr a = rig.reserve(1024);
  rig.manager.set_mode(AllocationMode::automatic);
  const RetainedSlice pin = rig.manager.retain(a);
  for (int begin = 0; begin < 10; ++begin) rig.manager.record_window_fence();
  CHECK(rig.device.outstanding_fences() == 0);  // nothing held: no release needs one
  CHECK(rig.manager.free(a) == FreeOutcome::freed);  // held: the next begin needs a fence
  rig.manager.record_window_fence();
  rig.manager.record_window_fence();
  CHECK(rig.device.outstanding_fences() == 1);
  // That fence's epoch holds no free: a drain (poolcuda trim) does not wait for it, which behind
  // a parked stream would take until the park ends.
  const std::uint64_t waits = rig.device.calls().fence_wait;
  CHECK(rig.manager.drain_fences());
  CHECK(rig.device.calls().fence_wait == waits);
  rig.device.complete_fences();
  CHECK(rig.manager.release_retained(pin));
  rig.manager.cleanup(true);
  rig.device.complete_fences();
  rig.manager.cleanup(true);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a window's fence that passed before the release gives the slice back at once") {
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr a = rig.reserve(1024);
  rig.manager.set_mode(AllocationMode::automatic);
  const RetainedSlice pin = rig.manager.retain(a);
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  rig.manager.record_window_fence();  // passes at once (immediate fences), and is reaped
  rig.manager.set_capture_window(true);
  rig.device.set_capture_open(true);
  CHECK(rig.manager.release_retained(pin));
  CHECK(rig.manager.report().pending_fence_bytes == 0);
  CHECK(rig.reserve(1024) == a);
  rig.device.set_capture_open(false);
  rig.manager.set_capture_window(false);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("retained_slice_is_never_handed_out_until_released") {
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB, FreeFence::none);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr a = rig.reserve(1024);
  rig.manager.set_mode(AllocationMode::automatic);
  const RetainedSlice pin = rig.manager.retain(a);
  const RetainedSlice pin2 = rig.manager.retain(a);
  REQUIRE(pin);
  CHECK_FALSE(rig.manager.retain(a + 512));
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.manager.free(a) == FreeOutcome::double_free);
  // Held: still counted in use, and a new persistent reservation cannot reuse it.
  CHECK(rig.manager.report().persistent.bytes_in_use == 1024);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr b = rig.reserve(1024);
  CHECK(b != a);
  CHECK(rig.manager.release_retained(pin));
  CHECK(rig.manager.report().persistent.bytes_in_use == 2048);  // a (one pin left), b
  CHECK(rig.manager.release_retained(pin2));
  CHECK_FALSE(rig.manager.release_retained(pin2));
  CHECK(rig.manager.report().persistent.bytes_in_use == 1024);  // only b
  CHECK(rig.reserve(1024) == a);
  rig.manager.set_mode(AllocationMode::automatic);
  // A pin on a slice that stays live just drops.
  const RetainedSlice live_pin = rig.manager.retain(b);
  CHECK(rig.manager.release_retained(live_pin));
  CHECK(rig.manager.live_size(b) == 1024);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("dealloc_period_releases_idle_pages") {
  Rig rig(custom({sliced(4096, 4096, std::nullopt, 10), exclusive(1 * MiB, 20)}), 512,
          128 * MiB, FreeFence::none);
  const DevicePtr s = rig.reserve(4096);
  const DevicePtr e = rig.reserve(64 * KiB);
  const DevicePtr keep = rig.reserve(100 * KiB);
  rig.manager.free(s);
  rig.manager.free(e);
  CHECK(rig.manager.pages().size() == 3);
  // Reservations that touch neither idle page (served from `keep`'s reuse).
  rig.manager.free(keep);
  for (int i = 0; i < 9; ++i) rig.manager.free(rig.reserve(100 * KiB));
  CHECK(rig.manager.pages().size() == 3);
  for (int i = 0; i < 3; ++i) rig.manager.free(rig.reserve(100 * KiB));
  CHECK(rig.manager.pages().size() == 2);  // the sliced page went after 10 reservations
  for (int i = 0; i < 10; ++i) rig.manager.free(rig.reserve(100 * KiB));
  // The exclusive pages idle for 20 reservations went too; `keep`'s page is reused each time.
  CHECK(rig.manager.pages().size() == 1);
  CHECK(rig.device.calls().release == 2);
  // Explicit cleanup releases the rest.
  rig.manager.cleanup(true);
  CHECK(rig.device.outstanding_allocations() == 0);
}

TEST_CASE("persistent_idle_slices_go_on_explicit_cleanup_only") {
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB, FreeFence::none);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr a = rig.reserve(1000), b = rig.reserve(3000);
  rig.manager.set_mode(AllocationMode::automatic);
  rig.manager.free(a);
  for (int i = 0; i < 100; ++i) rig.manager.free(rig.reserve(100));
  rig.manager.cleanup(false);
  CHECK(rig.manager.report().persistent.pages == 2);
  rig.manager.cleanup(true);
  const ManagerReport r = rig.manager.report();
  CHECK(r.persistent.pages == 1);
  CHECK(r.persistent.device_releases == 1);
  CHECK(rig.manager.live_size(b) == 3000);
}

TEST_CASE("no_period_means_no_implicit_release") {
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB, FreeFence::none);
  rig.manager.free(rig.reserve(4096));
  for (int i = 0; i < 1000; ++i) rig.manager.free(rig.reserve(100));
  rig.manager.cleanup(false);
  CHECK(rig.device.calls().release == 0);
  rig.manager.cleanup(true);
  CHECK(rig.device.calls().release == 1);
}

}  // TEST_SUITE
