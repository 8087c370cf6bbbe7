// The managed chain's held bound (Note [Managed held bound] in pools/managed_bound.cpp), over
// host memory: a program that keeps one small allocation per slab's worth of churn no longer
// makes the chain take a slab per round (the requests the bound refuses fail with `pinned`, for
// the interposer to pass to the real call), slabs half full of live bytes are never refused, a
// refused request waits for no fence, the live bytes follow frees, a trim still gives every
// empty slab back, and four threads that each keep a few allocations are never refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "managed_test_util.h"

using namespace poolcuda;

using test::Chain;
using test::kGranule;
using test::kLongWait;

namespace {

// Bytes in whole granules: what an allocation takes of a slab.
std::uint64_t granules_of(std::uint64_t size) {
  return (size + kGranule - 1) / kGranule * kGranule;
}

// Slabs holding a live allocation, from the report.
std::uint64_t slabs_with_live(const Chain& c) {
  std::uint64_t count = 0;
  for (const ManagedSlabReport& slab : c.report().slabs) count += slab.live != 0 ? 1 : 0;
  return count;
}

// Churn in rounds: `per_round` allocations of `size` each, all live until the round ends, then
// all freed but the first. A request refused a slab is what the interposer would pass to the
// real call: counted, not kept.
struct Churn {
  std::vector<DevicePtr> kept;
  std::uint64_t passed_on = 0;
  std::uint64_t peak_live = 0;    // the most live bytes (in whole granules) in slabs
  std::uint64_t peak_in_use = 0;  // the most slabs holding a live allocation at once
  ManagedError refusal;
};

Churn keep_one_per_round(Chain& c, int rounds, int per_round, std::uint64_t size) {
  Churn out;
  std::uint64_t live = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<DevicePtr> round;
    for (int i = 0; i < per_round; ++i) {
      const ManagedAllocation a = c.slabs.allocate(size, kGranule);
      if (a.ptr == 0) {
        REQUIRE_MESSAGE(a.error.kind == ManagedErrorKind::pinned, describe(a.error));
        out.refusal = a.error;
        ++out.passed_on;
        continue;
      }
      round.push_back(a.ptr);
      live += granules_of(size);
      out.peak_live = std::max(out.peak_live, live);
      out.peak_in_use = std::max(out.peak_in_use, slabs_with_live(c));
    }
    if (round.empty()) continue;
    out.kept.push_back(round.front());
    for (std::size_t i = 1; i < round.size(); ++i) {
      REQUIRE(c.slabs.free(round[i]) == FreeOutcome::freed);
      live -= granules_of(size);
    }
  }
  return out;
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("managed held bound: keeping one allocation per slab's worth takes no slab per round") {
  // The program of the Note, scaled: 64 KiB kept of every 1 MiB slab's worth and one more.
  Chain c(1 * MiB, 64, 1 * GiB);
  const Churn churn = keep_one_per_round(c, 40, 17, 64 * KiB);
  // Before the bound, one slab per round: 40 slabs for 40 x 64 KiB kept. The bound: twice the
  // live bytes (at most their peak) and the slack of the one lane.
  CHECK(churn.peak_in_use * 1 * MiB <= 2 * churn.peak_live + kManagedSlackSlabsPerLane * MiB);
  CHECK(c.report().slabs.size() <= 6);
  CHECK(churn.passed_on > 0);
  CHECK(churn.refusal.requested == 64 * KiB);
  CHECK(describe(churn.refusal).find("slabs pinned: requested 65536 B") != std::string::npos);
  // What was kept is intact and frees as before; then every slab can go back.
  for (DevicePtr p : churn.kept) CHECK(c.slabs.free(p) == FreeOutcome::freed);
  CHECK(c.report().live_allocations == 0);
  c.slabs.trim(kLongWait);
  CHECK(c.device.outstanding_allocations() == 0);
}

TEST_CASE("managed held bound: slabs half full of live bytes are never refused") {
  Chain c(1 * MiB, 64, 1 * GiB);
  std::vector<DevicePtr> kept;
  for (int i = 0; i < 40 * 8; ++i) {  // 40 slabs' worth, every other allocation kept
    kept.push_back(c.allocate(64 * KiB));
    CHECK(c.slabs.free(c.allocate(64 * KiB)) == FreeOutcome::freed);
  }
  CHECK(c.report().slabs.size() >= 40);
  for (DevicePtr p : kept) CHECK(c.slabs.free(p) == FreeOutcome::freed);
}

TEST_CASE("managed held bound: a request refused a slab waits for no fence") {
  Chain c(64 * KiB, 8, 256 * MiB);
  c.device.set_fence_mode(HostDevice::FenceMode::manual);
  std::vector<DevicePtr> slab[5];
  for (auto& allocations : slab) {
    for (int i = 0; i < 16; ++i) allocations.push_back(c.allocate(4 * KiB));  // full, all live
  }
  REQUIRE(c.report().slabs.size() == 5);
  for (DevicePtr p : slab[0]) c.slabs.free(p);  // empty, its fence still to come
  for (int s = 1; s < 5; ++s) {
    for (int i = 1; i < 16; ++i) c.slabs.free(slab[s][i]);
  }
  CHECK(c.slabs.rewind_empty() == 0);  // records the empty slab's fence, which lags
  const std::uint64_t waits = c.device.calls().fence_wait_for;
  // Slabs 1 to 4 (the last the lane's current one) hold 4 KiB each: a fifth slab in use is
  // refused, so there is no point waiting for the first one's fence.
  const ManagedAllocation refused = c.slabs.allocate(4 * KiB, kGranule);
  CHECK(refused.ptr == 0);
  CHECK(refused.error.kind == ManagedErrorKind::pinned);
  CHECK(refused.error.limit == 5 * 64 * KiB);
  CHECK(c.device.calls().fence_wait_for == waits);
  CHECK(c.device.calls().allocate == 5);
  c.device.complete_fences();
  for (int s = 1; s < 5; ++s) c.slabs.free(slab[s][0]);
}

TEST_CASE("managed held bound: the live bytes counted follow the frees") {
  Chain c(64 * KiB, 16, 256 * MiB);
  std::vector<DevicePtr> all;
  for (int i = 0; i < 64; ++i) all.push_back(c.allocate(4 * KiB));  // four full slabs
  REQUIRE(c.report().slabs.size() == 4);
  // Full slabs earn a fifth (their live bytes were counted on the way, and kept).
  const DevicePtr fifth = c.allocate(4 * KiB);
  CHECK(c.report().slabs.size() == 5);
  CHECK(c.slabs.free(fifth) == FreeOutcome::freed);
  // One allocation left of each of the first four: a slab beyond the lane's current one and the
  // four in use is refused now.
  for (int i = 0; i < 64; ++i) {
    if (i % 16 != 0) c.slabs.free(all[i]);
  }
  std::vector<DevicePtr> more;
  for (int i = 0; i < 15; ++i) more.push_back(c.allocate(4 * KiB));  // the fifth slab, full
  const ManagedAllocation refused = c.slabs.allocate(4 * KiB, kGranule);
  CHECK(refused.error.kind == ManagedErrorKind::pinned);
  // Freed, they leave the slabs in use: the chain takes a slab again.
  for (int i = 0; i < 64; i += 16) c.slabs.free(all[i]);
  CHECK(c.slabs.allocate(4 * KiB, kGranule).ptr != 0);
  for (DevicePtr p : more) c.slabs.free(p);
}

TEST_CASE("managed held bound: a trim gives back every empty slab; slabs are taken again after") {
  Chain c(1 * MiB, 64, 1 * GiB);
  const Churn churn = keep_one_per_round(c, 12, 17, 64 * KiB);
  REQUIRE(churn.passed_on > 0);
  for (DevicePtr p : churn.kept) c.slabs.free(p);
  CHECK(c.slabs.trim(kLongWait) >= 1);
  CHECK(c.device.outstanding_allocations() == 0);
  CHECK(c.device.bad_releases() == 0);
  const Churn again = keep_one_per_round(c, 2, 17, 64 * KiB);
  CHECK(again.passed_on == 0);
  for (DevicePtr p : again.kept) c.slabs.free(p);
}

TEST_CASE("managed held bound: four lanes holding a few allocations each are never refused") {
  Chain c(64 * MiB, 24, 4 * GiB);
  constexpr int kThreads = 4;  // fresh threads: one per lane (Note [Managed lanes])
  constexpr std::size_t kHeld = 8;
  std::vector<int> refused(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<DevicePtr> held;
      for (std::uint64_t i = 0; i < 4 * kManagedWindow / KiB; ++i) {
        const ManagedAllocation a = c.slabs.allocate(1 * KiB, kGranule);
        if (a.ptr == 0) {
          ++refused[t];
          continue;
        }
        held.push_back(a.ptr);
        if (held.size() > kHeld) {
          c.slabs.free(held.front());
          held.erase(held.begin());
        }
      }
      for (DevicePtr p : held) c.slabs.free(p);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) CHECK(refused[t] == 0);
  const ManagedReport r = c.report();
  CHECK(r.slabs.size() <= 2 * kThreads);  // a lane may take a spare another lane left
  CHECK(r.resets > 0);
  CHECK(r.live_allocations == 0);
}

}  // TEST_SUITE
