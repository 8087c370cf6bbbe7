// ManagedSlabs over host memory (HostManagedBacking on a HostDevice): the bump-slab contract of
// the second seed (capacity, disjoint aligned allocations, exhaustion, the chain cap's figures,
// live counts, rewinds only when empty, issued_total, bad requests, zero on hand-out, concurrent
// allocation), plus what pointers add (double free, interior pointers, lookups), free fences,
// giving slabs back, device failures, forget() and the report.
#include <doctest/doctest.h>

#include <cstdio>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "managed_test_util.h"
#include "pools/report.h"

using namespace poolcuda;

using test::all_bytes;
using test::Chain;
using test::fill;
using test::kGranule;
using test::kLongWait;
using test::kNoWait;

TEST_SUITE("unit") {

TEST_CASE("managed: allocate within capacity") {
  Chain c(1 * KiB);
  CHECK(c.slabs.slab_size() == 1 * KiB);
  const DevicePtr a = c.allocate(100, 16);
  CHECK(a % 16 == 0);
  const ManagedReport r = c.report();
  REQUIRE(r.slabs.size() == 1);
  CHECK(r.slabs[0].capacity == 1 * KiB);
  CHECK(r.slabs[0].base == a);
  CHECK(r.live_allocations == 1);
}

TEST_CASE("managed: allocations are disjoint and aligned") {
  Chain c(4 * KiB);
  const DevicePtr a = c.allocate(100, 64);
  const DevicePtr b = c.allocate(200, 64);
  CHECK(b >= a + 100);
  CHECK(a % 64 == 0);
  CHECK(b % 64 == 0);
  CHECK(a % kGranule == 0);  // every allocation starts on a granule
  CHECK(b % kGranule == 0);
}

TEST_CASE("managed: exhaustion moves to a new slab") {
  Chain c(1 * KiB);
  const DevicePtr a = c.allocate(512);
  const DevicePtr b = c.allocate(512);  // the first slab is full now
  const DevicePtr d = c.allocate(512);
  CHECK(b == a + 512);
  const ManagedReport r = c.report();
  REQUIRE(r.slabs.size() == 2);
  CHECK(r.slabs[0].live == 2);
  CHECK(r.slabs[1].live == 1);
  CHECK(r.slabs[1].base == d);
  CHECK(c.device.calls().allocate == 2);
}

TEST_CASE("managed: a full chain is too_large with the requested size and the limit") {
  Chain c(1 * KiB, 2);
  for (int i = 0; i < 4; ++i) c.allocate(400);
  const ManagedAllocation full = c.slabs.allocate(1000, kGranule);
  CHECK(full.ptr == 0);
  CHECK(full.error == ManagedError{ManagedErrorKind::too_large, 1000, 2 * KiB});
  CHECK(describe(full.error) ==
        "every slab in use: requested 1000 B, the slabs hold 2048 B in all");
  // Larger than a slab: the limit is the slab.
  const ManagedAllocation huge = c.slabs.allocate(1 * KiB + 1, kGranule);
  CHECK(huge.error == ManagedError{ManagedErrorKind::too_large, 1 * KiB + 1, 1 * KiB});
  CHECK(describe(huge.error) == "larger than a slab: requested 1025 B, slab 1024 B");
  // Nothing changed.
  CHECK(c.report().live_allocations == 4);
  CHECK(c.report().slabs.size() == 2);
}

// Note [Large managed requests].
TEST_CASE("managed: a request above an eighth of a slab takes a slab only if its size fills one") {
  ManagedOptions o = Chain::options(64 * KiB, 8, true, 8);
  o.opening_share = kManagedOpeningShare;  // 8 KiB on these slabs
  HostDevice device(256 * MiB, kGranule);
  HostManagedBacking backing(device);
  ManagedSlabs slabs(backing, o);
  // 40 KiB would leave 24 KiB of a slab: refused, with the largest request that always may take
  // a slab, and nothing taken.
  const ManagedAllocation first = slabs.allocate(40 * KiB, kGranule);
  CHECK(first.ptr == 0);
  CHECK(first.error == ManagedError{ManagedErrorKind::large, 40 * KiB, 8 * KiB});
  CHECK(describe(first.error).find("requested 40960 B, limit 8192 B") != std::string::npos);
  CHECK(device.calls().allocate == 0);
  // At the limit a request takes a slab; a larger one then uses what is left of it.
  REQUIRE(slabs.allocate(8 * KiB, kGranule).ptr != 0);
  REQUIRE(slabs.allocate(40 * KiB, kGranule).ptr != 0);
  const ManagedAllocation no_room = slabs.allocate(40 * KiB, kGranule);  // 16 KiB left
  CHECK(no_room.error.kind == ManagedErrorKind::large);
  CHECK(device.calls().allocate == 1);
  // 16 KiB requests fill a slab exactly: the first takes the 16 KiB left, the next three a new
  // slab.
  for (int i = 0; i < 4; ++i) REQUIRE(slabs.allocate(16 * KiB, kGranule).ptr != 0);
  CHECK(device.calls().allocate == 2);
  CHECK(slabs.report().live_allocations == 6);
}

TEST_CASE("managed: free decrements live") {
  Chain c;
  const DevicePtr a = c.allocate(32);
  CHECK(c.report().live_allocations == 1);
  CHECK(c.slabs.free(a) == FreeOutcome::freed);
  CHECK(c.report().live_allocations == 0);
}

TEST_CASE("managed: a slab rewinds only when nothing in it is live") {
  Chain c(1 * KiB, 1);
  const DevicePtr a = c.allocate(512);
  const DevicePtr b = c.allocate(512);
  CHECK(c.slabs.free(a) == FreeOutcome::freed);
  CHECK(c.slabs.rewind_empty() == 0);  // b is live
  CHECK(c.slabs.allocate(512, kGranule).error.kind == ManagedErrorKind::too_large);
  CHECK(c.slabs.free(b) == FreeOutcome::freed);
  CHECK(c.slabs.rewind_empty() == 1);
  const ManagedReport r = c.report();
  CHECK(r.slabs[0].bump == 0);  // the whole capacity is free again
  CHECK(r.slabs[0].resets == 1);
  CHECK(r.resets == 1);
  CHECK(c.allocate(1 * KiB) == a);  // from the start of the slab, no new slab
  CHECK(c.device.calls().allocate == 1);
}

TEST_CASE("managed: the allocation path rewinds an empty slab instead of growing") {
  Chain c(1 * KiB, 4);
  for (int round = 0; round < 50; ++round) {
    CHECK(c.slabs.free(c.allocate(512)) == FreeOutcome::freed);
  }
  CHECK(c.device.calls().allocate == 1);
  CHECK(c.report().resets == 24);  // two allocations per pass over the slab
}

TEST_CASE("managed: issued_total is sticky across rewinds") {
  Chain c(1 * KiB);
  const DevicePtr a = c.allocate(64);
  const DevicePtr b = c.allocate(64);
  c.slabs.free(a);
  c.slabs.free(b);
  CHECK(c.report().issued_total == 128);
  CHECK(c.slabs.rewind_empty() == 1);
  CHECK(c.report().issued_total == 128);
  c.slabs.trim(kNoWait);
  c.slabs.forget();
  CHECK(c.report().issued_total == 128);
}

TEST_CASE("managed: bad requests are refused and change nothing") {
  Chain c;
  const ManagedError bad{ManagedErrorKind::bad_request, 8, kGranule};
  CHECK(c.slabs.allocate(8, 0).error == bad);            // no alignment
  CHECK(c.slabs.allocate(8, 3).error == bad);            // not a power of two
  CHECK(c.slabs.allocate(8, 2 * kGranule).error == bad);  // above the granule
  CHECK(c.slabs.allocate(8, std::uint64_t{1} << 63).error == bad);
  CHECK(c.slabs.allocate(0, kGranule).error.kind == ManagedErrorKind::bad_request);
  CHECK(c.report().slabs.empty());
  CHECK(c.device.calls().total() == 0);  // not even the first slab
}

TEST_CASE("managed: writes are visible and stay within the allocation") {
  Chain c;
  const DevicePtr a = c.allocate(16, 8);
  const DevicePtr b = c.allocate(16, 8);
  auto* bytes = reinterpret_cast<unsigned char*>(a);
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<unsigned char>(i);
  for (int i = 0; i < 16; ++i) CHECK(bytes[i] == i);
  CHECK(all_bytes(b, 16, 0));
}

TEST_CASE("managed: the first allocation of a fresh slab reads as zero without zeroing") {
  Chain c(64 * KiB);
  const DevicePtr a = c.allocate(4 * KiB);
  CHECK(all_bytes(a, 4 * KiB, 0));
  CHECK(c.backing.zero_calls() == 0);  // above the dirty mark: nothing to zero
}

TEST_CASE("managed: a recycled allocation reads as zero; only the recycled part is zeroed") {
  Chain c(64 * KiB);
  const DevicePtr a = c.allocate(4 * KiB);
  fill(a, 4 * KiB, 0xab);
  CHECK(c.slabs.free(a) == FreeOutcome::freed);
  CHECK(c.slabs.rewind_empty() == 1);
  CHECK(c.report().slabs[0].dirty == 4 * KiB);
  const DevicePtr b = c.allocate(8 * KiB);  // the first half was handed out before
  CHECK(b == a);
  CHECK(all_bytes(b, 8 * KiB, 0));
  CHECK(c.backing.zero_calls() == 1);
  CHECK(c.backing.zero_bytes() == 4 * KiB);
  // Only the requested bytes are zeroed, not the rest of their last granule.
  fill(b, 8 * KiB, 0xcd);
  c.slabs.free(b);
  c.slabs.rewind_empty();
  const DevicePtr d = c.allocate(100);
  CHECK(all_bytes(d, 100, 0));
  CHECK(c.backing.zero_bytes() == 4 * KiB + 100);
}

TEST_CASE("managed: 16 threads x 1000 concurrent allocations are disjoint with exact totals") {
  constexpr int kThreads = 16;
  constexpr int kIterations = 1000;
  constexpr std::uint64_t kSize = 1000;  // two granules each
  Chain c(kThreads * kIterations * 2 * kGranule, 1);
  std::vector<std::vector<DevicePtr>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) got[t].push_back(c.slabs.allocate(kSize, 8).ptr);
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<DevicePtr> all;
  for (const auto& list : got) all.insert(all.end(), list.begin(), list.end());
  REQUIRE(std::count(all.begin(), all.end(), DevicePtr{0}) == 0);
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) REQUIRE(all[i - 1] + kSize <= all[i]);
  ManagedReport r = c.report();
  REQUIRE(r.slabs.size() == 1);
  CHECK(r.slabs[0].bump == kThreads * kIterations * 2 * kGranule);  // no lost or doubled bump
  CHECK(r.live_allocations == kThreads * kIterations);
  CHECK(r.issued_total == kThreads * kIterations * kSize);
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (DevicePtr p : got[t]) CHECK(c.slabs.free(p) == FreeOutcome::freed);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(c.report().live_allocations == 0);
}

TEST_CASE("managed: threads churning across many small slabs never share a byte") {
  constexpr int kThreads = 8;
  Chain c(64 * KiB, 64);
  std::atomic<int> failures{0};
  // Requests the held bound refuses a slab for (Note [Managed held bound]), which the interposer
  // passes to the real call (they stay in the thread's window, as the real allocations would):
  // with slabs this small, an allocation in another slab's last bytes can keep it in use a
  // little longer.
  std::atomic<int> passed_on{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<std::pair<DevicePtr, std::uint64_t>> window;
      const auto mark = static_cast<unsigned char>(t + 1);
      for (int i = 0; i < 3000; ++i) {
        const std::uint64_t size = 1 + random() % (8 * KiB);
        const ManagedAllocation a = c.slabs.allocate(size, kGranule);
        if (a.error.kind == ManagedErrorKind::pinned) {
          ++passed_on;
        } else if (a.ptr == 0 || !all_bytes(a.ptr, size, 0)) {
          ++failures;
        }
        if (a.ptr != 0) fill(a.ptr, size, mark);
        window.emplace_back(a.ptr, size);
        if (window.size() > 8) {
          auto [ptr, bytes] = window.front();
          window.erase(window.begin());
          if (ptr != 0 &&
              (!all_bytes(ptr, bytes, mark) || c.slabs.free(ptr) != FreeOutcome::freed)) {
            ++failures;
          }
        }
      }
      for (auto [ptr, bytes] : window) {
        if (ptr != 0 &&
            (!all_bytes(ptr, bytes, mark) || c.slabs.free(ptr) != FreeOutcome::freed)) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures.load() == 0);
  // Rare, not absent: how many depends on how the threads interleave. Under ThreadSanitizer on
  // 2 cores one CI run in several saw 2.3% (540 of 24,000), and one beside other sanitized tests
  // 6.7% (1,600), so the bound is one in eight: a held bound that refused every slab beyond the
  // first in use passes on about half.
  CHECK(passed_on.load() < kThreads * 3000 / 8);
  const ManagedReport r = c.report();
  CHECK(r.live_allocations == 0);
  CHECK(r.resets > 0);
  CHECK(r.slabs.size() <= 64);
}

TEST_CASE("managed: threads allocate on slabs of their own, share one when the chain is full") {
  auto slab_of_each = [](Chain& c) {
    DevicePtr got[2] = {0, 0};
    for (int t = 0; t < 2; ++t) {  // new threads take consecutive lanes
      std::thread([&, t] { got[t] = c.slabs.allocate(512, kGranule).ptr; }).join();
    }
    REQUIRE(got[0] != 0);
    REQUIRE(got[1] != 0);
    return std::pair{c.slabs.find(got[0]).slab, c.slabs.find(got[1]).slab};
  };
  Chain roomy(64 * KiB, 4);
  auto [first, second] = slab_of_each(roomy);
  CHECK(first != second);
  CHECK(roomy.report().slabs.size() == 2);
  Chain full(1 * KiB, 1);
  auto [one, other] = slab_of_each(full);
  CHECK(one == other);
  CHECK(full.report().live_allocations == 2);
}

TEST_CASE("managed: double free and interior pointers are refused and change nothing") {
  Chain c(64 * KiB);
  const DevicePtr a = c.allocate(1000);
  const DevicePtr b = c.allocate(100);
  CHECK(c.slabs.free(a + 1) == FreeOutcome::interior_pointer);
  CHECK(c.slabs.free(a + kGranule) == FreeOutcome::interior_pointer);  // inside, on a granule
  CHECK(c.slabs.free(b + 8 * kGranule) == FreeOutcome::interior_pointer);  // never issued
  CHECK(c.slabs.free(0x1000) == FreeOutcome::not_mine);
  CHECK(c.report().live_allocations == 2);
  CHECK(c.slabs.free(a) == FreeOutcome::freed);
  CHECK(c.slabs.free(a) == FreeOutcome::double_free);
  CHECK(c.report().live_allocations == 1);
  CHECK(c.slabs.free(b) == FreeOutcome::freed);
  CHECK(c.slabs.free(b) == FreeOutcome::double_free);
  CHECK(c.report().live_allocations == 0);
  // After a rewind the old start was never issued in this round.
  CHECK(c.slabs.rewind_empty() == 1);
  CHECK(c.slabs.free(b) == FreeOutcome::interior_pointer);
}

TEST_CASE("managed: find tells live allocations, free space and foreign pointers apart") {
  Chain c(64 * KiB);
  const DevicePtr a = c.allocate(1000);
  const DevicePtr b = c.allocate(3000);
  ManagedLookup in_b = c.slabs.find(b + 2999);
  CHECK(in_b.kind == ManagedLookup::Kind::live);
  CHECK(in_b.start == b);
  CHECK(in_b.size == 3000);
  CHECK(in_b.slab == a);
  CHECK(in_b.slab_size == 64 * KiB);
  CHECK(c.slabs.find(a).start == a);
  CHECK(c.slabs.find(a + 1000).kind == ManagedLookup::Kind::free_space);  // padding after a
  CHECK(c.slabs.find(b + 3000).kind == ManagedLookup::Kind::free_space);
  CHECK(c.slabs.find(a + 60 * KiB).kind == ManagedLookup::Kind::free_space);
  CHECK(c.slabs.find(a + 64 * KiB).kind == ManagedLookup::Kind::not_mine);
  c.slabs.free(a);
  CHECK(c.slabs.find(a + 10).kind == ManagedLookup::Kind::free_space);
  CHECK(c.slabs.find(b).kind == ManagedLookup::Kind::live);
}

TEST_CASE("managed: an empty slab waits for its free fence; the chain grows meanwhile") {
  Chain c(1 * KiB, 4);
  c.device.set_fence_mode(HostDevice::FenceMode::manual);
  c.slabs.free(c.allocate(1 * KiB));
  const DevicePtr second = c.allocate(1 * KiB);  // the first slab's fence has not passed
  CHECK(c.device.calls().allocate == 2);
  CHECK(c.report().resets == 0);
  c.slabs.free(second);
  c.device.complete_fences();
  // The first slab's fence has passed, so it rewinds; the second's was recorded just now.
  c.allocate(1 * KiB);
  CHECK(c.device.calls().allocate == 2);
  CHECK(c.report().resets == 1);
  CHECK(c.device.outstanding_fences() <= 1);  // each fence is destroyed with its rewind
}

TEST_CASE("managed: a lagging fence is waited for, within a bound, before the chain grows") {
  Chain c(1 * KiB, 4);
  c.device.set_fence_mode(HostDevice::FenceMode::on_wait);  // passes once waited on
  for (int i = 0; i < 10; ++i) c.slabs.free(c.allocate(1 * KiB));
  CHECK(c.device.calls().allocate == 1);
  CHECK(c.device.calls().fence_wait_for == 9);
  CHECK(c.report().resets == 9);
}

TEST_CASE("managed: no free fence under fences off, none while a capture is open") {
  Chain off(1 * KiB, 4, 256 * MiB, /*fences=*/false);
  off.device.set_fence_mode(HostDevice::FenceMode::manual);
  for (int i = 0; i < 5; ++i) off.slabs.free(off.allocate(1 * KiB));
  CHECK(off.device.calls().fence_record == 0);
  CHECK(off.device.calls().allocate == 1);

  Chain capture(1 * KiB, 4);
  capture.device.set_capture_open(true);  // fence_record answers kNoFence
  capture.slabs.free(capture.allocate(1 * KiB));
  capture.slabs.free(capture.allocate(1 * KiB));
  CHECK(capture.device.calls().allocate == 2);
  capture.device.set_capture_open(false);
  capture.allocate(1 * KiB);
  CHECK(capture.device.calls().allocate == 2);
  CHECK(capture.report().resets == 1);
}

// Note [Managed windows]: pairs of kWindowPair bytes, kWindowPairs of them (ten windows' worth),
// on slabs of 64 MiB; churn() returns how far past a slab's base any of them was handed out
// (Span::farthest) and whether each read as zero.
constexpr std::uint64_t kWindowPair = 1 * KiB;
constexpr std::uint64_t kWindowPairs = 10 * kManagedWindow / kWindowPair;

struct Span {
  std::uint64_t farthest = 0;  // bytes past its slab's base the farthest allocation ended
  bool recycled_zero = true;   // every allocation read as zero
};
Span churn(Chain& c, std::uint64_t pairs) {
  Span out;
  for (std::uint64_t i = 0; i < pairs; ++i) {
    const DevicePtr p = c.allocate(kWindowPair);
    out.recycled_zero = out.recycled_zero && all_bytes(p, kWindowPair, 0);
    fill(p, kWindowPair, 0xab);  // what the next user of these bytes must not see
    const ManagedLookup at = c.slabs.find(p);
    out.farthest = std::max(out.farthest, p + kWindowPair - at.slab);
    c.slabs.free(p);
  }
  return out;
}

TEST_CASE("managed windows: with fences off, a slab rewinds at its window's end") {
  Chain c(64 * MiB, 4, 1 * GiB, /*fences=*/false);
  const Span span = churn(c, kWindowPairs);
  CHECK(span.farthest <= kManagedWindow);
  CHECK(span.recycled_zero);
  CHECK(c.device.calls().allocate == 1);
  CHECK(c.report().resets >= 9);
}

TEST_CASE("managed windows: with fences, two slabs take turns, each rewound a window later") {
  Chain c(64 * MiB, 4, 1 * GiB);
  const Span span = churn(c, kWindowPairs);
  CHECK(span.farthest <= kManagedWindow);
  CHECK(span.recycled_zero);
  CHECK(c.device.calls().allocate == 2);  // the second slab is made once
  CHECK(c.report().resets >= 8);
  CHECK(c.device.calls().fence_wait_for == 0);
  CHECK(c.device.outstanding_fences() <= 2);
}

TEST_CASE("managed windows: a window's end never waits for a fence; the window widens") {
  Chain c(64 * MiB, 4, 1 * GiB);
  c.device.set_fence_mode(HostDevice::FenceMode::manual);
  const Span lagging = churn(c, kWindowPairs);
  CHECK(c.device.calls().fence_wait_for == 0);
  CHECK(c.device.calls().allocate == 2);
  CHECK(c.report().resets == 0);
  CHECK(lagging.farthest > 4 * kManagedWindow);  // the windows widened
  // Once the device catches up, the slab left behind rewinds at the next window's end.
  c.device.complete_fences();
  churn(c, kManagedWindow / kWindowPair);
  CHECK(c.report().resets >= 1);
  CHECK(c.device.calls().allocate == 2);
}

TEST_CASE("managed windows: a refused second slab is asked for once; the window widens") {
  Chain c(64 * MiB, 4, /*capacity=*/64 * MiB);  // room for one slab
  const Span span = churn(c, kWindowPairs);
  CHECK(span.recycled_zero);
  CHECK(c.device.calls().allocate == 2);  // the first slab and one refusal
  CHECK(c.report().slabs.size() == 1);
  CHECK(span.farthest > 4 * kManagedWindow);
}

TEST_CASE("managed windows: large requests meet few window ends, each a fence") {
  for (const std::uint64_t size : {512 * KiB, 2 * MiB}) {
    Chain c(64 * MiB, 4, 1 * GiB);
    for (int i = 0; i < 100; ++i) c.slabs.free(c.allocate(size));
    CAPTURE(size);
    CHECK(c.device.calls().fence_record <= 5);
    CHECK(c.device.calls().allocate <= 2);
  }
}

TEST_CASE("managed windows: cycling windows still gives disused slabs back") {
  Chain c(4 * MiB, 32, 1 * GiB, true, /*disuse=*/3);
  std::vector<DevicePtr> burst;
  for (int i = 0; i < 20; ++i) burst.push_back(c.allocate(4 * MiB));
  for (DevicePtr p : burst) c.slabs.free(p);
  CHECK(c.report().slabs.size() == 20);
  for (int i = 0; i < 20 * 1024; ++i) c.slabs.free(c.allocate(1 * KiB));  // 5 slabs' worth
  CHECK(c.report().slabs_released >= 17);
  CHECK(c.report().slabs.size() <= 3);
  CHECK(c.device.outstanding_allocations() == c.report().slabs.size());
}

TEST_CASE("managed windows: after a trim no new spare is made for a disuse period") {
  Chain c(8 * MiB, 4, 1 * GiB, true, /*disuse=*/2);  // a tick every 8 windows
  churn(c, 4 * kManagedWindow / kWindowPair);
  REQUIRE(c.report().slabs.size() == 2);
  CHECK(c.slabs.trim(kLongWait) == 2);  // the spare and the lane's current slab, both empty
  // The next allocation makes a current slab again, but no spare.
  const std::uint64_t made = c.device.calls().allocate + 1;
  const Span span = churn(c, 6 * kManagedWindow / kWindowPair);
  CHECK(c.device.calls().allocate == made);
  CHECK(span.farthest > 4 * kManagedWindow);  // the windows widened instead
  // Three ticks later (the current slab fills and rewinds meanwhile) a spare is made again,
  // and the windows turn once more.
  churn(c, 24 * kManagedWindow / kWindowPair);
  CHECK(c.device.calls().allocate == made + 1);
  const std::uint64_t resets = c.report().resets;
  const Span again = churn(c, 4 * kManagedWindow / kWindowPair);
  CHECK(again.farthest <= kManagedWindow);
  CHECK(c.report().resets >= resets + 3);
}

TEST_CASE("managed windows: with no new slab to be had, a lane takes another lane's spare") {
  Chain c(64 * MiB, 4, /*capacity=*/192 * MiB);  // three slabs
  std::atomic<int> step{0};
  Span span;
  std::uint64_t resets = 0;
  // Two fresh threads, made one after the other, get different lanes (Note [Managed lanes]).
  std::thread first([&] {
    c.slabs.free(c.allocate(kWindowPair));  // slab 0, this lane's current
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    resets = c.report().resets;
    span = churn(c, kWindowPairs);  // its lane has no spare and the device no room
  });
  while (step.load() != 1) std::this_thread::yield();
  std::thread second([&] {
    churn(c, 2 * kManagedWindow / kWindowPair);  // slabs 1 and 2: a current and a spare
    step = 2;
  });
  second.join();
  first.join();
  CHECK(c.device.calls().allocate == 4);  // three slabs and the refused fourth
  CHECK(span.farthest <= kManagedWindow);
  CHECK(c.report().resets >= resets + 8);
}

TEST_CASE("managed windows: while a capture is open, windows widen; they turn again after") {
  Chain c(64 * MiB, 4, 1 * GiB);
  c.device.set_capture_open(true);  // fence_record answers kNoFence
  const Span open = churn(c, kWindowPairs);
  CHECK(open.recycled_zero);
  CHECK(c.report().resets == 0);
  CHECK(c.device.calls().fence_wait_for == 0);
  c.device.set_capture_open(false);
  churn(c, 4 * kManagedWindow / kWindowPair);
  CHECK(c.report().resets >= 1);
  CHECK(c.device.calls().allocate == 2);
}

TEST_CASE("managed windows: a live allocation keeps its slab and its bytes") {
  Chain c(64 * MiB, 4, 1 * GiB);
  const DevicePtr kept = c.allocate(4 * KiB);
  fill(kept, 4 * KiB, 0x5c);
  const Span span = churn(c, kWindowPairs);
  CHECK(span.recycled_zero);
  CHECK(all_bytes(kept, 4 * KiB, 0x5c));
  CHECK(c.slabs.find(kept).kind == ManagedLookup::Kind::live);
  // The first slab never rewound while `kept` lived; the lane moved to slabs of its own.
  const ManagedReport r = c.report();
  REQUIRE(!r.slabs.empty());
  CHECK(r.slabs[0].live == 1);
  CHECK(r.slabs[0].resets == 0);
  CHECK(c.slabs.free(kept) == FreeOutcome::freed);
}

TEST_CASE("managed windows: a request larger than a window opens a window that holds it") {
  Chain c(64 * MiB, /*max_slabs=*/1, 1 * GiB, /*fences=*/false);  // no spare can be made
  const DevicePtr small = c.allocate(kManagedWindow - 4 * KiB);
  const DevicePtr large = c.allocate(2 * kManagedWindow);  // crosses the first window's end
  CHECK(c.slabs.find(large).slab == c.slabs.find(small).slab);
  CHECK(all_bytes(large, 2 * kManagedWindow, 0));
  CHECK(c.device.calls().allocate == 1);
}

TEST_CASE("managed windows: eight threads turning slabs over never share a byte") {
  Chain c(64 * MiB, 24, 4 * GiB);
  constexpr int kThreads = 8;  // two per lane: threads of one lane meet at its windows' ends
  constexpr std::size_t kHeld = 8;  // each thread keeps its last few allocations live
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto mark = static_cast<unsigned char>(0x10 + t);
      std::vector<DevicePtr> held;
      for (std::uint64_t i = 0; i < kWindowPairs / 2; ++i) {
        const ManagedAllocation a = c.slabs.allocate(kWindowPair, kGranule);
        if (a.ptr == 0 || !all_bytes(a.ptr, kWindowPair, 0)) ++failures[t];
        if (a.ptr == 0) continue;
        fill(a.ptr, kWindowPair, mark);
        held.push_back(a.ptr);
        if (held.size() > kHeld) {
          if (!all_bytes(held.front(), kWindowPair, mark)) ++failures[t];
          if (c.slabs.free(held.front()) != FreeOutcome::freed) ++failures[t];
          held.erase(held.begin());
        }
      }
      for (DevicePtr p : held) {
        if (!all_bytes(p, kWindowPair, mark) || c.slabs.free(p) != FreeOutcome::freed) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) CHECK(failures[t] == 0);
  CHECK(c.report().live_allocations == 0);
  CHECK(c.report().resets > 0);
}

TEST_CASE("managed: empty slabs go back after disuse (not the current one) and on trim (all)") {
  Chain c(1 * KiB, 8, 256 * MiB, true, /*disuse=*/3);
  std::vector<DevicePtr> burst;
  for (int i = 0; i < 8; ++i) burst.push_back(c.allocate(512));
  CHECK(c.report().slabs.size() == 4);
  for (DevicePtr p : burst) c.slabs.free(p);
  for (int i = 0; i < 20; ++i) c.slabs.free(c.allocate(512));
  CHECK(c.report().slabs.size() == 1);
  CHECK(c.device.outstanding_allocations() == 1);
  CHECK(c.report().slabs_released == 3);

  Chain t(1 * KiB, 8);
  burst.clear();
  for (int i = 0; i < 6; ++i) burst.push_back(t.allocate(512));
  t.slabs.free(burst[0]);  // the first slab still holds burst[1]
  for (int i = 2; i < 6; ++i) t.slabs.free(burst[i]);
  CHECK(t.slabs.trim(kLongWait) == 2);  // the second slab and the third, the lane's current one
  CHECK(t.report().slabs.size() == 1);
  t.slabs.free(burst[1]);
  CHECK(t.slabs.trim(kLongWait) == 1);
  CHECK(t.device.outstanding_allocations() == 0);
  CHECK(t.device.bad_releases() == 0);
  // The lane's next allocation finds its current slab sealed and gets a new one.
  const DevicePtr after = t.allocate(512);
  CHECK(after != 0);
  CHECK(t.device.outstanding_allocations() == 1);
  t.slabs.free(after);

  // A trim waits for a fence that lags.
  Chain lag(1 * KiB, 8);
  lag.device.set_fence_mode(HostDevice::FenceMode::on_wait);  // passes when waited on
  burst.clear();
  for (int i = 0; i < 4; ++i) burst.push_back(lag.allocate(512));
  for (DevicePtr p : burst) lag.slabs.free(p);
  CHECK(lag.slabs.trim(kLongWait) == 2);
  CHECK(lag.device.outstanding_allocations() == 0);

  // Behind a parked stream it waits only as long as it was told, and gives back nothing.
  Chain parked(1 * KiB, 8);
  parked.device.set_fence_mode(HostDevice::FenceMode::parked);
  burst.clear();
  for (int i = 0; i < 4; ++i) burst.push_back(parked.allocate(512));
  for (DevicePtr p : burst) parked.slabs.free(p);
  CHECK(parked.slabs.trim(20000) == 0);
  CHECK(parked.device.outstanding_allocations() == 2);
  parked.device.complete_fences();  // the park is lifted
  CHECK(parked.slabs.trim(kLongWait) == 2);
  CHECK(parked.device.outstanding_allocations() == 0);
}

TEST_CASE("managed: device failures become errors that change nothing") {
  Chain c(1 * KiB, 4);
  c.device.fail_nth_allocation(1, AllocStatus::out_of_memory);
  CHECK(c.slabs.allocate(100, kGranule).error ==
        ManagedError{ManagedErrorKind::out_of_memory, 100, 1 * KiB});
  c.device.fail_nth_allocation(1, AllocStatus::failed);
  CHECK(c.slabs.allocate(100, kGranule).error.kind == ManagedErrorKind::device_error);
  CHECK(c.report().slabs.empty());

  // Zeroing fails: the allocation is refused and nothing is live.
  const DevicePtr a = c.allocate(1 * KiB);
  fill(a, 1 * KiB, 0x11);
  c.slabs.free(a);
  c.slabs.rewind_empty();
  c.backing.fail_zeroing(true);
  CHECK(c.slabs.allocate(100, kGranule).error.kind == ManagedErrorKind::device_error);
  CHECK(c.report().live_allocations == 0);
  c.backing.fail_zeroing(false);
  const DevicePtr b = c.allocate(100);
  CHECK(all_bytes(b, 100, 0));
}

TEST_CASE("managed: forget drops every slab without releasing it; no new one until thawed") {
  Chain c(1 * KiB, 4);
  const DevicePtr a = c.allocate(1 * KiB);
  c.allocate(1 * KiB);
  c.slabs.freeze();
  c.slabs.forget();
  CHECK(c.report().slabs.empty());
  CHECK(c.device.calls().release == 0);
  CHECK(c.slabs.free(a) == FreeOutcome::not_mine);
  CHECK(c.report().issued_total == 2 * KiB);
  // Frozen: a slab made now could be gone with the reset (Note [Managed reset]).
  CHECK(c.slabs.allocate(100, kGranule).error.kind == ManagedErrorKind::device_error);
  CHECK(c.device.calls().allocate == 2);
  c.slabs.thaw();
  c.allocate(100);  // usable again, on a new slab
  CHECK(c.device.calls().allocate == 3);
}

TEST_CASE("managed: a reset's late thaw leaves the chain frozen for the next reset") {
  // Two resets, the first thawed only after the second froze the chain (a free from before the
  // first was still on its way to the driver): no slab until the second thaws too.
  Chain c(1 * KiB, 4);
  c.allocate(1 * KiB);
  c.slabs.freeze();
  c.slabs.forget();
  c.slabs.freeze();
  c.slabs.forget();
  c.slabs.thaw();  // the first reset's
  CHECK(c.slabs.allocate(100, kGranule).error.kind == ManagedErrorKind::device_error);
  CHECK(c.device.calls().allocate == 1);
  c.slabs.thaw();  // the second's
  c.allocate(100);
  CHECK(c.device.calls().allocate == 2);
}

TEST_CASE("managed: forget waits for allocations that passed their slab's check") {
  // Four threads allocate and free recycled memory (zeroed when handed out again) while another
  // thread resets: forgets, releases the forgotten slabs behind the chain's back as the reset
  // frees them, forgets again and thaws. No allocation may zero memory after its slab went.
  Chain c(64 * KiB, 8, 1 * GiB);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> served{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        const ManagedAllocation a = c.slabs.allocate(4 * KiB, kGranule);
        if (a.ptr == 0) continue;
        ++served;
        c.slabs.free(a.ptr);
      }
    });
  }
  for (int round = 0; round < 200; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const ManagedReport before = c.report();
    c.slabs.freeze();
    c.slabs.forget();
    for (const ManagedSlabReport& slab : before.slabs) {
      if (c.device.owns(slab.base)) c.device.release(slab.base, slab.capacity);  // not retired
    }
    c.slabs.forget();
    c.slabs.thaw();
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  CHECK(served.load() > 0);
  CHECK(c.backing.stale_zeroes() == 0);
}

TEST_CASE("managed: the report section in text and JSON") {
  Chain c(1 * KiB, 4);
  const DevicePtr a = c.allocate(100);
  c.allocate(600);
  c.slabs.free(a);
  const ManagedReport r = c.report();
  CHECK(r.slab_size == 1 * KiB);
  CHECK(r.max_slabs == 4);
  CHECK(r.slabs_allocated == 2);
  CHECK(r.live_allocations == 1);
  CHECK(r.issued_total == 700);
  ReportDocument doc;
  doc.devices.push_back(ReportSection{"device", "device 0", {}, {}, {}});
  doc.devices.back().sections.push_back(describe(r));
  const std::string text = render(doc, ReportFormat::text);
  CHECK(text.find("managed slabs: slab 1.00 KiB, live 1, issued 700 B, rewinds 0") !=
        std::string::npos);
  CHECK(text.find("base  capacity  handed out  live  rewinds") != std::string::npos);
  CHECK(text.find("dirty") == std::string::npos);  // wide only
  CHECK(render(doc, ReportFormat::wide).find("slabs allocated 2") != std::string::npos);
  const std::string json = render(doc, ReportFormat::json);
  CHECK(json.find("\"managed\":{\"slab_size\":1024,\"max_slabs\":4,\"live_allocations\":1,"
                  "\"issued_total\":700,") != std::string::npos);
  char base[80];
  std::snprintf(base, sizeof base, "\"slabs\":[{\"base\":\"0x%llx\",\"capacity\":1024,",
                static_cast<unsigned long long>(r.slabs.front().base));
  CHECK(json.find(base) != std::string::npos);
}

}  // TEST_SUITE
