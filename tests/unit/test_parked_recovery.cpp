// Out-of-memory recovery while the program may have parked a stream (Note [Recovery and parked
// streams] in pools/memory_manager.cpp): a request nothing could make room for fails without
// waiting, a fence that never passes costs at most the recovery's bound, and the open epoch is
// fenced before host work the program issues; before a host function the pools give their idle
// memory back (Note [Idle memory before a park]).
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

TEST_SUITE("unit") {

TEST_CASE("oom_recovery_fails_at_once_when_no_recovery_could_make_room") {
  Rig rig(custom({sliced(1 * MiB), exclusive(16 * MiB)}), 512, 4 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const DevicePtr live = rig.reserve(1 * MiB);
  const DevicePtr freed = rig.reserve(1 * MiB);
  REQUIRE(live != 0);
  REQUIRE(freed != 0);
  rig.manager.free(freed);  // pending behind a fence that has not passed
  // 2 MiB free on the device and 1 MiB waiting for its fence: 8 MiB can never fit, so the
  // real cudaMalloc would fail at once, and so must the recovery, waiting for nothing.
  const Reservation r = rig.manager.allocate(8 * MiB);
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::out_of_memory, 8 * MiB});
  CHECK(rig.device.calls().fence_wait == 0);
  CHECK(rig.device.calls().fence_wait_for == 0);
  CHECK(rig.manager.report().oom_failures == 1);
  rig.device.complete_fences();
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_waits_for_a_fence_behind_a_parked_stream_only_up_to_its_bound") {
  HostDevice device(2 * MiB, 512);
  device.set_fence_mode(HostDevice::FenceMode::parked);
  ManagerOptions options;
  options.layout = custom({sliced(1 * MiB)});
  options.free_fence = FreeFence::events;
  options.recovery_wait_micros = 50000;
  options.log_sink = [](LogLevel, std::string_view) {};
  MemoryManager manager(device, options);
  const DevicePtr a = manager.allocate(1 * MiB).ptr;
  const DevicePtr b = manager.allocate(1 * MiB).ptr;
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  manager.free(a);  // its fence never passes while the stream stays parked
  const auto start = std::chrono::steady_clock::now();
  const Reservation r = manager.allocate(512 * KiB);
  const auto spent = std::chrono::steady_clock::now() - start;
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::out_of_memory, 512 * KiB});
  CHECK(device.calls().fence_wait == 0);
  CHECK(device.calls().fence_wait_for >= 1);
  CHECK(spent >= std::chrono::milliseconds(40));
  CHECK(spent < std::chrono::seconds(5));
  device.complete_fences();  // the stream moves again: the memory comes back
  CHECK(manager.allocate(512 * KiB).ptr != 0);
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("host_work_fences_the_open_epoch_first_and_costs_nothing_without_one") {
  Rig rig(custom({sliced(64 * KiB)}));
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const DevicePtr a = rig.reserve(512), b = rig.reserve(512);
  rig.manager.free(a);  // both join the open epoch (the Rig closes none by time)
  rig.manager.free(b);
  REQUIRE(rig.device.calls().fence_record == 0);
  rig.manager.fence_open_frees();
  CHECK(rig.device.calls().fence_record == 1);
  // Nothing left open: no device call at all.
  rig.device.forbid_calls(true);
  rig.manager.fence_open_frees();
  CHECK(rig.device.forbidden_calls() == 0);
  rig.device.forbid_calls(false);
  rig.device.complete_fences();
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_counts_a_page_the_same_request_just_released") {
  // A direct pool releases its idle allocations to make room under `reclaim` before it grows;
  // until the lock is released that memory is neither reserved nor free with the device, and
  // recovery must still count it as memory on its way back rather than fail at once.
  Rig rig(custom({direct(16 * MiB)}), 512, 64 * MiB);
  const DevicePtr first = rig.reserve(40 * MiB);
  REQUIRE(first != 0);
  rig.manager.free(first);
  rig.device.complete_fences();
  const DevicePtr second = rig.reserve(60 * MiB);  // fits once the idle 40 MiB are back
  CHECK(second != 0);
  CHECK(rig.device.outstanding_bytes() == 60 * MiB);
  CHECK(rig.manager.report().oom_failures == 0);
  rig.manager.free(second);
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.check_consistency().empty());
}

namespace {

// A HostDevice whose fences all pass while releases are flushed: the device makes progress while
// out-of-memory recovery waits for its pages.
class ProgressDuringFlush final : public ForwardingDevice<HostDevice> {
 public:
  using ForwardingDevice::ForwardingDevice;
  bool flush_releases(std::uint32_t) override {
    inner_.complete_fences();
    return true;
  }
};

// Released pages that never reach the driver (its free waits behind a parked stream): each
// flush runs out after at most 20 ms.
class StuckReleases final : public HeldReleases {
 public:
  using HeldReleases::HeldReleases;

 protected:
  bool arrive(std::uint32_t us) override {
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<std::uint32_t>(us, 20000)));
    return false;
  }
};

// Released pages stuck behind a parked stream, as StuckReleases, on a device that reaches every
// fence recorded so far just as out-of-memory recovery begins (its first device call): after the
// route gave up waiting for them.
class FencesPassAsRecoveryBegins final : public HeldReleases {
 public:
  using HeldReleases::HeldReleases;
  bool give_back_elsewhere(WaitBound&) override {
    inner_.complete_fences();
    return false;
  }

 protected:
  bool arrive(std::uint32_t us) override {
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<std::uint32_t>(us, 20000)));
    return false;
  }
};

// Released pages held back while a capture is open, as the release worker does with a page
// whose free the driver refuses for a capture, that reach the driver at the first flush after
// it.
class CaptureHoldsReleases final : public HeldReleases {
 public:
  using HeldReleases::HeldReleases;

 protected:
  bool arrive(std::uint32_t) override { return !inner_.capture_active(); }
};

// `layout`, frees behind event fences, log lines dropped.
ManagerOptions fenced(decltype(ManagerOptions::layout) layout) {
  ManagerOptions options;
  options.layout = std::move(layout);
  options.free_fence = FreeFence::events;
  options.log_sink = [](LogLevel, std::string_view) {};
  return options;
}

// One exclusive pool of 8 MiB, frees reused at once, log lines dropped.
ManagerOptions exclusive_8mib() {
  ManagerOptions options;
  options.layout = custom({exclusive(8 * MiB)});
  options.free_fence = FreeFence::none;
  options.log_sink = [](LogLevel, std::string_view) {};
  return options;
}

}  // namespace

TEST_CASE("oom_recovery_after_a_capture_waits_for_the_pages_the_capture_held_back") {
  HostDevice host(8 * MiB, 512);
  CaptureHoldsReleases device(host);
  MemoryManager manager(device, exclusive_8mib());
  leave_an_idle_page(manager);
  host.set_capture_open(true);
  CHECK(manager.allocate(7 * MiB).ptr == 0);  // the idle page is held back until the end
  host.set_capture_open(false);
  // Still on its way when the next request comes: that recovery must flush it, not take the
  // earlier refusal for a stream that never moves.
  REQUIRE(device.releasing_bytes() == 6 * MiB);
  const DevicePtr after = manager.allocate(7 * MiB).ptr;
  CHECK(after != 0);
  manager.free(after);
  manager.cleanup(true);
  device.flush_releases(0);
  CHECK(host.outstanding_allocations() == 0);
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_reuses_memory_whose_fence_passed_as_it_began") {
  // Note [Fences passing during a recovery]: the freed MiB comes back once recovery has begun;
  // it serves the request as it is, where sending its page to the driver would leave it behind
  // the park.
  HostDevice host(2 * MiB, 512);
  host.set_fence_mode(HostDevice::FenceMode::manual);
  FencesPassAsRecoveryBegins device(host);
  MemoryManager manager(device, fenced(custom({sliced(1 * MiB)})));
  const DevicePtr a = manager.allocate(1 * MiB).ptr;
  const DevicePtr b = manager.allocate(1 * MiB).ptr;
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  manager.free(a);
  const DevicePtr again = manager.allocate(512 * KiB).ptr;
  CHECK(again != 0);
  CHECK(device.releasing_bytes() == 0);
  CHECK(device.flushes == 0);
  CHECK(manager.report().oom_failures == 0);
  manager.free(again);
  manager.free(b);
  host.complete_fences();
  CHECK(manager.drain_fences());
  manager.cleanup(true);
  device.deliver();
  CHECK(host.outstanding_allocations() == 0);
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_does_not_wait_again_for_pages_still_stuck") {
  HostDevice host(8 * MiB, 512);
  StuckReleases device(host);
  MemoryManager manager(device, exclusive_8mib());
  leave_an_idle_page(manager);
  // The idle page goes back but never arrives: the recovery's flush runs out.
  CHECK(manager.allocate(7 * MiB).ptr == 0);
  CHECK(device.flushes == 1);
  // Nothing reached the driver since: the next recovery fails without flushing again.
  CHECK(manager.allocate(7 * MiB).ptr == 0);
  CHECK(device.flushes == 1);
  device.deliver();  // the stream moves: the next recovery flushes, and succeeds
  const DevicePtr after = manager.allocate(7 * MiB).ptr;
  CHECK(after != 0);
  manager.free(after);
  manager.cleanup(true);
  device.deliver();
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_flushes_a_page_its_own_retry_released") {
  // The freed 40 MiB wait for a fence that passes only while recovery flushes; the retry after
  // that flush reaps them, and the direct pool returns the page to make room under `reclaim`
  // before it grows 48 MiB: that page must reach the device before recovery gives up.
  HostDevice host(64 * MiB, 512);
  host.set_fence_mode(HostDevice::FenceMode::manual);
  ProgressDuringFlush device(host);
  MemoryManager manager(device, fenced(custom({direct(16 * MiB)})));
  const DevicePtr first = manager.allocate(40 * MiB).ptr;
  REQUIRE(first != 0);
  manager.free(first);
  const Reservation second = manager.allocate(48 * MiB);  // not an exact fit for that page
  CHECK(second.ptr != 0);
  CHECK(manager.report().oom_failures == 0);
  manager.free(second.ptr);
  host.complete_fences();
  CHECK(manager.drain_fences());
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("give_back_all_returns_idle_and_fence_pending_memory") {
  Rig rig(custom({sliced(1 * MiB), exclusive(32 * MiB)}), 512, 64 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::on_wait);
  const DevicePtr live = rig.reserve(1000);
  const DevicePtr idle = rig.reserve(20 * MiB);
  const DevicePtr pending = rig.reserve(4 * MiB);
  REQUIRE((live != 0 && idle != 0 && pending != 0));
  rig.manager.free(idle);
  rig.device.complete_fences();
  rig.manager.cleanup(false);  // reaps: the 20 MiB page is idle
  rig.manager.free(pending);   // waits for a fence the device reaches once waited on
  CHECK(rig.manager.give_back_all(1000000) == GiveBack::done);
  // Only the page of the live slice stays: what a park could otherwise hold back is with the
  // device again, as the plain program's frees were.
  CHECK(rig.device.outstanding_bytes() == 1 * MiB);
  CHECK(rig.manager.report().give_backs == 1);
  CHECK(rig.manager.report().give_back_timeouts == 0);
  // Nothing idle, pending or on its way: the next host function costs no device call.
  rig.device.forbid_calls(true);
  CHECK(rig.manager.give_back_all(1000000) == GiveBack::nothing);
  CHECK(rig.device.forbidden_calls() == 0);
  rig.device.forbid_calls(false);
  CHECK(rig.manager.report().give_backs == 1);
  rig.manager.free(live);
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("give_back_all_behind_an_earlier_park_costs_its_bound_once") {
  Rig rig(custom({sliced(1 * MiB)}), 512, 16 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::parked);
  const DevicePtr a = rig.reserve(1 * MiB);
  const DevicePtr b = rig.reserve(1 * MiB);
  REQUIRE((a != 0 && b != 0));
  rig.manager.free(a);  // behind a stream parked earlier: its fence cannot pass
  const auto start = std::chrono::steady_clock::now();
  CHECK(rig.manager.give_back_all(50000) == GiveBack::timed_out);
  const auto spent = std::chrono::steady_clock::now() - start;
  CHECK(spent >= std::chrono::milliseconds(40));
  CHECK(spent < std::chrono::seconds(5));
  CHECK(rig.manager.report().give_back_timeouts == 1);
  // Nothing moved since: the next host function does not wait for it again.
  const std::uint64_t waits = rig.device.calls().fence_wait_for;
  CHECK(rig.manager.give_back_all(50000) == GiveBack::timed_out);
  CHECK(rig.device.calls().fence_wait_for == waits);
  CHECK(rig.manager.report().give_backs == 1);
  // A longer bound, or a free since, is worth another wait.
  CHECK(rig.manager.give_back_all(60000) == GiveBack::timed_out);
  CHECK(rig.device.calls().fence_wait_for > waits);
  const DevicePtr c = rig.reserve(512);
  REQUIRE(c != 0);
  rig.manager.free(c);
  const std::uint64_t waits_before_free = rig.device.calls().fence_wait_for;
  CHECK(rig.manager.give_back_all(50000) == GiveBack::timed_out);
  CHECK(rig.device.calls().fence_wait_for > waits_before_free);
  CHECK(rig.manager.report().give_backs == 3);
  rig.device.complete_fences();  // the earlier park ends
  CHECK(rig.manager.give_back_all(50000) == GiveBack::done);
  CHECK(rig.device.outstanding_bytes() == 1 * MiB);
  rig.manager.free(b);
  rig.manager.fence_open_frees();  // a parked device passes only fences recorded before this
  rig.device.complete_fences();
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("give_back_all_before_a_host_function_leaves_stream_ordered_frees_behind_a_park") {
  // A cudaFreeAsync on a parked stream: its memory is the stream's until the park ends, as
  // under plain CUDA, so a give-back that waits only for cudaFree fences does not wait for it,
  // while a cudaFree's fence is still waited for and its page returned.
  Rig rig(custom({exclusive(32 * MiB)}), 512, 64 * MiB);
  const StreamToken parked = 0x2000;
  rig.device.park_stream(parked);
  const DevicePtr ordered = rig.reserve(4 * MiB);
  const DevicePtr plain = rig.reserve(8 * MiB);
  REQUIRE((ordered != 0 && plain != 0));
  REQUIRE(rig.manager.free(ordered, parked) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(plain) == FreeOutcome::freed);
  const auto start = std::chrono::steady_clock::now();
  CHECK(rig.manager.give_back_all(2000000, GiveBackWait::cudafree_fences) == GiveBack::done);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  CHECK(rig.device.outstanding_bytes() == 4 * MiB);  // the parked free's page only
  CHECK(rig.manager.report().pending_fence_bytes == 4 * MiB);
  // Waiting for every fence runs out of its bound behind the park.
  CHECK(rig.manager.give_back_all(20000) == GiveBack::timed_out);
  rig.device.complete_fences();
  CHECK(rig.manager.give_back_all(2000000) == GiveBack::done);
  CHECK(rig.device.outstanding_bytes() == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("give_back_all_before_a_park_keeps_pages_a_stream_ordered_free_left_idle") {
  // Under ordered reuse a free gives its slice back at once; a page left idle by a
  // stream-ordered free stays through the give-back before a host function (the plain
  // cudaFreeAsync's memory goes to the stream-ordered pool, not to the driver), through the
  // thread cache too; one left idle by a cudaFree goes back; a later give-back of every idle
  // page returns it.
  Rig rig(custom({exclusive(32 * MiB)}), 512, 64 * MiB, FreeFence::automatic,
          PersistentMode::enabled, /*thread_cache=*/true);
  const StreamToken stream = 0x2000;
  rig.manager.set_stream_ordered(true);
  const DevicePtr ordered = rig.reserve(4 * MiB);
  const DevicePtr plain = rig.reserve(8 * MiB);
  REQUIRE((ordered != 0 && plain != 0));
  REQUIRE(rig.manager.free(ordered, stream) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(plain) == FreeOutcome::freed);
  CHECK(rig.manager.give_back_all(1000000, GiveBackWait::before_park) == GiveBack::done);
  CHECK(rig.device.outstanding_bytes() == 4 * MiB);
  SUBCASE("reused") { CHECK(rig.reserve(4 * MiB) == ordered); }
  SUBCASE("parked in the thread cache and flushed") {
    for (int i = 0; i < 3; ++i) {  // the size joins the cache, and the slice is parked in it
      const DevicePtr again = rig.reserve(4 * MiB);
      REQUIRE(again == ordered);
      REQUIRE(rig.manager.free(again, stream) == FreeOutcome::freed);
    }
    REQUIRE(rig.manager.report().thread_parked_bytes == 4 * MiB);
    CHECK(rig.manager.give_back_all(1000000, GiveBackWait::before_park) != GiveBack::timed_out);
    CHECK(rig.device.outstanding_bytes() == 4 * MiB);
    CHECK(rig.manager.give_back_all(1000000, GiveBackWait::cudafree_fences) == GiveBack::done);
    CHECK(rig.device.outstanding_bytes() == 0);
  }
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("give_back_all_during_a_capture_waits_only_for_fences_recorded_before_it") {
  // The pages' frees are legal during a capture (the release thread's, in relaxed mode), and so
  // is waiting for a fence recorded before it; recording one is not. What a passed fence freed
  // and what is idle goes back; a stream parked before the capture holds its free's page for the
  // bound; a free made during the capture waits for it to end.
  Rig rig(custom({exclusive(32 * MiB)}), 512, 64 * MiB);
  rig.device.set_fence_mode(HostDevice::FenceMode::on_wait);
  const StreamToken parked = 0x2000;
  rig.device.park_stream(parked);
  const DevicePtr idle = rig.reserve(8 * MiB);
  const DevicePtr fenced = rig.reserve(2 * MiB);
  const DevicePtr waiting = rig.reserve(4 * MiB);
  const DevicePtr during = rig.reserve(1 * MiB);
  REQUIRE((idle != 0 && fenced != 0 && waiting != 0 && during != 0));
  REQUIRE(rig.manager.free(idle) == FreeOutcome::freed);
  rig.manager.fence_open_frees();
  rig.device.complete_fences();
  rig.manager.cleanup(false);
  REQUIRE(rig.manager.free(fenced) == FreeOutcome::freed);
  rig.manager.fence_open_frees();  // as a capture's begin does for the frees still open
  REQUIRE(rig.manager.free(waiting, parked) == FreeOutcome::freed);
  rig.device.set_capture_open(true);
  REQUIRE(rig.manager.free(during) == FreeOutcome::freed);
  CHECK(rig.manager.give_back_all(20000) == GiveBack::timed_out);  // behind the park
  CHECK(rig.device.outstanding_bytes() == 5 * MiB);  // the parked free's page and `during`'s
  CHECK(rig.manager.report().pending_fence_bytes == 5 * MiB);
  rig.device.set_capture_open(false);
  rig.device.complete_fences();
  CHECK(rig.manager.give_back_all(1000000) == GiveBack::done);
  CHECK(rig.device.outstanding_bytes() == 0);
  CHECK(rig.manager.check_consistency().empty());
}

}  // TEST_SUITE
