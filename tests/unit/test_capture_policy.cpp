// CapturePolicy over a HostDevice: ports of the reference's capture tests (pins of touched
// slices, priming), plus what CUDA stream capture adds: several captures open at once, a failed
// capture releases everything, graph lifetimes through a lock-free release queue, automatic
// priming that keeps a repeated capture away from the device, shared capture memory, reset.
// Note [Capture windows] in capture/capture_policy.cpp.
#include <doctest/doctest.h>

#include <thread>

#include "capture/capture_policy.h"
#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

struct CaptureRig : Rig {
  explicit CaptureRig(bool share = false)
      : Rig(preset(PoolPreset::exclusive), 512, 128 * MiB, FreeFence::none),
        policy(manager, CaptureOptions{share}) {}

  DevicePtr allocate(std::uint64_t size) {
    const Reservation r = policy.allocate(size);
    REQUIRE(r.ptr != 0);
    return r.ptr;
  }
  std::uint64_t reserved() { return manager.memory_usage().bytes_reserved; }
  // A window allocation of `size` in a capture of its own (window slices come from the
  // persistent pool, which only windows use): which slice would the next capture get?
  DevicePtr in_next_window(std::uint64_t size) {
    policy.begin(1000);
    const DevicePtr ptr = allocate(size);
    policy.free(ptr);
    CHECK(policy.end(1000, false) == nullptr);
    return ptr;
  }
  std::uint64_t in_use() { return manager.memory_usage().bytes_in_use; }

  CapturePolicy policy;
};

std::size_t pin_count(const PinSet* set) { return set == nullptr ? 0 : set->pins.size(); }

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("capture_pins_reused_persistent_slice") {
  CaptureRig rig;
  // A first capture leaves a free persistent slice behind.
  rig.policy.begin(1);
  rig.policy.free(rig.allocate(1024));
  rig.policy.release(rig.policy.end(1, true));
  // A second capture reuses that slice: the reuse is pinned although the slice predates it.
  rig.policy.begin(2);
  const DevicePtr second = rig.allocate(1024);
  rig.policy.free(second);
  PinSet* pins = rig.policy.end(2, true);
  CHECK(pin_count(pins) == 1);
  // While pinned, no later allocation gets the slice.
  const std::uint64_t before = rig.reserved();
  const DevicePtr other = rig.allocate(1024);
  CHECK(other != second);
  CHECK(rig.reserved() > before);
  rig.policy.release(pins);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("capture_pins_preexisting_slice_freed_midwindow") {
  CaptureRig rig;
  rig.policy.begin(1);
  const DevicePtr live = rig.allocate(1024);
  rig.policy.release(rig.policy.end(1, true));  // the first graph is gone; `live` is not
  // The next window frees the pre-existing slice and allocates the same size: the freed slice
  // is touched (the captured work before the free may use it) and pinned, and the window's new
  // allocation does not reuse it (the graph's branches may run in parallel on replay).
  rig.policy.begin(2);
  rig.policy.free(live);
  const DevicePtr window = rig.allocate(1024);
  CHECK(window != live);
  rig.policy.free(window);
  PinSet* pins = rig.policy.end(2, true);
  REQUIRE(pin_count(pins) == 2);
  CHECK((pins->pins[0].ptr == live || pins->pins[1].ptr == live));
  // Both stay out of reach until the graph is gone.
  const DevicePtr later = rig.allocate(1024);
  CHECK(later != live);
  CHECK(later != window);
  rig.policy.release(pins);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("capture_does_not_retain_untouched_free_slices") {
  CaptureRig rig;
  rig.policy.begin(1);
  rig.policy.free(rig.allocate(1024));
  rig.policy.release(rig.policy.end(1, true));
  // Only the slice the window touched is retained, not the idle leftover of another size.
  rig.policy.begin(2);
  rig.policy.free(rig.allocate(2048));
  PinSet* pins = rig.policy.end(2, true);
  CHECK(pin_count(pins) == 1);
  rig.policy.release(pins);
}

TEST_CASE("capture_survives_explicit_cleanup") {
  CaptureRig rig;
  rig.policy.begin(1);
  rig.policy.free(rig.allocate(1024));
  rig.manager.cleanup(true);  // a cleanup mid-capture keeps the pinned slice
  PinSet* pins = rig.policy.end(1, true);
  CHECK(pin_count(pins) == 1);
  CHECK(rig.reserved() == 1024);
  rig.policy.release(pins);
}

TEST_CASE("capture_begin_is_reentrant") {
  CaptureRig rig;
  rig.policy.begin(7);
  const DevicePtr first = rig.allocate(1024);
  rig.policy.begin(7);  // a second begin of the same capture keeps what the first recorded
  const DevicePtr second = rig.allocate(2048);
  rig.policy.free(first);
  rig.policy.free(second);
  PinSet* pins = rig.policy.end(7, true);
  CHECK(pin_count(pins) == 2);
  CHECK(rig.policy.end(7, true) == nullptr);  // fully closed
  CHECK_FALSE(rig.policy.open());
  rig.policy.release(pins);
}

TEST_CASE("capture_leaves_preexisting_buffers_alone") {
  CaptureRig rig;
  rig.policy.begin(1);
  const DevicePtr preexisting = rig.allocate(1024);
  rig.policy.release(rig.policy.end(1, true));
  rig.policy.begin(2);
  rig.policy.free(rig.allocate(2048));
  PinSet* pins = rig.policy.end(2, true);
  CHECK(pin_count(pins) == 1);
  // The pre-existing buffer was not claimed: freed now, its slice is free again at once.
  CHECK(rig.policy.free(preexisting) == FreeOutcome::freed);
  CHECK(rig.in_next_window(1024) == preexisting);
  rig.policy.release(pins);
}

TEST_CASE("capture_priming_leaves_the_working_set_not_the_peak") {
  CaptureRig rig;
  // Warm-up: three sequential reserve/free cycles (peak one slice, working set three).
  rig.policy.begin(1, true);
  for (int i = 0; i < 3; ++i) rig.policy.free(rig.allocate(1024));
  rig.policy.priming_end(1);
  const std::uint64_t after_warmup = rig.reserved();
  // The recorded run holds three at once: all from the pool.
  std::vector<DevicePtr> recorded;
  for (int i = 0; i < 3; ++i) recorded.push_back(rig.allocate(1024));
  CHECK(rig.reserved() == after_warmup);
  for (DevicePtr p : recorded) rig.policy.free(p);
  rig.policy.release(rig.policy.end(1, true));
}

TEST_CASE("capture_priming_holds_dropped_slices_until_priming_ends") {
  CaptureRig rig;
  rig.policy.begin(1, true);
  rig.policy.free(rig.allocate(1024));
  // Still priming: the freed slice is held, so the next reservation grows the pool.
  const std::uint64_t before_second = rig.reserved();
  const DevicePtr second = rig.allocate(1024);
  CHECK(rig.reserved() > before_second);
  rig.policy.free(second);
  // Priming over: both are free again and reused.
  rig.policy.priming_end(1);
  const std::uint64_t before_reuse = rig.reserved();
  const DevicePtr reused = rig.allocate(1024);
  CHECK(rig.reserved() == before_reuse);
  rig.policy.free(reused);
  rig.policy.release(rig.policy.end(1, true));
}

TEST_CASE("capture_end_releases_primed_slices_when_priming_never_ended") {
  CaptureRig rig;
  rig.policy.begin(1, true);
  rig.policy.free(rig.allocate(1024));
  CHECK(rig.in_use() > 0);  // priming still holds it
  PinSet* pins = rig.policy.end(1, true);
  CHECK(pin_count(pins) == 0);
  CHECK(rig.in_use() == 0);
  rig.policy.release(pins);
}

TEST_CASE("a_failed_capture_releases_everything_it_touched_at_once") {
  CaptureRig rig;
  const DevicePtr before = rig.allocate(4096);
  rig.policy.begin(1);
  const DevicePtr a = rig.allocate(1024);
  rig.policy.free(a);
  rig.policy.free(before);
  const DevicePtr kept = rig.allocate(2048);
  CHECK(rig.policy.end(1, false) == nullptr);
  CHECK(rig.policy.stats().failed_captures == 1);
  // Freed slices are free again; the live one is the program's, unpinned.
  CHECK(rig.in_next_window(1024) == a);
  CHECK(rig.allocate(4096) == before);  // a dynamic-pool slice, outside windows
  CHECK(rig.policy.free(kept) == FreeOutcome::freed);
  CHECK(rig.in_next_window(2048) == kept);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("every_open_capture_pins_what_the_window_touches") {
  CaptureRig rig;
  rig.policy.begin(1);
  rig.policy.begin(2);
  const DevicePtr shared = rig.allocate(1024);
  rig.policy.free(shared);
  PinSet* first = rig.policy.end(1, true);
  const DevicePtr only_second = rig.allocate(2048);
  rig.policy.free(only_second);
  PinSet* second = rig.policy.end(2, true);
  CHECK(pin_count(first) == 1);
  CHECK(pin_count(second) == 2);
  // The slice both touched stays held until both graphs are gone.
  rig.policy.release(first);
  CHECK(rig.in_next_window(1024) != shared);
  rig.policy.release(second);
  // Free again: two requests of its size in one window get it back, without a new page.
  const std::size_t pages = rig.manager.pages().size();
  rig.policy.begin(1000);
  const DevicePtr x = rig.allocate(1024);
  const DevicePtr y = rig.allocate(1024);
  rig.policy.free(x);
  rig.policy.free(y);
  CHECK(rig.policy.end(1000, false) == nullptr);
  CHECK((x == shared || y == shared));
  CHECK(rig.manager.pages().size() == pages);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("graph_releases_come_from_any_thread_and_drain_later") {
  CaptureRig rig;
  rig.policy.begin(1);
  const DevicePtr a = rig.allocate(1024);
  rig.policy.free(a);
  PinSet* pins = rig.policy.end(1, true);
  std::thread destructor([&] { rig.policy.post_release(pins); });
  destructor.join();
  CHECK(rig.policy.releases_pending());
  CHECK(rig.policy.stats().graphs == 1);  // not yet drained: still pinned
  rig.policy.drain_releases();
  CHECK_FALSE(rig.policy.releases_pending());
  CHECK(rig.policy.stats().graphs == 0);
  CHECK(rig.in_next_window(1024) == a);
}

TEST_CASE("a_primed_capture_makes_no_device_call_in_its_window") {
  CaptureRig rig;
  // The first capture needs three sizes; its graph stays alive, so the memory is pinned.
  const std::uint64_t sizes[] = {1024, 5000, 70000};
  rig.policy.begin(1);
  for (std::uint64_t size : sizes) rig.policy.free(rig.allocate(size));
  PinSet* first = rig.policy.end(1, true);
  // Priming (outside the window) tops the pool up to that profile ...
  rig.policy.prime();
  CHECK(rig.policy.stats().primed_bytes > 0);
  // ... so the same capture again never reaches the device.
  rig.device.forbid_calls(true);
  rig.policy.begin(2);
  for (std::uint64_t size : sizes) rig.policy.free(rig.allocate(size));
  PinSet* second = rig.policy.end(2, true);
  rig.device.forbid_calls(false);
  CHECK(rig.device.forbidden_calls() == 0);
  CHECK(rig.policy.stats().from_driver == 3);  // the first capture's three only
  // Priming again adds nothing while the spare slices are there.
  rig.policy.release(second);
  const std::uint64_t reserved = rig.reserved();
  rig.policy.prime();
  CHECK(rig.reserved() == reserved);
  rig.policy.release(first);
}

TEST_CASE("priming_takes_at_most_half_of_what_the_device_has_free") {
  // A 128 MiB device; a first capture's graph stays alive with its working set pinned.
  for (const std::uint64_t working_set : {20 * MiB, 50 * MiB}) {
    CaptureRig rig;
    rig.policy.begin(1);
    rig.policy.free(rig.allocate(working_set));
    PinSet* first = rig.policy.end(1, true);
    rig.policy.prime();
    // 20 MiB of spare slices leave the window 88 MiB; 50 MiB would leave it 28 MiB for memory
    // the pools do not serve, which nothing could give back during the capture.
    CHECK(rig.policy.stats().primed_bytes == (working_set == 20 * MiB ? working_set : 0));
    rig.policy.release(first);
  }
}

TEST_CASE("shared_capture_memory_serves_later_captures_and_goes_with_the_last_graph") {
  CaptureRig rig(true);
  rig.policy.begin(1);
  const DevicePtr big = rig.allocate(8192);
  rig.policy.free(big);
  PinSet* first = rig.policy.end(1, true);
  // A later, smaller capture reuses the first one's memory although its graph is alive, once
  // the fence its begin records (as the hooks do, prime() first) has passed.
  rig.policy.prime();
  rig.policy.begin(2);
  const DevicePtr small = rig.allocate(4096);
  CHECK(small == big);
  rig.policy.free(small);
  PinSet* second = rig.policy.end(2, true);
  CHECK(rig.policy.stats().shared_bytes == 8192);
  // Outside captures the shared memory is no one else's.
  CHECK(rig.allocate(8192) != big);
  rig.policy.release(first);
  CHECK(rig.policy.stats().shared_bytes == 8192);  // the second graph still uses it
  rig.policy.release(second);
  CHECK(rig.policy.stats().shared_bytes == 0);
  CHECK(rig.in_next_window(8192) == big);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("shared_capture_memory_waits_for_work_queued_before_its_free") {
  CaptureRig rig(true);
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);  // a stream still runs
  rig.policy.prime();
  rig.policy.begin(1);
  const DevicePtr first = rig.allocate(8192);
  rig.policy.free(first);  // work queued before may still write it
  PinSet* graph = rig.policy.end(1, true);
  rig.policy.prime();  // its fence is recorded after the free, and waited for within a bound
  rig.policy.begin(2);
  CHECK(rig.allocate(8192) != first);  // the fence has not passed: not handed out again
  CHECK(rig.policy.end(2, false) == nullptr);
  rig.device.complete_fences();
  rig.policy.prime();
  rig.policy.begin(3);
  CHECK(rig.allocate(8192) == first);  // it has now
  CHECK(rig.policy.end(3, false) == nullptr);
  rig.policy.release(graph);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("forget_drops_open_captures_and_graphs") {
  CaptureRig rig;
  rig.policy.begin(1);
  rig.policy.free(rig.allocate(1024));
  PinSet* stale = rig.policy.end(1, true);
  rig.policy.begin(2);
  rig.manager.forget();
  rig.policy.forget();
  CHECK_FALSE(rig.policy.open());
  CHECK(rig.policy.stats().graphs == 0);
  rig.policy.release(stale);  // from before the reset: a no-op
  CHECK(rig.allocate(1024) != 0);
  CHECK(rig.manager.check_consistency().empty());
}

}  // TEST_SUITE
