// The bound on fence-pending memory (Note [Free fences]): a host that runs ahead of the device
// and allocates and frees the same size again and again must not make the pools grow without
// bound. Fences here pass only when the test completes them or the manager waits on them
// (HostDevice on_wait mode), which is a device that never catches up by itself but reaches a
// fence within the wait's bound: the worst case the bound is meant for. A device whose fences
// do not pass while the manager waits (manual, parked) must never block a reservation for
// longer than the bound: the pool grows instead.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "pools/manager_impl.h"
#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

constexpr std::uint64_t kPage = 64 * KiB;
constexpr std::uint64_t kSize = 4 * KiB;  // 16 slices per page

// A manager over a HostDevice whose fences pass only when waited on or at complete_fences().
struct BoundRig {
  explicit BoundRig(std::uint64_t slack, PoolLayout layout = custom({sliced(kPage)}),
                    HostDevice::FenceMode mode = HostDevice::FenceMode::on_wait)
      : device(256 * MiB, 512), manager(device, options(slack, std::move(layout))) {
    device.set_fence_mode(mode);
  }

  static ManagerOptions options(std::uint64_t slack, PoolLayout layout) {
    ManagerOptions o;
    o.layout = std::move(layout);
    o.fence_slack = slack;
    o.prompt_fence_nanos = std::uint64_t{1} << 63;  // epochs close by count, bytes and misses only
    o.log = LogLevel::off;
    return o;
  }

  struct Peaks {
    std::uint64_t reserved = 0;
    std::uint64_t pending = 0;
  };

  // Allocates and frees `size` `rounds` times; checks the invariants now and then.
  Peaks churn(int rounds, std::uint64_t size = kSize) {
    Peaks peaks;
    for (int i = 0; i < rounds; ++i) {
      const Reservation r = manager.allocate(size);
      REQUIRE(r.ptr != 0);
      peaks.reserved = std::max(peaks.reserved, manager.memory_usage().bytes_reserved);
      REQUIRE(manager.free(r.ptr) == FreeOutcome::freed);
      peaks.pending = std::max(peaks.pending, manager.report().pending_fence_bytes);
      if (i % 500 == 0) REQUIRE(manager.check_consistency().empty());
    }
    return peaks;
  }

  // Everything back to the device: nothing leaked, no release of a wrong size.
  void check_clean_exit(const std::vector<DevicePtr>& live = {}) {
    for (DevicePtr p : live) CHECK(manager.free(p) == FreeOutcome::freed);
    CHECK(manager.drain_fences());
    CHECK(manager.check_consistency().empty());
    CHECK(manager.memory_usage().bytes_in_use == 0);
    CHECK(manager.report().pending_fence_bytes == 0);
    manager.cleanup(true);
    CHECK(device.outstanding_allocations() == 0);
    CHECK(device.outstanding_fences() == 0);
    CHECK(device.bad_releases() == 0);
  }

  HostDevice device;
  MemoryManager manager;
};

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("fence_bound_keeps_a_host_ahead_loop_bounded") {
  constexpr std::uint64_t kSlack = 256 * KiB;
  BoundRig rig(kSlack);
  const BoundRig::Peaks peaks = rig.churn(10000);
  // Growth happens only with pending <= slack and no free memory left: one more page at most.
  CHECK(peaks.reserved <= kSlack + kPage + kSize);
  CHECK(peaks.pending <= kSlack + kPage);
  CHECK(rig.device.calls().fence_wait_for > 0);
  CHECK(rig.device.calls().fence_wait == 0);  // the allocation path never waits unbounded
  CHECK(rig.manager.fence_waits() == rig.device.calls().fence_wait_for);
  CHECK(rig.manager.fence_wait_timeouts() == 0);
  // Each wait gives back a whole epoch (here a page of frees, since every miss closes one):
  // at most one wait per 16 pairs, on a device that never catches up by itself.
  CHECK(rig.manager.fence_waits() <= 10000 / 16 + 1);
  rig.check_clean_exit();
}

TEST_CASE("fence_bound_the_slack_sets_how_far_the_host_may_run_ahead") {
  // The same loop with a larger slack reserves more before it waits: the slack is what bounds.
  BoundRig small(128 * KiB), large(2 * MiB);
  const auto a = small.churn(10000), b = large.churn(10000);
  CHECK(a.reserved <= 128 * KiB + kPage + kSize);
  CHECK(b.reserved <= 2 * MiB + kPage + kSize);
  CHECK(b.reserved > 1 * MiB);
  CHECK(large.manager.fence_waits() < small.manager.fence_waits());
  small.check_clean_exit();
  large.check_clean_exit();
}

TEST_CASE("fence_bound_is_strict_pending_equal_to_the_slack_grows") {
  // 16 frees fill a page with pending slices; the 17th reservation misses with 64 KiB pending.
  BoundRig at(16 * kSize), below(16 * kSize - 1);
  at.churn(17);
  below.churn(17);
  CHECK(at.manager.pages().size() == 2);
  CHECK(at.device.calls().fence_wait_for == 0);
  CHECK(below.manager.pages().size() == 1);
  CHECK(below.manager.fence_waits() == 1);
  at.check_clean_exit();
  below.check_clean_exit();
}

TEST_CASE("fence_slack_zero_holds_at_most_one_page_beyond_the_live_set") {
  BoundRig rig(0);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 20; ++i) live.push_back(rig.manager.allocate(kSize).ptr);
  const std::uint64_t in_use = rig.manager.memory_usage().bytes_in_use;
  REQUIRE(in_use == 20 * kSize);
  const BoundRig::Peaks peaks = rig.churn(10000);
  // The live set takes two pages (one partly); the churn never adds a third.
  CHECK(peaks.reserved <= 2 * kPage + kPage);
  CHECK(rig.manager.pages().size() <= 3);
  CHECK(rig.manager.fence_waits() > 0);
  rig.check_clean_exit(live);
}

TEST_CASE("fence_slack_zero_never_grows_while_a_closed_epoch_is_pending") {
  BoundRig rig(0);
  const DevicePtr a = rig.manager.allocate(kPage).ptr;  // one page, one slice
  rig.manager.free(a);
  // The miss closes the epoch; its fence has not passed; slack 0: wait, then reuse.
  CHECK(rig.manager.allocate(kPage).ptr == a);
  CHECK(rig.manager.pages().size() == 1);
  CHECK(rig.device.calls().allocate == 1);
  CHECK(rig.manager.fence_waits() == 1);
  rig.check_clean_exit({a});
}

TEST_CASE("fence_bound_grows_with_the_live_set") {
  // 8 MiB live in an exclusive pool: the bound is max(64 KiB, 8 MiB / 8) = 1 MiB.
  constexpr std::uint64_t kSlack = 64 * KiB;
  BoundRig rig(kSlack, custom({sliced(kPage), exclusive(16 * MiB)}));
  std::vector<DevicePtr> live;
  for (int i = 0; i < 8; ++i) live.push_back(rig.manager.allocate(1 * MiB).ptr);
  const BoundRig::Peaks peaks = rig.churn(10000);
  CHECK(peaks.pending > kSlack + kPage);  // ran ahead further than the slack alone allows
  CHECK(peaks.pending <= 1 * MiB + kPage);
  CHECK(peaks.reserved <= 8 * MiB + 1 * MiB + kPage + kSize);
  CHECK(rig.manager.fence_waits() > 0);
  rig.check_clean_exit(live);
}

TEST_CASE("fence_bound_refused_fence_grows_instead_of_blocking") {
  // A capture is open: the open epoch cannot be closed, so there is nothing to wait on.
  BoundRig rig(0);
  rig.device.set_capture_open(true);
  const BoundRig::Peaks peaks = rig.churn(200);
  CHECK(rig.device.calls().fence_wait_for == 0);
  CHECK(rig.manager.fence_waits() == 0);
  CHECK(peaks.reserved >= 199 * kSize);  // every free stayed pending: the pool grew
  CHECK(rig.manager.report().pending_fence_bytes == 200 * kSize);
  // The capture ends: the next miss closes the epoch and the bound applies again.
  rig.device.set_capture_open(false);
  const std::uint64_t pages = rig.manager.pages().size();
  rig.churn(1000);
  CHECK(rig.manager.pages().size() == pages);
  CHECK(rig.manager.fence_waits() > 0);
  rig.check_clean_exit();
}

TEST_CASE("fence_bound_refused_fence_does_not_wait_for_older_epochs") {
  BoundRig rig(0);
  std::vector<DevicePtr> page;
  for (int i = 0; i < 16; ++i) page.push_back(rig.manager.allocate(kSize).ptr);
  REQUIRE(rig.manager.pages().size() == 1);
  for (int i = 0; i < 8; ++i) rig.manager.free(page[i]);
  rig.manager.cleanup(true);  // closes an epoch of 8 slices; its fence has not passed
  for (int i = 8; i < 16; ++i) rig.manager.free(page[i]);  // the open epoch: 8 more
  rig.device.set_capture_open(true);
  const DevicePtr grown = rig.manager.allocate(kSize).ptr;
  CHECK(grown != 0);
  CHECK(rig.device.calls().fence_wait_for == 0);
  CHECK(rig.manager.pages().size() == 2);
  rig.device.set_capture_open(false);
  rig.check_clean_exit({grown});
}

TEST_CASE("fence_bound_applies_in_a_persistent_window") {
  constexpr std::uint64_t kSlack = 128 * KiB;
  BoundRig rig(kSlack);
  rig.manager.set_mode(AllocationMode::persistent);
  const BoundRig::Peaks peaks = rig.churn(10000);
  CHECK(peaks.reserved <= kSlack + 2 * kSize);
  CHECK(rig.manager.report().persistent.bytes_reserved == peaks.reserved);
  CHECK(rig.manager.fence_waits() > 0);
  rig.manager.set_mode(AllocationMode::automatic);
  rig.check_clean_exit();
}

TEST_CASE("persistent_miss_reaps_passed_fences_before_growing") {
  BoundRig rig(64 * MiB);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr a = rig.manager.allocate(kSize).ptr;
  rig.manager.free(a);
  rig.manager.cleanup(true);  // closes the epoch: one fence, not passed
  rig.device.complete_fences();
  // The miss reaps the passed fence and reuses the slice: no growth, no wait.
  CHECK(rig.manager.allocate(kSize).ptr == a);
  CHECK(rig.device.calls().allocate == 1);
  CHECK(rig.device.calls().fence_wait_for == 0);
  rig.manager.set_mode(AllocationMode::automatic);
  rig.check_clean_exit({a});
}

TEST_CASE("fence_bound_leaves_free_fence_none_and_sync_alone") {
  for (FreeFence mode : {FreeFence::none, FreeFence::sync}) {
    HostDevice device(64 * MiB, 512);
    device.set_fence_mode(HostDevice::FenceMode::on_wait);
    ManagerOptions o = BoundRig::options(0, custom({sliced(kPage)}));
    o.free_fence = mode;
    MemoryManager manager(device, o);
    for (int i = 0; i < 1000; ++i) manager.free(manager.allocate(kSize).ptr);
    CHECK(manager.pages().size() == 1);
    CHECK(device.calls().fence_record == 0);
    CHECK(manager.fence_waits() == 0);
  }
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Releases a parked device after `after` unless the test finished first, so that a manager
// which waits without limit shows up as a slow reservation, not as a hung test.
struct Unparker {
  Unparker(HostDevice& device, std::chrono::milliseconds after)
      : thread([&device, after, this] {
          const Clock::time_point deadline = Clock::now() + after;
          while (!done.load() && Clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          device.complete_fences();
        }) {}
  ~Unparker() {
    done.store(true);
    thread.join();
  }
  std::atomic<bool> done{false};
  std::thread thread;
};

TEST_CASE("fence_bound_a_fence_that_never_passes_grows_within_the_time_bound") {
  // A stream parked by a host function that only this thread would release: the oldest fence
  // cannot pass while the reservation waits. Slack 0 puts every miss over the bound.
  BoundRig rig(0, custom({sliced(kPage)}), HostDevice::FenceMode::parked);
  Unparker unparker(rig.device, std::chrono::seconds(5));
  const DevicePtr a = rig.manager.allocate(kPage).ptr;
  REQUIRE(rig.manager.free(a) == FreeOutcome::freed);
  const Clock::time_point start = Clock::now();
  const DevicePtr b = rig.manager.allocate(kPage).ptr;
  const double took = seconds_since(start);
  CHECK(took < 1.0);  // the bound is 2 ms; generous for a loaded machine, far below 5 s
  CHECK(b != 0);
  CHECK(b != a);  // the pool grew
  CHECK(rig.manager.pages().size() == 2);
  CHECK(rig.device.calls().fence_wait == 0);
  CHECK(rig.device.calls().fence_wait_for == 1);
  CHECK(rig.manager.fence_waits() == 1);
  CHECK(rig.manager.fence_wait_timeouts() == 1);
  CHECK(rig.manager.report().pending_fence_bytes == kPage);
  CHECK(rig.manager.check_consistency().empty());
  // The host function returns: the stream runs on, and later fences pass when waited on.
  rig.device.complete_fences();
  rig.device.set_fence_mode(HostDevice::FenceMode::on_wait);
  rig.check_clean_exit({b});
}

TEST_CASE("fence_bound_stuck_fences_throttle_growth_but_never_block") {
  // Fences never pass by themselves (manual mode: only a fence_wait or complete_fences passes
  // them). Every over-bound miss waits the full bound once, then grows one page.
  BoundRig rig(0, custom({sliced(kPage)}), HostDevice::FenceMode::manual);
  constexpr int kRounds = 16 * 40;  // 40 pages of frees
  const Clock::time_point start = Clock::now();
  const BoundRig::Peaks peaks = rig.churn(kRounds);
  const double took = seconds_since(start);
  CHECK(rig.device.calls().fence_wait == 0);
  CHECK(rig.manager.fence_waits() > 0);
  CHECK(rig.manager.fence_wait_timeouts() == rig.manager.fence_waits());
  // One wait per growth at most: the reservation that grows does not wait again.
  CHECK(rig.manager.fence_waits() <= rig.manager.pages().size());
  CHECK(peaks.reserved <= kRounds * kSize + kPage);
  // Each wait costs the bound (2 ms), no more: far below what an unbounded wait would take.
  CHECK(took < 0.002 * static_cast<double>(rig.manager.fence_waits()) + 2.0);
  CHECK(took >= 0.0019 * static_cast<double>(rig.manager.fence_waits()));
  rig.check_clean_exit();  // drain_fences() waits without limit, which passes manual fences
}

}  // TEST_SUITE

TEST_SUITE("unit") {

// Epochs also close by bytes (a quarter of fence_slack, at least 1 MiB): by the time the bound
// needs memory back, the oldest fences were recorded long ago and a miss reaps instead of waiting.
TEST_CASE("fence_epochs_close_by_bytes_before_the_batch_count") {
  constexpr std::uint64_t kSlack = 8 * MiB;
  BoundRig rig(kSlack, custom({sliced(4 * MiB)}), HostDevice::FenceMode::immediate);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 16; ++i) live.push_back(rig.manager.allocate(512 * KiB).ptr);
  const std::uint64_t before = rig.device.calls().fence_record;
  // 16 frees of 512 KiB: far below the 256-free batch, but 8 MiB, so four epochs of 2 MiB close.
  for (DevicePtr p : live) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.device.calls().fence_record - before == 4);
  CHECK(rig.manager.check_consistency().empty());
  rig.check_clean_exit();
}


// The bound on pages on their way to the driver (Note [Releases before growth]): a device whose
// released pages arrive only when the manager flushes, as when the release worker lags.
class LaggingReleases final : public HeldReleases {
 public:
  using HeldReleases::HeldReleases;
  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override {
    const AllocStatus status = inner_.allocate(size, out);
    peak = std::max(peak, inner_.outstanding_bytes());
    return status;
  }
  std::uint64_t peak = 0;
  bool stuck = false;    // the pages never arrive: the first one's free never returns
  std::uint64_t stuck_release = 1;  // that free's number
  bool slow = false;     // they arrive, but not within a growth's short wait
  bool trickle = false;  // one page arrives during each wait, the others later
  // The page inside the driver's free: the first one for good while stuck; while trickling,
  // each page in turn (a new one after every delivery).
  std::uint64_t release_in_flight() override {
    if (releasing_bytes() == 0) return 0;
    if (stuck) return stuck_release;
    return trickle ? 100 + static_cast<std::uint64_t>(delivered) : 0;
  }

 protected:
  // A growth waits at most 2 ms; out-of-memory recovery, seconds. Stuck and trickling waits
  // take their whole time, as the real ones would.
  bool arrive(std::uint32_t max_microseconds) override {
    if (stuck || trickle) std::this_thread::sleep_for(std::chrono::microseconds(max_microseconds));
    if (trickle && !stuck && releasing_bytes() != 0) {
      deliver_oldest();
      return false;
    }
    return !stuck && !(slow && max_microseconds <= 2000);
  }
};

struct LagRig {
  explicit LagRig(std::uint64_t capacity = 256 * MiB)
      : host(capacity, 512), device(host), manager(device, options()) {}
  static ManagerOptions options() {
    ManagerOptions o = BoundRig::options(MiB, custom({exclusive(64 * MiB)}));
    o.free_fence = FreeFence::none;
    return o;
  }
  // A page of `size` is allocated, freed and given back: it is now on its way to the driver.
  void give_back_a_page(std::uint64_t size) {
    const DevicePtr p = manager.allocate(size).ptr;
    REQUIRE(p != 0);
    REQUIRE(manager.free(p) == FreeOutcome::freed);
    manager.cleanup(true);
    REQUIRE(device.releasing_bytes() == size);
  }
  HostDevice host;
  LaggingReleases device;
  MemoryManager manager;
};

TEST_CASE("a growth first waits for the pages on their way to the driver") {
  LagRig rig;
  rig.give_back_a_page(8 * MiB);
  const int flushes = rig.device.flushes;
  const DevicePtr p = rig.manager.allocate(8 * MiB).ptr;
  REQUIRE(p != 0);
  CHECK(rig.device.flushes == flushes + 1);
  CHECK(rig.device.peak == 8 * MiB);  // never both pages at once
  // Below the bound, a growth does not wait.
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  rig.manager.cleanup(true);
  rig.device.flush_releases(0);
  const DevicePtr small = rig.manager.allocate(512 * KiB).ptr;
  REQUIRE(small != 0);
  REQUIRE(rig.manager.free(small) == FreeOutcome::freed);
  rig.manager.cleanup(true);
  const int before = rig.device.flushes;
  CHECK(rig.manager.allocate(8 * MiB).ptr != 0);
  CHECK(rig.device.flushes == before);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("growths stop waiting for released pages once the same free stays stuck") {
  LagRig rig;
  rig.give_back_a_page(8 * MiB);
  rig.device.stuck = true;  // the free waits behind a parked stream; each wait runs out in full
  // Each growth has the stuck page on its way, over the bound (an eighth of at most 61 MiB in
  // use): without the rule every one would wait. With it, waits of 2 ms until they have seen
  // the same free inside for kStuckReleaseMicros, then none.
  const int most = static_cast<int>(kStuckReleaseMicros / kFenceWaitBoundMicros) + 1;
  const int growths = most + 4;
  std::vector<DevicePtr> grown;
  auto grow = [&] {
    const int before = rig.device.flushes;
    for (int i = 0; i < growths; ++i) {
      grown.push_back(rig.manager.allocate(MiB).ptr);
      REQUIRE(grown.back() != 0);  // it grew anyway, after any wait ran out
    }
    return rig.device.flushes - before;
  };
  int waits = grow();
  CHECK(waits >= 1);
  CHECK(waits <= most);
  // That free returns and the next one sticks: it is timed on its own.
  rig.device.stuck_release = 2;
  waits = grow();
  CHECK(waits >= 1);
  CHECK(waits <= most);
  // The free returns: the next growth waits again, and the page arrives.
  rig.device.stuck = false;
  const int before = rig.device.flushes;
  grown.push_back(rig.manager.allocate(MiB).ptr);
  CHECK(grown.back() != 0);
  CHECK(rig.device.flushes == before + 1);
  CHECK(rig.device.releasing_bytes() == 0);
  for (DevicePtr p : grown) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a release thread that keeps moving keeps growths waiting, however long it takes") {
  // Each wait runs out in full with one page arriving: slow, never stuck. Past
  // kStuckReleaseMicros of such waits, every growth must still wait for the pages.
  LagRig rig;
  std::vector<DevicePtr> given;
  for (int i = 0; i < 40; ++i) given.push_back(rig.manager.allocate(MiB).ptr);
  for (DevicePtr p : given) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  rig.manager.cleanup(true);
  REQUIRE(rig.device.releasing_bytes() == 40 * MiB);
  rig.device.trickle = true;
  const int flushes = rig.device.flushes;
  const int growths = static_cast<int>(kStuckReleaseMicros / kFenceWaitBoundMicros) + 5;
  std::vector<DevicePtr> grown;
  for (int i = 0; i < growths; ++i) {
    const DevicePtr p = rig.manager.allocate(MiB).ptr;
    REQUIRE(p != 0);
    grown.push_back(p);
  }
  CHECK(rig.device.flushes == flushes + growths);
  CHECK(rig.device.releasing_bytes() == static_cast<std::uint64_t>(40 - growths) * MiB);
  rig.device.trickle = false;
  for (DevicePtr p : grown) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a wait for released pages that runs out while pages arrive is repeated") {
  // The release thread is slow, not stuck (the program keeps the cores busy): each growth's
  // wait lets one page through. Every growth must keep waiting, or the backlog grows unchecked.
  LagRig rig;
  DevicePtr given[3];
  for (DevicePtr& p : given) p = rig.manager.allocate(8 * MiB).ptr;
  for (DevicePtr p : given) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  rig.manager.cleanup(true);
  REQUIRE(rig.device.releasing_bytes() == 24 * MiB);
  rig.device.trickle = true;
  const int flushes = rig.device.flushes;
  const DevicePtr first = rig.manager.allocate(8 * MiB).ptr;
  CHECK(first != 0);
  CHECK(rig.device.flushes == flushes + 1);
  CHECK(rig.device.releasing_bytes() == 16 * MiB);
  const DevicePtr second = rig.manager.allocate(8 * MiB).ptr;
  CHECK(second != 0);
  CHECK(rig.device.flushes == flushes + 2);  // waited again: a page arrived during the last
  CHECK(rig.device.releasing_bytes() == 8 * MiB);
  CHECK(rig.device.peak == 24 * MiB);  // never a new page beside all three old ones
  CHECK(rig.manager.free(first) == FreeOutcome::freed);
  CHECK(rig.manager.free(second) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a wait that runs out before the release thread starts a page is repeated") {
  // The release thread never got a core during the wait: nothing is stuck, so the next growth
  // waits again (and gives it one) instead of growing beside an ever longer backlog.
  LagRig rig;
  rig.give_back_a_page(8 * MiB);
  rig.device.slow = true;
  const int flushes = rig.device.flushes;
  const DevicePtr first = rig.manager.allocate(8 * MiB).ptr;
  CHECK(first != 0);
  const DevicePtr second = rig.manager.allocate(8 * MiB).ptr;
  CHECK(second != 0);
  CHECK(rig.device.flushes == flushes + 2);
  rig.device.slow = false;
  CHECK(rig.manager.free(first) == FreeOutcome::freed);
  CHECK(rig.manager.free(second) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a growth's wait that runs out does not keep out-of-memory recovery from waiting") {
  LagRig rig(16 * MiB);
  rig.give_back_a_page(8 * MiB);
  rig.device.slow = true;  // the release thread needs longer than a growth waits
  const DevicePtr first = rig.manager.allocate(8 * MiB).ptr;
  REQUIRE(first != 0);  // the growth's wait ran out; the device had room beside the old page
  // No room now until the old page arrives: recovery must wait for it, not take the growth's
  // short wait for a stream parked for good.
  const DevicePtr second = rig.manager.allocate(8 * MiB).ptr;
  CHECK(second != 0);
  CHECK(rig.manager.report().oom_failures == 0);
  CHECK(rig.manager.free(first) == FreeOutcome::freed);
  CHECK(rig.manager.free(second) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}
}  // TEST_SUITE
