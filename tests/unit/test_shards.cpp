// Shards (Note [Shards] in pools/manager_shards.cpp): threads that keep reserving from one
// shard part, each pointer can be freed from any thread, captures, windows, capped layouts and
// layout changes keep to the first shard, one shard's out-of-memory takes the others' idle
// memory, and a shard nobody uses still ages its idle pages.
//
// Every thread that reserves here is a fresh Worker: a thread's home shard outlives a manager.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "pools/host_device.h"
#include "pools/manager_shards.h"
#include "pools/memory_manager.h"
#include "tests/unit/pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

ManagerOptions shard_options(const PoolLayout& layout = custom({sliced(2 * MiB, MiB)}),
                             FreeFence fence = FreeFence::none) {
  ManagerOptions o;
  o.layout = layout;
  o.free_fence = fence;
  o.shards = 2;
  o.prompt_fence_nanos = std::uint64_t{1} << 63;
  o.log_sink = [](LogLevel, std::string_view) {};  // the out-of-memory cases log
  return o;
}

// The manager runs over `front`, a device in front of the HostDevice: by default one that only
// passes calls on.
template <class Front = ForwardingDevice<HostDevice>>
struct ShardRigOn {
  explicit ShardRigOn(const ManagerOptions& options, std::uint64_t capacity = 256 * MiB)
      : device(capacity, 512), front(device), manager(front, options) {}

  DevicePtr reserve_on(Worker& w, std::uint64_t size) {
    DevicePtr p = 0;
    w.run([&] { p = manager.allocate(size).ptr; });
    REQUIRE(p != 0);
    return p;
  }

  // On the rig's 256 MiB device no page is a 1024th of the device or less, so a thread's own
  // shard serves only requests whose pages are small next to the most bytes in use (a 32nd),
  // and the plan is redone every few hundred reservations: w holds 64 MiB, then
  // makes enough reservations for the plan to see them (of sizes that differ: a thread cache's
  // hits reserve nothing from the shard).
  void warm(Worker& w) {
    w.run([&] {
      for (int i = 0; i < 64; ++i) ballast.push_back(manager.allocate(MiB).ptr);
      for (std::uint64_t i = 0; i < 300; ++i)
        REQUIRE(manager.free(manager.allocate(KiB + 512 * i).ptr) == FreeOutcome::freed);
    });
  }

  void drop_ballast() {
    for (const DevicePtr p : ballast) REQUIRE(manager.free(p) == FreeOutcome::freed);
    ballast.clear();
  }

  // a and b take turns reserving, as two busy threads do, until they part; every pointer is
  // freed again. Returns how many turns it took.
  int part(Worker& a, Worker& b) {
    if (ballast.empty()) warm(a);
    std::vector<DevicePtr> kept;
    int turns = 0;
    while (manager.report().shards < 2 && turns < 64) {
      kept.push_back(reserve_on(a, KiB));
      kept.push_back(reserve_on(b, KiB));
      ++turns;
    }
    for (const DevicePtr p : kept) REQUIRE(manager.free(p) == FreeOutcome::freed);
    return turns;
  }

  // a and b part; the thread that moved to a later shard fills it with `count` slices of 1 MiB
  // and frees them, so their pages stay there, idle. Returns the thread that moved, then the one
  // that stayed.
  std::pair<Worker*, Worker*> idle_pages_elsewhere(Worker& a, Worker& b, int count) {
    part(a, b);
    Worker& moved = shard_of(reserve_on(a, KiB)) != 0 ? a : b;
    Worker& stayed = &moved == &a ? b : a;
    std::vector<DevicePtr> held;
    for (int i = 0; i < count; ++i) held.push_back(reserve_on(moved, MiB));
    REQUIRE(shard_of(held.back()) != 0);
    moved.run([&] {
      for (const DevicePtr p : held) CHECK(manager.free(p) == FreeOutcome::freed);
    });
    return {&moved, &stayed};
  }

  // w takes 1 MiB slices until one is refused (16 at most): the slices it got.
  std::vector<DevicePtr> fill_device(Worker& w) {
    std::vector<DevicePtr> held;
    for (int i = 0; i < 16; ++i) {
      DevicePtr p = 0;
      w.run([&] { p = manager.allocate(MiB).ptr; });
      if (p == 0) break;
      held.push_back(p);
    }
    return held;
  }

  // The shard a live pointer belongs to.
  std::uint32_t shard_of(DevicePtr p) {
    const RetainedSlice pin = manager.retain(p);
    REQUIRE(pin);
    REQUIRE(manager.release_retained(pin));
    return pin.shard;
  }

  HostDevice device;
  Front front;
  MemoryManager manager;
  std::vector<DevicePtr> ballast;
};
using ShardRig = ShardRigOn<>;

// Pages given back reach the driver only at a flush, and never while `parked`: the release
// thread's cudaFree waits for every stream of the device, a parked one too.
class ParkedReleases final : public HeldReleases {
 public:
  using HeldReleases::HeldReleases;
  bool parked = false;

 protected:
  bool arrive(std::uint32_t) override { return !parked; }
};

}  // namespace

TEST_CASE("a thread that reserves alone never makes a second shard") {
  ShardRig rig(shard_options());
  Worker a;
  rig.warm(a);  // enough in use that the sliced pool's requests go by the thread's home
  a.run([&] {
    std::mt19937_64 rng(7);
    std::vector<DevicePtr> live;
    for (int i = 0; i < 20000; ++i) {
      if (live.size() < 64 && (live.empty() || rng() % 2 == 0)) {
        live.push_back(rig.manager.allocate(1 + rng() % MiB).ptr);
      } else {
        const std::size_t at = rng() % live.size();
        CHECK(rig.manager.free(live[at]) == FreeOutcome::freed);
        live[at] = live.back();
        live.pop_back();
      }
    }
    for (const DevicePtr p : live) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  });
  rig.drop_ballast();
  CHECK(rig.manager.report().shards == 1);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("two threads that keep taking turns part within a few turns, and stay parted") {
  ShardRig rig(shard_options());
  Worker a, b;
  CHECK(rig.part(a, b) <= static_cast<int>(kShardSettle) + 3);  // b settles first
  CHECK(rig.manager.report().shards == 2);
  std::vector<DevicePtr> of_a, of_b;
  for (int i = 0; i < 32; ++i) {
    of_a.push_back(rig.reserve_on(a, KiB));
    of_b.push_back(rig.reserve_on(b, KiB));
  }
  CHECK(rig.manager.report().shards == 2);
  const std::uint32_t home_a = rig.shard_of(of_a.back());
  const std::uint32_t home_b = rig.shard_of(of_b.back());
  CHECK(home_a != home_b);
  // Once parted, neither moves again: each one's later pointers stay in its shard.
  for (int i = 16; i < 32; ++i) {
    CHECK(rig.shard_of(of_a[i]) == home_a);
    CHECK(rig.shard_of(of_b[i]) == home_b);
  }
  const MemoryUsage u = rig.manager.memory_usage();
  CHECK(u.number_allocs == 64 + 64);
  CHECK(u.bytes_in_use == 64 * KiB + 64 * MiB);
  CHECK(rig.manager.report().slices == 64 + 64);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a thread that reserves now and then beside a busy one moves once settled; the busy "
          "one stays") {
  ShardRig rig(shard_options());
  Worker busy, occasional;
  rig.warm(busy);
  std::vector<DevicePtr> of_busy, of_occasional;
  for (std::uint32_t round = 0; round < kShardSettle + 8; ++round) {
    if (round == kShardSettle && !of_occasional.empty()) {
      // Its first reservations moved neither thread.
      CHECK(rig.shard_of(of_occasional.back()) == 0);
      CHECK(rig.shard_of(of_busy.back()) == 0);
      CHECK(rig.manager.report().shards == 1);
    }
    for (int i = 0; i < 100; ++i) {
      of_busy.push_back(rig.reserve_on(busy, KiB));
      if (of_busy.size() > 16) {
        REQUIRE(rig.manager.free(of_busy.front()) == FreeOutcome::freed);
        of_busy.erase(of_busy.begin());
      }
    }
    of_occasional.push_back(rig.reserve_on(occasional, KiB));
  }
  CHECK(rig.shard_of(of_busy.back()) == 0);
  CHECK(rig.shard_of(of_occasional.back()) == 1);
  CHECK(rig.manager.report().shards == 2);
}

TEST_CASE("two threads that each reuse one size stay in one shard, on one page") {
  // Their thread caches serve them after two reservations each: a move on those would make a
  // shard, and a page in it, for nothing (on a device large enough that the 2 MiB pool's
  // requests go by the thread's home from the start).
  ManagerOptions o = shard_options();
  o.thread_cache = true;
  ShardRig rig(o, 16 * GiB);
  rig.manager.set_stream_ordered(true);
  Worker a, b;
  for (int turn = 0; turn < 1000; ++turn) {
    for (Worker* w : {&a, &b})
      w->run([&] {
        REQUIRE(rig.manager.free(rig.manager.allocate(64 * KiB).ptr) == FreeOutcome::freed);
      });
  }
  CHECK(rig.manager.report().shards == 1);
  CHECK(rig.device.calls().allocate == 1);
  CHECK(rig.manager.report().thread_cache_hits >= 2 * 990);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a thread's own shard serves small pages' requests and every page-per-request one") {
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB), sliced(64 * MiB, 16 * MiB),
                                     exclusive(4 * GiB)})));
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  // 64 MiB in use: 2 MiB pages are small enough, 64 MiB ones are not; exclusive pages are
  // sized by their requests, so no shard holds one partly used.
  CHECK(rig.shard_of(rig.reserve_on(moved, MiB)) != 0);
  CHECK(rig.shard_of(rig.reserve_on(moved, 8 * MiB)) == 0);
  CHECK(rig.shard_of(rig.reserve_on(moved, 32 * MiB)) != 0);
}

TEST_CASE("the plan follows the most bytes in use, not those in use now, until a layout or reset") {
  ShardRig rig(shard_options());
  Worker a, b;
  rig.part(a, b);
  rig.drop_ballast();
  // The shard a new KiB of `w` comes from (freed again: a layout change needs no live slice).
  auto shard_for = [&](Worker& w) {
    const DevicePtr p = rig.reserve_on(w, KiB);
    const std::uint32_t k = rig.shard_of(p);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    return k;
  };
  const bool a_moved = shard_for(a) != 0;
  Worker& moved = a_moved ? a : b;
  Worker& stayed = a_moved ? b : a;
  // Both threads reserve until every shard has published its bytes in use and the plan has been
  // redone (sizes that differ: a thread cache's hits reserve nothing from the shard).
  auto replan = [&] {
    for (Worker* w : {&stayed, &moved, &stayed}) {
      w->run([&] {
        for (std::uint64_t i = 0; i < 300; ++i)
          REQUIRE(rig.manager.free(rig.manager.allocate(KiB + 512 * i).ptr) ==
                  FreeOutcome::freed);
      });
    }
  };
  // 96 MiB in use, seen by the plan, then given back: a 2 MiB page is more than a 32nd of what is
  // in use now, but a small share of what the program has had in use.
  auto hold_and_drop = [&] {
    stayed.run([&] {
      for (int i = 0; i < 96; ++i) rig.ballast.push_back(rig.manager.allocate(MiB).ptr);
    });
    replan();
    rig.drop_ballast();
    replan();
  };
  hold_and_drop();
  CHECK(shard_for(moved) != 0);
  // A new layout is a new plan: from what is in use then, nothing.
  REQUIRE_FALSE(rig.manager.install_layout(custom({sliced(2 * MiB, MiB)})));
  replan();
  CHECK(shard_for(moved) == 0);
  // So is a reset (forget), after the peak came back.
  hold_and_drop();
  REQUIRE(shard_for(moved) != 0);
  rig.manager.forget();
  replan();
  CHECK(shard_for(moved) == 0);
}

TEST_CASE("on a large device, pages up to a 1024th of it are per shard before anything is in use") {
  // 4 GiB: 2 MiB pages are at most a 1024th of the device, 8 MiB ones are not; nothing is in
  // use yet, so only that share decides.
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB), sliced(8 * MiB, 4 * MiB)})), 4 * GiB);
  Worker a, b;
  std::vector<DevicePtr> kept;
  for (int turns = 0; rig.manager.report().shards < 2 && turns < 64; ++turns) {
    kept.push_back(rig.reserve_on(a, KiB));
    kept.push_back(rig.reserve_on(b, KiB));
  }
  REQUIRE(rig.manager.report().shards == 2);
  const DevicePtr probe = rig.reserve_on(a, KiB);
  Worker& moved = rig.shard_of(probe) != 0 ? a : b;
  kept.push_back(probe);
  auto shard_for = [&](std::uint64_t size) {
    const DevicePtr p = rig.reserve_on(moved, size);
    const std::uint32_t k = rig.shard_of(p);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    return k;
  };
  CHECK(shard_for(MiB) != 0);
  CHECK(shard_for(3 * MiB) == 0);
  // A plan from what is in use (a few MiB) keeps the device's share.
  moved.run([&] {
    for (std::uint64_t i = 0; i < 300; ++i)
      REQUIRE(rig.manager.free(rig.manager.allocate(KiB + 512 * i).ptr) == FreeOutcome::freed);
  });
  CHECK(shard_for(MiB) != 0);
  for (const DevicePtr p : kept) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  // A new layout and a reset start the plan over, from the same share of the device.
  REQUIRE_FALSE(rig.manager.install_layout(custom({sliced(2 * MiB, MiB)})));
  CHECK(shard_for(MiB) != 0);
  rig.manager.forget();
  CHECK(shard_for(MiB) != 0);
}

TEST_CASE("any thread frees any shard's pointer, and bad frees are told apart as with one") {
  ShardRig rig(shard_options());
  Worker a, b;
  rig.part(a, b);
  const DevicePtr p = rig.reserve_on(b, 4 * KiB);
  const DevicePtr q = rig.reserve_on(a, 4 * KiB);
  REQUIRE(rig.shard_of(p) != rig.shard_of(q));
  a.run([&] {
    CHECK(rig.manager.live_size(p) == 4 * KiB);
    CHECK(rig.manager.free(p + 512) == FreeOutcome::interior_pointer);
    CHECK(rig.manager.free(p) == FreeOutcome::freed);
    CHECK(rig.manager.free(p) == FreeOutcome::double_free);
    CHECK(rig.manager.live_size(p) == 0);
    CHECK(rig.manager.free(0x10) == FreeOutcome::not_mine);
  });
  b.run([&] { CHECK(rig.manager.free(q) == FreeOutcome::freed); });
  rig.drop_ballast();
  CHECK(rig.manager.memory_usage().number_allocs == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("captures and persistent windows reserve from the first shard, whoever asks") {
  ShardRig rig(shard_options());
  Worker a, b;
  rig.part(a, b);
  // The worker that moved is the one whose pointers are not in the first shard.
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  REQUIRE(rig.shard_of(rig.reserve_on(moved, KiB)) != 0);
  rig.manager.set_capture_window(true);
  CHECK(rig.shard_of(rig.reserve_on(moved, 8 * KiB)) == 0);
  rig.manager.set_capture_window(false);
  CHECK(rig.shard_of(rig.reserve_on(moved, KiB)) != 0);
  rig.manager.set_mode(AllocationMode::persistent);
  CHECK(rig.shard_of(rig.reserve_on(moved, 8 * KiB)) == 0);
  rig.manager.set_mode(AllocationMode::automatic);
  CHECK(rig.shard_of(rig.reserve_on(moved, KiB)) != 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a layout with a capped pool keeps one shard, so the cap holds for the device") {
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB, 128 * MiB)})));
  Worker a, b;
  CHECK(rig.part(a, b) == 64);  // they never part
  CHECK(rig.manager.report().shards == 1);
}

TEST_CASE("a shard that grows takes another shard's idle pages before the device's") {
  ShardRig rig(shard_options());
  Worker a, b;
  Worker& stayed = *rig.idle_pages_elsewhere(a, b, 40).second;
  const std::uint64_t reserved = rig.manager.memory_usage().bytes_reserved;
  const std::uint64_t device_allocs = rig.device.calls().allocate;
  std::vector<DevicePtr> held;
  for (int i = 0; i < 40; ++i) held.push_back(rig.reserve_on(stayed, MiB));
  CHECK(rig.shard_of(held.back()) == 0);
  CHECK(rig.device.calls().allocate == device_allocs);
  CHECK(rig.manager.memory_usage().bytes_reserved == reserved);
  const PoolReport pool = rig.manager.report().dynamic[0];
  // The other shard's 40 MiB are eight pages of 2 MiB, four of 4 MiB and one of 8 MiB (Note
  // [Wider pages]).
  CHECK(pool.pages_borrowed >= 13);
  CHECK(pool.pages_lent == pool.pages_borrowed);
  for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a device's peaks are the most it held at once, not the sum of its shards' peaks") {
  ShardRig rig(shard_options());
  Worker a, b;
  // 64 MiB of ballast in the first shard throughout; 40 MiB in the second, all freed; then
  // 40 MiB in the first: each shard peaks at its own time, and the device never holds both.
  Worker& stayed = *rig.idle_pages_elsewhere(a, b, 40).second;
  std::vector<DevicePtr> held;
  for (int i = 0; i < 40; ++i) held.push_back(rig.reserve_on(stayed, MiB));
  REQUIRE(rig.shard_of(held.back()) == 0);
  const ManagerReport r = rig.manager.report();
  const std::uint64_t most_live = 104 * MiB;  // the ballast and one thread's 40 MiB
  CHECK(r.bytes_in_use_peak >= most_live);
  CHECK(r.bytes_in_use_peak < most_live + 8 * MiB);  // the sum of the shards' peaks: 144 MiB
  // The second shard's idle pages were lent to the first: the device reserved no more.
  CHECK(r.bytes_reserved_peak >= r.bytes_in_use_peak);
  CHECK(r.bytes_reserved_peak < most_live + 8 * MiB);
  for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  rig.drop_ballast();
  CHECK(rig.manager.check_consistency().empty());
}

// Two threads of random sizes lend each other pages while a third takes reports: no report says
// more is reserved than the device held at once (a shard's pages counted again in another's, as
// a page moved, said 2.16 GiB of a 2 GiB device), and its peaks never go down.
TEST_CASE("reports taken while shards lend each other pages stay within what the device held") {
  constexpr std::uint64_t kDevice = 256 * MiB;
  ShardRig rig(shard_options(), kDevice);
  Worker a, b;
  // Two shards, one holding idle pages the other's growths borrow first.
  const auto [moved, stayed] = rig.idle_pages_elsewhere(a, b, 40);
  std::vector<DevicePtr> held;
  for (int i = 0; i < 16; ++i) held.push_back(rig.reserve_on(*stayed, MiB));
  REQUIRE(rig.manager.report().dynamic[0].pages_borrowed > 0);
  for (const DevicePtr p : held) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  rig.drop_ballast();
  std::atomic<int> running{2};
  const auto churn = [&](Worker& w, int seed) {
    return std::thread([&rig, &w, &running, seed] {
      w.run([&] {
        std::mt19937_64 rng(seed);
        std::vector<DevicePtr> live;
        for (int step = 0; step < 20000; ++step) {
          if (live.size() < 96 && (live.empty() || rng() % 2 == 0)) {
            const std::uint64_t size = 1 + rng() % MiB;
            const DevicePtr p = rig.manager.allocate(size).ptr;
            if (p != 0) live.push_back(p);
          } else {
            const std::size_t i = rng() % live.size();
            REQUIRE(rig.manager.free(live[i]) == FreeOutcome::freed);
            live[i] = live.back();
            live.pop_back();
          }
        }
        for (const DevicePtr p : live) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
      });
      running.fetch_sub(1);
    });
  };
  std::thread first = churn(*stayed, 1);
  std::thread second = churn(*moved, 2);
  std::uint64_t reports = 0, last_peak = 0, over = 0, fell = 0;
  while (running.load() != 0) {
    const ManagerReport r = rig.manager.report();
    ++reports;
    over += r.bytes_reserved > kDevice || r.bytes_reserved_peak > kDevice;
    fell += r.bytes_reserved_peak < last_peak;
    last_peak = std::max(last_peak, r.bytes_reserved_peak);
  }
  first.join();
  second.join();
  const ManagerReport r = rig.manager.report();
  INFO(reports << " reports");
  CHECK(r.shards == 2);
  CHECK(over == 0);
  CHECK(fell == 0);
  CHECK(r.bytes_reserved_peak <= rig.device.peak_outstanding_bytes());
  CHECK(r.bytes_reserved_peak >= r.bytes_in_use_peak);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a shard that grows takes a page a quiet thread's cache parked in another shard") {
  ManagerOptions o = shard_options(custom({sliced(2 * MiB, MiB), exclusive(4 * GiB)}));
  o.thread_cache = true;
  ShardRig rig(o, 4 * GiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  Worker& stayed = &moved == &a ? b : a;
  // The moved thread's own shard serves its requests for exclusive pages (a pin takes a slice
  // out of its cache: this one is never cached).
  const DevicePtr probe = rig.reserve_on(moved, 40 * MiB);
  REQUIRE(rig.shard_of(probe) != 0);
  REQUIRE(rig.manager.free(probe) == FreeOutcome::freed);
  // Its second 16 MiB page joins its cache, and its free parks it there.
  DevicePtr parked = 0;
  moved.run([&] {
    REQUIRE(rig.manager.free(rig.manager.allocate(16 * MiB).ptr) == FreeOutcome::freed);
    parked = rig.manager.allocate(16 * MiB).ptr;
    REQUIRE(rig.manager.free(parked) == FreeOutcome::freed);
  });
  REQUIRE(rig.manager.report().thread_parked_bytes == 16 * MiB);
  const std::uint64_t device_allocs = rig.device.calls().allocate;
  // A first growth finds the cache used since the last sweep: it keeps its page.
  const DevicePtr larger = rig.reserve_on(stayed, 96 * MiB);
  CHECK(larger != parked);
  CHECK(rig.device.calls().allocate == device_allocs + 1);
  CHECK(rig.manager.report().thread_parked_bytes == 16 * MiB);
  // Two sweeps of its shard later, the moved thread having made no call since, the page is
  // lent. That shard's clock follows this one's every 4,096 requests (kShardClockSync), even
  // requests its thread cache serves, and each catch-up sweeps.
  stayed.run([&] {
    for (std::uint64_t i = 0; i < 3 * 4096 + 64; ++i)
      REQUIRE(rig.manager.free(rig.manager.allocate(64 * KiB).ptr) == FreeOutcome::freed);
  });
  const DevicePtr p = rig.reserve_on(stayed, 16 * MiB);
  CHECK(p == parked);
  CHECK(rig.shard_of(p) == 0);
  CHECK(rig.device.calls().allocate == device_allocs + 1);
  CHECK(rig.manager.report().thread_parked_bytes == 64 * KiB);  // the busy thread's own
  CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.free(larger) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("out of memory in one shard counts the slices other shards' thread caches parked") {
  // One thread parks a 16 MiB page in its shard; the other fills the device with sizes that
  // never join a cache. It gets exactly as many as when nothing is cached: the shard that grows
  // empties the other's caches to borrow, and its recovery does too.
  const auto served = [](bool caches) {
    ManagerOptions o = shard_options(custom({sliced(2 * MiB, MiB), exclusive(4 * GiB)}));
    o.thread_cache = caches;
    ShardRig rig(o, GiB);
    Worker a, b;
    rig.part(a, b);
    Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
    Worker& stayed = &moved == &a ? b : a;
    moved.run([&] {
      for (int i = 0; i < 2; ++i)
        REQUIRE(rig.manager.free(rig.manager.allocate(16 * MiB).ptr) == FreeOutcome::freed);
    });
    REQUIRE(rig.manager.report().thread_parked_bytes == (caches ? 16 * MiB : 0));
    std::vector<DevicePtr> held;
    stayed.run([&] {
      for (std::uint64_t i = 0; i < 200; ++i) {
        const DevicePtr p = rig.manager.allocate(16 * MiB + 4 * KiB * i).ptr;
        if (p == 0) break;
        held.push_back(p);
      }
      for (const DevicePtr p : held) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    });
    CHECK(rig.manager.report().thread_parked_bytes == 0);
    CHECK(rig.manager.check_consistency().empty());
    return held.size();
  };
  const std::size_t plain = served(false);
  CHECK(plain > 40);
  CHECK(served(true) == plain);
}

TEST_CASE("out of memory in one shard takes the idle memory of the others first") {
  // The moved thread's idle pages are 2 MiB ones in its shard; 8 MiB requests come from the
  // first shard (their pages are large next to the bytes in use), and no shard holds such a
  // page idle.
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB), sliced(8 * MiB, 8 * MiB)})),
               160 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  std::vector<DevicePtr> held;
  for (int i = 0; i < 64; ++i) held.push_back(rig.reserve_on(moved, MiB));
  REQUIRE(rig.shard_of(held.back()) != 0);
  moved.run([&] {
    for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  });
  REQUIRE(rig.manager.idle_bytes() >= 64 * MiB);
  held.clear();
  for (int i = 0; i < 6; ++i) held.push_back(rig.reserve_on(moved, 8 * MiB));
  CHECK(rig.shard_of(held.back()) == 0);
  CHECK(rig.manager.report().oom_recoveries >= 1);
  CHECK(rig.manager.report().oom_failures == 0);
  for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("out of memory in a thread's own shard is served from room in the first") {
  // The first shard holds the ballast, 32 pages; the device has room for few more.
  ShardRig rig(shard_options(), 72 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  // A hole in one of the first shard's pages, the one room left once the device is full.
  REQUIRE(rig.manager.free(rig.ballast.back()) == FreeOutcome::freed);
  rig.ballast.pop_back();
  const std::vector<DevicePtr> held = rig.fill_device(moved);
  CHECK(std::any_of(held.begin(), held.end(), [&](DevicePtr p) { return rig.shard_of(p) == 0; }));
  CHECK(held.size() < 16);  // the device did fill up
  for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.report().oom_failures == 1);  // one failure counted, not one per shard
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("out of memory in the first shard is served from room in a later one") {
  ShardRig rig(shard_options(), 72 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  Worker& stayed = &moved == &a ? b : a;
  // A hole in the later shard's page: its other slice keeps the page there, in use.
  const DevicePtr keep = rig.reserve_on(moved, MiB), hole = rig.reserve_on(moved, MiB);
  REQUIRE(rig.shard_of(hole) != 0);
  moved.run([&] { REQUIRE(rig.manager.free(hole) == FreeOutcome::freed); });
  const std::vector<DevicePtr> held = rig.fill_device(stayed);
  CHECK(std::any_of(held.begin(), held.end(), [&](DevicePtr p) { return rig.shard_of(p) != 0; }));
  CHECK(held.size() < 16);  // the device did fill up
  for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.free(keep) == FreeOutcome::freed);
  CHECK(rig.manager.report().oom_failures == 1);  // one failure counted, not one per shard
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("out of memory waits for the fences of memory another shard's thread freed") {
  // Frees wait for their fences here (a device behind the host): what b freed is pending in its
  // shard when a runs out, and comes free only once a's recovery waits for b's fences.
  ManagerOptions o = shard_options(custom({sliced(2 * MiB, MiB), exclusive(4 * GiB)}),
                                   FreeFence::events);
  ShardRig rig(o, 128 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  Worker& stayed = &moved == &a ? b : a;
  REQUIRE(rig.manager.drain_fences());  // no shard has a fence of its own to wait for now
  rig.device.set_fence_mode(HostDevice::FenceMode::on_wait);
  std::vector<DevicePtr> held;
  for (int i = 0; i < 2; ++i) held.push_back(rig.reserve_on(moved, 24 * MiB));
  REQUIRE(rig.shard_of(held.back()) != 0);
  moved.run([&] {
    for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  });
  REQUIRE(rig.manager.report().pending_fence_bytes >= 48 * MiB);
  const DevicePtr big = rig.reserve_on(stayed, 40 * MiB);
  CHECK(big != 0);
  CHECK(rig.manager.report().oom_failures == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("out of memory behind a parked stream's free turns to another shard's fences") {
  // The recovering shard's only fence is a stream-ordered free's on a parked stream: its waits
  // run out a slice at a time, and between them the recovery must wait for the other shard's
  // fences (which pass when waited for) instead of spending its whole bound on the park.
  ManagerOptions o = shard_options(custom({sliced(2 * MiB, MiB), exclusive(4 * GiB)}),
                                   FreeFence::events);
  o.recovery_wait_micros = 1'000'000;  // waited out on the park, the request fails after it
  ShardRig rig(o, 128 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  Worker& stayed = &moved == &a ? b : a;
  REQUIRE(rig.manager.drain_fences());
  rig.device.set_fence_mode(HostDevice::FenceMode::on_wait);
  const StreamToken parked = 0x1000;
  rig.device.park_stream(parked);
  const DevicePtr small = rig.reserve_on(stayed, KiB);
  REQUIRE(rig.shard_of(small) == 0);
  stayed.run([&] { CHECK(rig.manager.free(small, parked) == FreeOutcome::freed); });
  std::vector<DevicePtr> held;
  for (int i = 0; i < 2; ++i) held.push_back(rig.reserve_on(moved, 24 * MiB));
  REQUIRE(rig.shard_of(held.back()) != 0);
  moved.run([&] {
    for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  });
  DevicePtr big = 0;
  stayed.run([&] { big = rig.manager.allocate(40 * MiB).ptr; });
  CHECK(big != 0);
  CHECK(rig.manager.report().oom_failures == 0);
  rig.device.complete_fences();
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a give-back behind a park costs its bound once, in the last shard too") {
  // Each shard frees memory whose fence a park holds. The first give-back spends its bound in
  // the first shard and leaves the second none; the next, with the same bound, finds nothing
  // moved in either and waits for nothing (GiveBackState in pools/manager_impl.h: the bound
  // compared is the caller's, not what was left of it when the shard's turn came).
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB)}), FreeFence::events), 128 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  Worker& stayed = &moved == &a ? b : a;
  REQUIRE(rig.manager.drain_fences());
  rig.device.set_fence_mode(HostDevice::FenceMode::parked);
  const DevicePtr in_first = rig.reserve_on(stayed, 700 * KiB);
  const DevicePtr in_second = rig.reserve_on(moved, 700 * KiB);
  REQUIRE(rig.shard_of(in_first) == 0);
  REQUIRE(rig.shard_of(in_second) != 0);
  stayed.run([&] { CHECK(rig.manager.free(in_first) == FreeOutcome::freed); });
  moved.run([&] { CHECK(rig.manager.free(in_second) == FreeOutcome::freed); });
  CHECK(rig.manager.give_back_all(50000) == GiveBack::timed_out);
  const std::uint64_t waits = rig.device.calls().fence_wait_for;
  CHECK(rig.manager.give_back_all(50000) == GiveBack::timed_out);
  CHECK(rig.device.calls().fence_wait_for == waits);  // no shard waited again
  rig.device.complete_fences();  // the park ends
  CHECK(rig.manager.give_back_all(50000) == GiveBack::done);
  rig.drop_ballast();
  rig.manager.fence_open_frees();  // a parked device passes only fences recorded before this
  rig.device.complete_fences();
  CHECK(rig.manager.drain_fences());
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("another shard's memory freed in a running stream's order is lent, not stuck behind a park") {
  // The recovering shard's thread parks a stream; the other shard's thread frees a 40 MiB buffer
  // in the order of a stream that runs. The driver's free of anything given back now waits for
  // the park, so the page must be lent to the recovering shard, not handed to the driver.
  ManagerOptions o = shard_options(custom({sliced(2 * MiB, MiB), exclusive(4 * GiB)}),
                                   FreeFence::events);
  o.recovery_wait_micros = 300'000;
  ShardRigOn<ParkedReleases> rig(o, 128 * MiB);
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  Worker& stayed = &moved == &a ? b : a;
  REQUIRE(rig.manager.drain_fences());
  rig.front.deliver();
  const StreamToken parked = 0x1000;
  const StreamToken running = 0x2000;
  rig.device.park_stream(parked);
  rig.front.parked = true;
  const DevicePtr small = rig.reserve_on(stayed, KiB);
  REQUIRE(rig.shard_of(small) == 0);
  stayed.run([&] { CHECK(rig.manager.free(small, parked) == FreeOutcome::freed); });
  const DevicePtr held = rig.reserve_on(moved, 40 * MiB);
  REQUIRE(rig.shard_of(held) != 0);
  moved.run([&] { CHECK(rig.manager.free(held, running) == FreeOutcome::freed); });
  DevicePtr big = 0;
  stayed.run([&] { big = rig.manager.allocate(40 * MiB).ptr; });
  CHECK(big != 0);
  CHECK(rig.manager.report().oom_failures == 0);
  rig.front.parked = false;
  rig.device.complete_fences();
  rig.front.deliver();
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a request beyond every shard's reach fails at once, taking nothing from the others") {
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB), exclusive(4 * GiB)})));
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  std::vector<DevicePtr> held;
  for (int i = 0; i < 8; ++i) held.push_back(rig.reserve_on(moved, MiB));
  moved.run([&] {
    for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  });
  const std::uint64_t idle = rig.manager.idle_bytes();
  REQUIRE(idle >= 8 * MiB);
  const Reservation r = rig.manager.allocate(GiB);  // the device has 256 MiB
  CHECK(r.ptr == 0);
  CHECK(r.error.kind == ErrorKind::out_of_memory);
  CHECK(rig.manager.idle_bytes() == idle);
}

TEST_CASE("a layout change waits for every shard to be empty and reaches every shard") {
  ShardRig rig(shard_options());
  Worker a, b;
  rig.part(a, b);
  const DevicePtr p = rig.reserve_on(b, KiB);
  const DevicePtr q = rig.reserve_on(a, KiB);
  const std::uint32_t home_b = rig.shard_of(p);
  const PoolLayout two = custom({sliced(2 * MiB, 64 * KiB), sliced(8 * MiB, 2 * MiB)});
  CHECK(rig.manager.install_layout(two).kind == ErrorKind::pools_in_use);
  CHECK(rig.manager.free(q) == FreeOutcome::freed);
  CHECK(rig.manager.install_layout(two).kind == ErrorKind::pools_in_use);  // p is live
  CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.install_layout(two).kind == ErrorKind::pools_in_use);  // the ballast
  rig.drop_ballast();
  CHECK_FALSE(rig.manager.install_layout(two));
  CHECK(rig.manager.report().dynamic.size() == 2);
  // The gate opened again: b still reserves from its own shard, under the new layout.
  rig.warm(a);
  CHECK(rig.shard_of(rig.reserve_on(b, KiB)) == home_b);
  CHECK(rig.manager.report().dynamic[1].bytes_in_use == 64 * MiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("idle pages of a shard no thread uses any more still expire") {
  ShardRig rig(shard_options(custom({sliced(2 * MiB, MiB, std::nullopt, 100)})));
  Worker a, b;
  rig.part(a, b);
  std::vector<DevicePtr> held;
  for (int i = 0; i < 6; ++i) held.push_back(rig.reserve_on(b, MiB));
  b.run([&] {
    for (const DevicePtr p : held) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  });
  const std::size_t pages_before = rig.manager.pages().size();
  REQUIRE(pages_before >= 3);
  a.run([&] {
    for (int i = 0; i < 20000; ++i) {
      const DevicePtr p = rig.manager.allocate(KiB).ptr;
      REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    }
  });
  CHECK(rig.manager.pages().size() <= 33);  // the ballast's 32 and a's own page at most
}

TEST_CASE("a shard made later starts from the device's settings") {
  ManagerOptions o = shard_options(custom({sliced(2 * MiB, MiB)}), FreeFence::automatic);
  o.thread_cache = true;
  ShardRig rig(o);
  rig.manager.set_stream_ordered(true);  // before the second shard exists
  Worker a, b;
  rig.part(a, b);
  Worker& moved = rig.shard_of(rig.reserve_on(a, KiB)) != 0 ? a : b;
  const std::uint64_t hits = rig.manager.report().thread_cache_hits;
  moved.run([&] {
    for (int i = 0; i < 20; ++i) {
      const DevicePtr p = rig.manager.allocate(3 * KiB).ptr;
      REQUIRE(p != 0);
      REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    }
  });
  // Its frees need no fence there either: its cache serves it.
  CHECK(rig.manager.report().thread_cache_hits >= hits + 15);
  CHECK(rig.manager.report().pending_fence_bytes == 0);
}

TEST_CASE("four threads reserving and freeing each other's pointers leave the shards whole") {
  ManagerOptions o = shard_options(preset(PoolPreset::subslices), FreeFence::events);
  o.shards = 4;
  o.thread_cache = true;
  ShardRig rig(o, 4ull << 30);
  std::mutex handoff_mutex;
  std::vector<DevicePtr> handoff;  // pointers one thread leaves for another to free
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<DevicePtr> live;
      for (int i = 0; i < 4000; ++i) {
        const auto step = rng() % 8;
        if (live.empty() || (step < 4 && live.size() < 64)) {
          const DevicePtr p = rig.manager.allocate(1 + rng() % (4 * MiB)).ptr;
          REQUIRE(p != 0);
          live.push_back(p);
        } else if (step < 6) {
          REQUIRE(rig.manager.free(live.back()) == FreeOutcome::freed);
          live.pop_back();
        } else if (step == 6) {
          std::lock_guard hold(handoff_mutex);
          handoff.push_back(live.back());
          live.pop_back();
        } else {
          DevicePtr p = 0;
          {
            std::lock_guard hold(handoff_mutex);
            if (!handoff.empty()) {
              p = handoff.back();
              handoff.pop_back();
            }
          }
          if (p != 0) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
        }
        if (i % 1000 == 0) rig.manager.cleanup(false);
      }
      for (const DevicePtr p : live) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const DevicePtr p : handoff) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.memory_usage().number_allocs == 0);
  CHECK(rig.manager.check_consistency().empty());
  CHECK(rig.manager.drain_fences());
  rig.manager.cleanup(true);
  CHECK(rig.manager.memory_usage().bytes_reserved == 0);
}
