// Thread caches (Note [Thread caches] in pools/manager_caches.cpp): a thread's freed slice
// comes back for its next request of the same size; parked slices count as freed for every
// check of a pointer; the gate shuts them whenever a free must wait for a fence; and parked
// memory goes back whenever the pools need it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include "pools/host_device.h"
#include "pools/memory_manager.h"
#include "pools/thread_cache.h"
#include "tests/unit/pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

ManagerOptions cached_options(FreeFence fence = FreeFence::none,
                              const PoolLayout& layout = custom({sliced(2 * MiB, MiB)})) {
  ManagerOptions o;
  o.layout = layout;
  o.free_fence = fence;
  o.thread_cache = true;
  o.prompt_fence_nanos = std::uint64_t{1} << 63;
  return o;
}

struct CacheRig {
  explicit CacheRig(FreeFence fence = FreeFence::none,
                    const PoolLayout& layout = custom({sliced(2 * MiB, MiB)}),
                    std::uint64_t capacity = 128 * MiB)
      : device(capacity, 512), manager(device, cached_options(fence, layout)) {}

  // A size joins the cache from its second request through the manager on: after this, the
  // calling thread's next request of `size` is served by its cache once the pointer is freed.
  DevicePtr cached(std::uint64_t size) {
    const DevicePtr first = manager.allocate(size).ptr;
    REQUIRE(manager.free(first) == FreeOutcome::freed);
    const DevicePtr second = manager.allocate(size).ptr;
    REQUIRE(second != 0);
    return second;
  }

  ManagerReport report() const { return manager.report(); }

  HostDevice device;
  MemoryManager manager;
};

void run_thread(const std::function<void()>& body) {
  std::thread t(body);
  t.join();
}

}  // namespace

TEST_CASE("a freed slice comes back for the same thread's next request of its size") {
  CacheRig rig;
  const DevicePtr p = rig.cached(64 * KiB);
  const std::uint64_t allocs = rig.device.calls().allocate;
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.report().thread_parked_bytes == 64 * KiB);
  CHECK(rig.manager.live_size(p) == 0);
  CHECK(rig.manager.allocate(64 * KiB).ptr == p);
  CHECK(rig.manager.live_size(p) == 64 * KiB);
  const ManagerReport r = rig.report();
  CHECK(r.thread_cache_hits == 1);
  CHECK(r.thread_caches == 1);
  CHECK(r.thread_parked_bytes == 0);
  CHECK(rig.device.calls().allocate == allocs);
  // Another size, or another thread, is not served from it.
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  const DevicePtr other = rig.manager.allocate(64 * KiB + 512).ptr;
  CHECK(other != p);
  DevicePtr from_thread = 0;
  run_thread([&] { from_thread = rig.manager.allocate(64 * KiB).ptr; });
  CHECK(from_thread != p);
  CHECK(rig.manager.check_consistency().empty());
}

// A report's parts add up to what the pools reserve while a thread parks and reuses slices
// without the pools' lock: the bytes in use and the bytes parked are read in one pass (read in
// two, a slice parked in between counted in both).
TEST_CASE("a report's figures add up while a thread parks and reuses slices") {
  CacheRig rig;
  std::atomic<bool> done{false};
  std::atomic<int> rounds{0};
  std::thread owner([&] {
    std::vector<DevicePtr> held;
    for (std::uint64_t size : {64 * KiB, 96 * KiB, 128 * KiB}) held.push_back(rig.cached(size));
    const std::vector<std::uint64_t> sizes = {64 * KiB, 96 * KiB, 128 * KiB};
    while (!done.load()) {
      rounds.fetch_add(1);
      // All parked for a moment, then all reused.
      for (const DevicePtr p : held) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
      std::this_thread::yield();
      for (std::size_t i = 0; i < held.size(); ++i) {
        held[i] = rig.manager.allocate(sizes[i]).ptr;
        REQUIRE(held[i] != 0);
      }
    }
    for (const DevicePtr p : held) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  });
  int off = 0;
  std::uint64_t parked_seen = 0;
  // 20,000 reports, and as many more as the owner needs for 1,000 rounds beside them.
  for (int reports = 0; reports < 20000 || rounds.load() < 1000; ++reports) {
    const ManagerReport r = rig.report();
    parked_seen += r.thread_parked_bytes;
    off += r.bytes_in_use + r.bytes_padding + r.pending_fence_bytes + r.idle_bytes +
               r.hole_bytes + r.thread_parked_bytes !=
           r.bytes_reserved;
  }
  done.store(true);
  owner.join();
  CHECK(parked_seen > 0);
  CHECK(off == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a parked slice freed again is a double free, from any thread") {
  CacheRig rig;
  const DevicePtr p = rig.cached(4 * KiB);
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.free(p) == FreeOutcome::double_free);
  FreeOutcome elsewhere = FreeOutcome::freed;
  run_thread([&] { elsewhere = rig.manager.free(p); });
  CHECK(elsewhere == FreeOutcome::double_free);
  CHECK_FALSE(rig.manager.retain(p));
  CHECK(rig.manager.free(p + 512) == FreeOutcome::interior_pointer);
  // Nothing changed: the slice is still parked and still comes back.
  CHECK(rig.report().thread_parked_bytes == 4 * KiB);
  CHECK(rig.manager.allocate(4 * KiB).ptr == p);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("another thread frees a cached live slice; the pointer is then freed for everyone") {
  CacheRig rig;
  const DevicePtr p = rig.cached(8 * KiB);
  FreeOutcome outcome = FreeOutcome::not_mine;
  run_thread([&] { outcome = rig.manager.free(p); });
  CHECK(outcome == FreeOutcome::freed);
  CHECK(rig.manager.live_size(p) == 0);
  CHECK(rig.manager.free(p) == FreeOutcome::double_free);
  CHECK(rig.report().thread_parked_bytes == 0);
  CHECK(rig.manager.memory_usage().bytes_in_use == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a pinned slice leaves the cache: its free holds it and it is never handed out") {
  CacheRig rig;
  const DevicePtr p = rig.cached(16 * KiB);
  const RetainedSlice pin = rig.manager.retain(p);
  REQUIRE(pin);
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.report().thread_parked_bytes == 0);
  const DevicePtr next = rig.manager.allocate(16 * KiB).ptr;
  CHECK(next != p);
  CHECK(rig.manager.release_retained(pin));
  CHECK(rig.manager.free(next) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("frees that need a fence never park") {
  SUBCASE("free_fence:events") {
    CacheRig rig(FreeFence::events);
    const DevicePtr p = rig.cached(64 * KiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    CHECK(rig.report().thread_caches == 0);
    CHECK(rig.report().thread_parked_bytes == 0);
  }
  SUBCASE("free_fence:auto while the device's work is not one ordered queue") {
    CacheRig rig(FreeFence::automatic);
    const DevicePtr p = rig.cached(64 * KiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    CHECK(rig.report().thread_parked_bytes == 0);
    CHECK(rig.manager.memory_usage().bytes_in_use == 0);
  }
}

TEST_CASE("leaving ordered reuse gives parked slices back at once and shuts the caches") {
  CacheRig rig(FreeFence::automatic);
  rig.manager.set_stream_ordered(true);
  const DevicePtr p = rig.cached(64 * KiB);
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  REQUIRE(rig.report().thread_parked_bytes == 64 * KiB);
  const std::uint64_t fences = rig.device.calls().fence_record;
  rig.manager.set_stream_ordered(false);
  const ManagerReport r = rig.report();
  CHECK(r.thread_parked_bytes == 0);
  CHECK(r.bytes_in_use == 0);
  // Freed while reuse was immediate: free again now, as the manager's own free left it.
  CHECK(r.pending_fence_bytes == 0);
  CHECK(rig.device.calls().fence_record == fences);
  CHECK(rig.manager.allocate(64 * KiB).ptr == p);
  // Later frees are fenced and park nowhere.
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.report().thread_parked_bytes == 0);
  CHECK(rig.report().pending_fence_bytes == 64 * KiB);
  CHECK(rig.report().thread_cache_hits == 0);
}

TEST_CASE("capture and persistent windows shut the caches") {
  CacheRig rig;
  const DevicePtr p = rig.cached(64 * KiB);
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  SUBCASE("capture") { rig.manager.set_capture_window(true); }
  SUBCASE("persistent window") { rig.manager.set_mode(AllocationMode::persistent); }
  CHECK(rig.report().thread_parked_bytes == 0);
  const DevicePtr q = rig.manager.allocate(64 * KiB).ptr;
  CHECK(q != p);
  CHECK(rig.report().persistent.slices == 1);  // the window's request went where it must
}

TEST_CASE("a cache parks at most a 64th of the device, and at least 4 MiB") {
  CHECK(thread_cache_parked_max(0) == 4 * MiB);  // device memory unknown
  CHECK(thread_cache_parked_max(128 * MiB) == 4 * MiB);
  CHECK(thread_cache_parked_max(16 * GiB) == 256 * MiB);
  CacheRig rig(FreeFence::none, custom({sliced(4 * MiB, 2 * MiB)}));
  std::vector<DevicePtr> live;
  for (int i = 0; i < 8; ++i) live.push_back(rig.manager.allocate(MiB).ptr);
  for (const DevicePtr p : live) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  const ManagerReport r = rig.report();
  CHECK(r.thread_parked_bytes == 4 * MiB);
  // The program holds nothing; its pool still holds the parked slices.
  CHECK(r.bytes_in_use == 0);
  CHECK(rig.manager.memory_usage().number_allocs == 0);
  CHECK(r.dynamic.at(0).bytes_in_use == 4 * MiB);
}

TEST_CASE("a large page comes back through the cache too, without the pools") {
  CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB)}), 4 * GiB);
  const DevicePtr p = rig.cached(48 * MiB);
  const std::uint64_t allocs = rig.device.calls().allocate;
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.report().thread_parked_bytes == 48 * MiB);
  CHECK(rig.manager.allocate(48 * MiB).ptr == p);
  CHECK(rig.report().thread_cache_hits == 1);
  CHECK(rig.device.calls().allocate == allocs);
  // Past the bound (a 64th of 4 GiB: 64 MiB) a free takes the pools' path.
  const DevicePtr q = rig.cached(32 * MiB);
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(q) == FreeOutcome::freed);
  CHECK(rig.report().thread_parked_bytes == 48 * MiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a pool takes back other threads' parked slices before it grows") {
  SUBCASE("another thread's request of the same size, or of another that the page fits") {
    // An exclusive page serves up to twice its class.
    for (const auto& [parked, asked] : {std::pair{16 * MiB, 16 * MiB}, {32 * MiB, 20 * MiB}}) {
      CacheRig rig(FreeFence::none, custom({exclusive(GiB)}), 4 * GiB);
      const DevicePtr p = rig.cached(parked);
      REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
      const std::uint64_t allocs = rig.device.calls().allocate;
      DevicePtr from_thread = 0;
      run_thread([&] { from_thread = rig.manager.allocate(asked).ptr; });
      CHECK(from_thread == p);
      CHECK(rig.device.calls().allocate == allocs);
      CHECK(rig.report().thread_parked_bytes == 0);
      CHECK(rig.manager.check_consistency().empty());
    }
  }
  SUBCASE("the caller's own parked slices reused lately stay: they are its working set") {
    CacheRig rig(FreeFence::none, custom({exclusive(GiB)}), 4 * GiB);
    const DevicePtr p = rig.cached(32 * MiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    const std::uint64_t allocs = rig.device.calls().allocate;
    const DevicePtr q = rig.manager.allocate(20 * MiB).ptr;
    CHECK(q != p);
    CHECK(rig.device.calls().allocate == allocs + 1);
    CHECK(rig.manager.allocate(32 * MiB).ptr == p);  // still there for its own size
    CHECK(rig.manager.free(q) == FreeOutcome::freed);
    CHECK(rig.manager.check_consistency().empty());
  }
  SUBCASE("the caller's own parked slices not reused since an expiry pass go back") {
    CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB)}), 4 * GiB);
    const DevicePtr p = rig.cached(32 * MiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    // One expiry pass (kThreadCacheExpiry requests that reach the pools) marks it unused.
    std::vector<DevicePtr> others;
    for (std::uint64_t i = 0; i < kThreadCacheExpiry; ++i)
      others.push_back(rig.manager.allocate(KiB * (i + 1)).ptr);
    REQUIRE(rig.report().thread_parked_bytes == 32 * MiB);
    const std::uint64_t allocs = rig.device.calls().allocate;
    CHECK(rig.manager.allocate(20 * MiB).ptr == p);
    CHECK(rig.device.calls().allocate == allocs);
    for (const DevicePtr q : others) CHECK(rig.manager.free(q) == FreeOutcome::freed);
    CHECK(rig.manager.check_consistency().empty());
  }
  SUBCASE("on a full device the caller's own parked page serves, without out-of-memory "
          "recovery") {
    CacheRig rig(FreeFence::none, custom({exclusive(4 * GiB)}), 4 * GiB);
    const DevicePtr p = rig.cached(32 * MiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    REQUIRE(rig.report().thread_parked_bytes == 32 * MiB);
    const DevicePtr filler = rig.manager.allocate(4 * GiB - 40 * MiB).ptr;  // 8 MiB left
    REQUIRE(filler != 0);
    CHECK(rig.manager.allocate(20 * MiB).ptr == p);
    CHECK(rig.report().oom_recoveries == 0);
    CHECK(rig.report().thread_parked_bytes == 0);
    CHECK(rig.manager.free(filler) == FreeOutcome::freed);
    CHECK(rig.manager.check_consistency().empty());
  }
  SUBCASE("a direct pool takes them all back, to stay within its reclaim bound") {
    CacheRig rig(FreeFence::none, custom({direct(64 * MiB)}), 4 * GiB);
    std::vector<DevicePtr> parked;
    for (const std::uint64_t size : {20 * MiB, 21 * MiB, 22 * MiB})
      parked.push_back(rig.cached(size));
    for (const DevicePtr q : parked) REQUIRE(rig.manager.free(q) == FreeOutcome::freed);
    REQUIRE(rig.report().thread_parked_bytes >= 63 * MiB);
    const DevicePtr big = rig.manager.allocate(40 * MiB).ptr;
    REQUIRE(big != 0);
    CHECK(rig.manager.memory_usage().bytes_reserved <= 64 * MiB);
    CHECK(rig.manager.free(big) == FreeOutcome::freed);
    CHECK(rig.manager.check_consistency().empty());
  }
  SUBCASE("a parked slice of another pool stays") {
    CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB)}), 4 * GiB);
    REQUIRE(rig.manager.free(rig.cached(64 * KiB)) == FreeOutcome::freed);
    REQUIRE(rig.manager.allocate(16 * MiB).ptr != 0);
    CHECK(rig.report().thread_parked_bytes == 64 * KiB);
  }
}

TEST_CASE("pages that only parked slices keep count as idle for cudaMemGetInfo") {
  CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB)}), 4 * GiB);
  const DevicePtr big = rig.cached(16 * MiB);
  const DevicePtr small = rig.cached(64 * KiB);
  const DevicePtr neighbour = rig.manager.allocate(64 * KiB + 512).ptr;  // same 2 MiB page
  REQUIRE(neighbour != 0);
  const std::uint64_t idle_before = rig.manager.idle_bytes();
  REQUIRE(rig.manager.free(big) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(small) == FreeOutcome::freed);
  REQUIRE(rig.report().thread_parked_bytes == 16 * MiB + 64 * KiB);
  // The 16 MiB page is idle but for the cache; the 2 MiB page still holds a live slice.
  CHECK(rig.manager.idle_bytes() == idle_before + 16 * MiB);
  REQUIRE(rig.manager.free(neighbour) == FreeOutcome::freed);
  CHECK(rig.manager.idle_bytes() == idle_before + 16 * MiB + 2 * MiB);
}

TEST_CASE("parked slices are given back: cleanup, out-of-memory recovery, expiry, forget") {
  SUBCASE("explicit cleanup returns every page") {
    CacheRig rig;
    REQUIRE(rig.manager.free(rig.cached(64 * KiB)) == FreeOutcome::freed);
    rig.manager.cleanup(true);
    CHECK(rig.report().thread_parked_bytes == 0);
    CHECK(rig.manager.memory_usage().bytes_reserved == 0);
    CHECK(rig.device.outstanding_bytes() == 0);
  }
  SUBCASE("out-of-memory recovery uses them") {
    // Two 2 MiB pages fill the device; a parked slice keeps one of them busy.
    CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(4 * MiB)}), 4 * MiB);
    REQUIRE(rig.manager.free(rig.cached(MiB)) == FreeOutcome::freed);
    const DevicePtr other = rig.manager.allocate(2 * MiB).ptr;  // the exclusive pool's page
    REQUIRE(other != 0);
    REQUIRE(rig.manager.free(other) == FreeOutcome::freed);
    REQUIRE(rig.report().thread_parked_bytes == MiB);
    const Reservation whole = rig.manager.allocate(4 * MiB);
    CHECK(whole.ptr != 0);
    CHECK(rig.report().thread_parked_bytes == 0);
  }
  SUBCASE("a size that stops recurring expires") {
    CacheRig rig;
    const DevicePtr p = rig.cached(64 * KiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    std::vector<DevicePtr> others;
    for (std::uint64_t i = 0; i < 2 * kThreadCacheExpiry; ++i)
      others.push_back(rig.manager.allocate(KiB * (i + 1)).ptr);
    CHECK(rig.report().thread_parked_bytes == 0);
    std::uint64_t requested = 0;
    for (std::uint64_t i = 0; i < others.size(); ++i) requested += KiB * (i + 1);
    CHECK(rig.manager.memory_usage().bytes_in_use == requested);  // the parked slice is free
    for (const DevicePtr q : others) CHECK(rig.manager.free(q) == FreeOutcome::freed);
  }
  SUBCASE("a size that stops recurring expires while the cache serves others") {
    CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB)}), 4 * GiB);
    REQUIRE(rig.manager.free(rig.cached(16 * MiB)) == FreeOutcome::freed);
    const DevicePtr p = rig.cached(64 * KiB);
    const std::uint64_t manager_path = rig.report().thread_cache_hits;
    for (std::uint64_t i = 0; i < 3 * kThreadCacheClockBatch; ++i) {
      REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
      REQUIRE(rig.manager.allocate(64 * KiB).ptr == p);
    }
    CHECK(rig.report().thread_cache_hits == manager_path + 3 * kThreadCacheClockBatch);
    CHECK(rig.report().thread_parked_bytes == 0);  // the 16 MiB page went back to its pool
    CHECK(rig.manager.idle_bytes() >= 16 * MiB);
  }
  SUBCASE("forget drops them with everything else") {
    CacheRig rig;
    REQUIRE(rig.manager.free(rig.cached(64 * KiB)) == FreeOutcome::freed);
    rig.manager.forget();
    CHECK(rig.report().thread_parked_bytes == 0);
    const DevicePtr p = rig.cached(64 * KiB);
    CHECK(p != 0);
    CHECK(rig.manager.check_consistency().empty());
  }
}

TEST_CASE("a capped pool takes back its parked slices before it refuses or spills") {
  CacheRig rig(FreeFence::none, custom({sliced(MiB, MiB, MiB)}));
  REQUIRE(rig.manager.free(rig.cached(512 * KiB)) == FreeOutcome::freed);
  REQUIRE(rig.report().thread_parked_bytes == 512 * KiB);
  const Reservation whole = rig.manager.allocate(MiB);
  CHECK(whole.ptr != 0);
  CHECK(rig.report().thread_parked_bytes == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("requests a cache serves move the clock: idle pages still go back after their period") {
  CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(64 * MiB, 10)}));
  const DevicePtr big = rig.manager.allocate(32 * MiB).ptr;
  REQUIRE(big != 0);
  REQUIRE(rig.manager.free(big) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(rig.cached(64 * KiB)) == FreeOutcome::freed);
  for (int i = 0; i < 1000; ++i) {
    const DevicePtr p = rig.manager.allocate(64 * KiB).ptr;
    REQUIRE(p != 0);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  }
  CHECK(rig.report().thread_cache_hits >= 999);
  CHECK(rig.device.outstanding_bytes() < 32 * MiB);  // the idle 32 MiB page went back
}

TEST_CASE("a quiet thread's parked page still goes back after its pool's period") {
  CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB, 1000)}), 4 * GiB);
  Worker quiet;
  quiet.run([&] {
    for (int i = 0; i < 2; ++i)
      REQUIRE(rig.manager.free(rig.manager.allocate(32 * MiB).ptr) == FreeOutcome::freed);
  });
  REQUIRE(rig.report().thread_parked_bytes == 32 * MiB);
  // This thread's sizes never repeat within its cache's memory: each reaches the pools.
  for (std::uint64_t i = 0; i < 4000; ++i) {
    const DevicePtr p = rig.manager.allocate(KiB + 512 * (i % 97)).ptr;
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  }
  CHECK(rig.report().thread_parked_bytes < 32 * MiB);
  CHECK(rig.device.outstanding_bytes() < 32 * MiB);  // the page went back to the device
}

TEST_CASE("a busy thread keeps its cache through other threads' cleanups") {
  // The other thread's pages go idle at each free and their period is 1: each of its
  // reservations runs an implicit cleanup.
  CacheRig rig(FreeFence::none, custom({sliced(2 * MiB, MiB), exclusive(GiB, 1)}));
  const DevicePtr p = rig.cached(64 * KiB);
  REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  Worker other;
  const std::uint64_t hits = rig.report().thread_cache_hits;
  for (std::uint64_t i = 0; i < 3000; ++i) {
    other.run([&] {
      for (int k = 0; k < 2; ++k) {
        const DevicePtr q = rig.manager.allocate(4 * MiB + 512 * ((i * 2 + k) % 997)).ptr;
        REQUIRE(rig.manager.free(q) == FreeOutcome::freed);
      }
    });
    REQUIRE(rig.manager.allocate(64 * KiB).ptr == p);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  }
  CHECK(rig.report().thread_cache_hits == hits + 3000);
}

TEST_CASE("log:full traces every call, so it shuts the caches") {
  HostDevice device(128 * MiB, 512);
  ManagerOptions o = cached_options();
  o.log = LogLevel::full;
  std::size_t lines = 0;
  o.log_sink = [&](LogLevel, std::string_view) { ++lines; };
  MemoryManager manager(device, o);
  for (int i = 0; i < 4; ++i)
    REQUIRE(manager.free(manager.allocate(4 * KiB).ptr) == FreeOutcome::freed);
  CHECK(lines == 8);
  CHECK(manager.report().thread_caches == 0);
}

TEST_CASE("an exited thread's cache is adopted by the next thread, parked slices and all") {
  CacheRig rig;
  DevicePtr parked = 0;
  run_thread([&] {
    parked = rig.cached(32 * KiB);
    REQUIRE(rig.manager.free(parked) == FreeOutcome::freed);
  });
  ManagerReport r = rig.report();
  CHECK(r.thread_caches == 1);  // the exited thread's, waiting to be adopted
  CHECK(r.thread_parked_bytes == 32 * KiB);
  CHECK(rig.manager.free(parked) == FreeOutcome::double_free);
  run_thread([&] {
    const DevicePtr p = rig.cached(32 * KiB);
    CHECK(p != 0);
    CHECK(rig.report().thread_caches == 1);  // adopted, not a second one
    CHECK(rig.manager.free(p) == FreeOutcome::freed);
    CHECK(rig.manager.allocate(32 * KiB).ptr != 0);  // served by the cache it adopted
  });
  CHECK(rig.report().thread_cache_hits >= 1);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("one thread through many managers: a dead manager's cache slot is reused") {
  for (int round = 0; round < 20; ++round) {
    CacheRig rig;
    const DevicePtr p = rig.cached(64 * KiB);
    REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
    CHECK(rig.manager.allocate(64 * KiB).ptr == p);
    CHECK(rig.report().thread_cache_hits == 1);
  }
}

TEST_CASE("many threads, frees across threads: consistent, and everything comes back") {
  CacheRig rig;
  constexpr int kThreads = 4;
  constexpr int kRounds = 3000;
  std::mutex handoff_mutex;
  std::deque<DevicePtr> handoff;  // pointers one thread allocates and another frees
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const std::uint64_t size = KiB * static_cast<std::uint64_t>(1 + (i + t) % 3);
        const DevicePtr p = rig.manager.allocate(size).ptr;
        if (p == 0) {
          ++failures;
          continue;
        }
        if (i % 5 == 0) {
          std::lock_guard hold(handoff_mutex);
          handoff.push_back(p);
        } else if (rig.manager.free(p) != FreeOutcome::freed) {
          ++failures;
        }
        DevicePtr theirs = 0;
        {
          std::lock_guard hold(handoff_mutex);
          if (!handoff.empty() && i % 2 == 0) {
            theirs = handoff.front();
            handoff.pop_front();
          }
        }
        if (theirs != 0 && rig.manager.free(theirs) != FreeOutcome::freed) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const DevicePtr p : handoff) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(failures.load() == 0);
  CHECK(rig.manager.check_consistency().empty());
  CHECK(rig.report().thread_cache_hits > 0);
  rig.manager.cleanup(true);
  CHECK(rig.manager.memory_usage().bytes_in_use == 0);
  CHECK(rig.device.outstanding_bytes() == 0);
}

TEST_CASE("a forked child's exit leaves the caches alone, even one whose lock was held") {
  // This thread holds the cache's lock, as a flush might at the moment another thread forks.
  const auto cache = std::make_shared<ThreadCache>();
  cache->lock.lock();
  std::atomic<int> child_status{-1};
  std::thread owner([&] {
    REQUIRE(bind_thread_cache(next_manager_id(), cache));
    const pid_t pid = ::fork();
    if (pid == 0) std::exit(0);  // runs the child's copy of this thread's table destructor
    int status = 0;
    for (int waited = 0; waited < 1000 && ::waitpid(pid, &status, WNOHANG) != pid; ++waited) {
      if (waited == 999) {  // 10 s: the child hangs on the lock
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
      ::usleep(10000);
    }
    child_status = status;
  });
  while (child_status.load() == -1) std::this_thread::yield();
  CHECK(WIFEXITED(child_status.load()));
  cache->lock.unlock();  // the owner's own exit, in this process, takes the lock
  owner.join();
  CHECK(cache->orphaned);  // and marks the cache for adoption
}
