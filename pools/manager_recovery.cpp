// Out-of-memory recovery: what a reservation the pools and the driver refused does before the
// program sees cudaErrorMemoryAllocation (give idle memory back in two steps, wait for fences and
// for released pages to reach the driver, route again, within one bound), and the wait of a
// growth for another thread's recovery. The routing it retries is in memory_manager.cpp, the
// bound's rules in wait_bound.h. Depends on pools/ only.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "pools/manager_impl.h"
#include "pools/manager_shards.h"

namespace poolcuda {

// Note [Out of memory among threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Recovery returns the idle pages and waits for them to reach the driver with the lock
// released, so other threads of the program go on meanwhile, and one retry after that is not
// enough: another thread that ran out at the same time may have returned its own idle pages
// (the bulk of the device) just after this thread's flush began, so they are still on their
// way to the driver when this thread retries; or another thread may have grown into the memory
// just returned and left new idle pages behind (exclusive pages of sizes no later request
// takes). Both are memory the plain program would have had. So after a failed retry, while
// other threads have given pages to the device since the last flush began (pages_handed) or
// idle pages have appeared again, recovery flushes and retries once more, at most
// kOomExtraRounds times: each such round means another thread made progress, so a busy
// neighbour delays the request a little instead of failing it, and a bounded number of rounds
// keeps it from waiting on that neighbour forever. A flush that timed out (the driver's free
// waits for a parked stream) ends the extra rounds: waiting again would only add its bound.
// With shards (Note [Shards]) the neighbour's idle pages are in its own shard: recovery counts
// what the other shards hold unused before it declares a request out of reach, asks them for
// their idle pages first, and again in each extra round while they have grown new idle pages
// meanwhile (two threads of the 1 GiB random trace failed a 1 GiB request in two runs of six
// without that, on a 16 GiB device holding 6.4 GiB live); their fence-pending memory is waited
// for after this shard's own, within the same bound. And while pages are still on their way to
// the driver when everything else is done, recovery flushes and retries, up to kOomExtraRounds
// times within the bound: two threads recovering at once hand each other's idle pages over, and
// through the library the release thread had 11 GiB of them in flight when a 1 GiB request gave
// up.
// Note [Growth during a recovery]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Recovery gives idle pages back to the driver and routes again once they have arrived; the
// lock is released meanwhile. Another thread that grew a pool in that window took the memory
// being given back, and when its pages went idle again it held them while the recovery gave
// up: two threads of random sizes up to 1 GiB on a 16 GiB device (6.4 GiB live at most) failed
// a 1 GiB request in about one run in fifty, the other shard holding 11 GiB of idle pages
// (plain CUDA never fails it: a free returns the memory). So while a recovery of the device is
// under way (Shards::recovering, in any shard), a reservation that would grow a pool first
// waits for it to end, unlocked, at most kRecoveryGrowthWaitMicros and once per reservation,
// then routes again: its request may fit what the recovery left, or grow as before. A recovery
// counts only while it gives memory back and routes again, not while it waits for fences or
// finds its pages stuck behind a parked stream. Reuse of free memory never waits, nor does
// anything in a capture window, nor a recovery's own routing.
// Note [Fences passing during a recovery]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The route gives up on fence-pending memory after a short wait, and a fence may pass between
// that and the recovery's own reap. The memory it returns serves the request as it is; recovery
// used to count it as idle pages straight away and send them to the driver, whose free waits
// behind any parked stream. A program that freed 12 MiB with cudaFree, launched a graph that
// parks a stream on a host node, and asked for 1 MiB on a 32 MiB budget, was refused after the
// 10 s bound when the memsets before its frees ended in that window (once in a sanitized CI
// run; 8 runs of 12 with a pause of 1 to 50 ms put into the window), where plain CUDA, whose
// frees had returned the memory before the park, served it at once. So each reap that precedes
// a give-back routes first when it took anything back, as the fence rounds already did.
// Note [Recovery in two steps]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Returning every idle page at each out-of-memory empties the pools: the requests after it find no
// page to reuse and each takes a new one from the driver, until the device is full again and the
// next recovery empties them again. So recovery first returns only what this shard's idle pages
// must give for the room the driver has (free bytes and pages on their way, or what a budget has
// left when that is less: Device::growth_room) to cover the page the request needs
// (Pool::growth_bytes of the first pool that accepts it) plus kRecoverySlack: the page that went
// idle first among those that cover the lack alone, or else idle pages in the order they went idle
// (Page::idle_order, whatever their pool) until they do. It waits for them (within the recovery's
// bound, as any of its flushes) and routes once more; only when that fails does it take the second
// step, every idle page of every shard, and the rounds after it. On the random traces of sizes up
// to 1 GiB, where every growth past the first fill meets a full device, that made 1,662 driver
// frees and 3,369 allocations in 100,000 pairs instead of 8,503 and 9,160 (with two threads taking
// turns on one core, 816 and 1,273 instead of 3,703 and 3,987), for 831 recoveries instead of 309,
// and pairs per second through the library went from 1.26M to 2.17M; on a GPU each of those frees
// waits for the device. (Oldest first without the one covering page: 2,277 frees and 3,750
// allocations.) When the room is there already, or on its way, the first step releases nothing and
// only waits for those pages and routes once more: with two threads each recovering, one often
// finds the pages the other gave back, and sending it to the second step instead emptied both
// shards about a hundred times in 100,000 pairs (4,500 to 5,400 driver frees and 6,700 to 7,900
// allocations in runs where the threads ran at once, against 1,900 to 2,300 and 4,000 to 5,100
// now). A first step that cannot help goes straight to the second: when the device's numbers are
// unknown, when this shard's idle pages cannot cover the lack (they are released, and the second
// step's flush waits for them), while a device reset runs, or while released pages are stuck behind
// a parked stream; and so does a refusal with another cause, whose routing fails again.
Route MemoryManager::Impl::recover_from_oom(Scope& scope, std::uint64_t size,
                                            Placement placement) {
  // Counted among the device's recoveries while it gives memory back and routes again, not
  // while it waits for fences or behind a parked stream (Note [Growth during a recovery]).
  struct Counted {
    std::atomic<std::uint32_t>* n;
    explicit Counted(std::atomic<std::uint32_t>& c) : n(&c) {
      n->fetch_add(1, std::memory_order_acq_rel);
    }
    ~Counted() { done(); }
    void done() {
      if (n != nullptr) n->fetch_sub(1, std::memory_order_acq_rel);
      n = nullptr;
    }
  } counted(shards->recovering);
  t_recovery_ran_out_behind = 0;
  flush_caches(false);  // parked slices are memory no one uses
  WaitBound bound{std::chrono::microseconds(options.recovery_wait_micros)};
  // And so is what the other shards keep for no live slice (Note [Shards]): their idle pages
  // go to the driver, and this shard waits for them to arrive, within its bound.
  const bool sharded = shards->count() > 1;
  const auto elsewhere = [&] { return sharded ? shards->unused_elsewhere(shard_index) : 0; };
  const auto trim_others = [&] {
    scope.unlock();
    const bool gave = shards->trim_others(shard_index);
    if (gave && shards->flush_stuck_releasing.load(std::memory_order_relaxed) == 0)
      flush_within(device, bound);
    scope.relock();
    return gave;
  };
  // What they hold free without a page to give (passed fences, parked slices) is lent first, if a
  // page of it fits: sent to the driver, its free would wait behind any parked stream.
  const auto lent_by_others = [&](Route* out) {
    scope.unlock();
    const bool took = shards->reap_others(shard_index);
    scope.relock();
    if (!took) return false;
    Route lent = route(size, placement, 0);
    if (lent.slice == nullptr &&
        (lent.status == AllocStatus::out_of_memory || lent.wait_for_fence))
      return false;
    *out = lent;
    return true;
  };
  // Their memory waiting on fences, within this recovery's bound.
  const auto drain_others = [&] {
    scope.unlock();
    const bool passed = shards->drain_others(shard_index, bound);
    scope.relock();
    return passed;
  };
  // A request no recovery can serve fails at once, as the real cudaMalloc does, without waiting
  // for anything (Note [Recovery and parked streams]); with shards, what the others hold unused
  // counts too, their parked slices included (not asked for a request larger than the device).
  if (sharded && (total_memory == 0 || size <= total_memory)) {
    scope.unlock();
    shards->unpark_others(shard_index);
    scope.relock();
  }
  // Empty managed slabs are memory no one uses either; they go first, being the cheapest.
  scope.unlock();
  device.give_back_elsewhere(bound);
  scope.relock();
  if (beyond_reach(size, elsewhere())) {
    Route r;
    r.status = AllocStatus::out_of_memory;
    r.error = Error{ErrorKind::out_of_memory, size};
    return r;
  }
  // A flush of an earlier recovery ran out and no page reached the driver since: the driver's
  // frees still wait behind a parked stream, and waiting again would only cost the bound again.
  const auto stuck_before = [&] {
    const std::uint64_t at = shards->flush_stuck_releasing.load(std::memory_order_relaxed);
    return at != 0 && at == device.releasing_bytes();
  };
  bool stuck = stuck_before();
  bool flush_ran_out = false;
  std::uint64_t handed_before_flush = 0;
  int extra_rounds = 0;
  // The pages released so far go to the device, and the recovery waits for every page on its
  // way to arrive, within its bound.
  const auto flush_releases = [&] {
    scope.unlock();
    // Read after this thread's pages went: a later change is another thread's.
    handed_before_flush = pages_handed_everywhere();
    // Pages stuck behind a parked stream stay stuck: no later round waits for them again.
    const bool flushed = flush_within(device, bound);
    scope.relock();
    if (flushed) {
      shards->flush_stuck_releasing.store(0, std::memory_order_relaxed);
      return;
    }
    stuck = flush_ran_out = true;
    t_recovery_ran_out_behind = device.release_in_flight();
    counted.done();
    extra_rounds = kOomExtraRounds;
    // During a capture what is still on its way may be pages whose free the driver refused for
    // the capture (Note [Releases during capture] in interpose/release_worker.cpp), which reach
    // it once the capture ends, not behind a parked stream: a recovery after the capture must
    // wait for them again, so a run-out during one is not remembered.
    const std::uint64_t still = device.releasing_bytes();
    if (still != 0 && !device.capture_active())
      shards->flush_stuck_releasing.store(still, std::memory_order_relaxed);
  };
  // Note [Fences passing during a recovery].
  const auto reaped_serves = [&](Route* out) {
    if (close_and_reap() == 0) return false;
    const Route r = route(size, placement, 0);
    if (r.slice == nullptr && (r.status == AllocStatus::out_of_memory || r.wait_for_fence))
      return false;
    *out = r;
    return true;
  };
  Route reused;
  if (reaped_serves(&reused)) return reused;
  // The first step: only what this shard's idle pages must give for the page the request needs
  // (Note [Recovery in two steps]).
  if (!stuck && frozen == 0) {
    const DeviceMemoryInfo info = device.memory_info();
    // Under a budget the driver's free bytes are not what refused the page. Pages on their way
    // count against both until they arrive.
    const std::uint64_t coming =
        std::min<std::uint64_t>(info.free_bytes, device.growth_room()) + releases_on_the_way();
    std::uint64_t page = align_up(size, ctx.alignment);
    for (const auto& pool : pools) {
      // A pool that can never grow here is passed over (Note [Pages larger than the device]).
      if (!pool->accepts(size) || never_grows(*pool)) continue;
      page = pool->growth_bytes(size);
      break;
    }
    const std::uint64_t need = page + kRecoverySlack;
    if (info.total_bytes != 0) {
      // The room there or coming already (another thread's recovery gave pages back meanwhile)
      // only needs its pages to arrive. Released and not enough: the second step's flush waits
      // for these pages too.
      if (need <= coming || release_oldest_idle(need - coming) + coming >= need) {
        flush_releases();
        if (!stuck) {
          Route r = route(size, placement, 0);
          if (r.slice != nullptr || (r.status != AllocStatus::out_of_memory && !r.wait_for_fence))
            return r;
        }
      }
    }
  }
  // The second: everything that needs no wait, the other shards' idle pages and this one's.
  if (sharded) {
    Route lent;
    if (lent_by_others(&lent)) return lent;
    trim_others();
  }
  stuck = flush_ran_out || stuck_before();
  if (stuck) {
    counted.done();
    extra_rounds = kOomExtraRounds;
  }
  if (reaped_serves(&reused)) return reused;
  cleanup_all(true);
  // Pages given up earlier (by trims or dealloc periods) may still be on their way to the
  // driver too, so the first round flushes whether or not this one released anything.
  bool flush = true;
  int arrival_rounds = 0;  // the last step's rounds: a neighbour releasing without end
  for (;;) {
    if ((flush || scope.has_releases()) && !stuck) flush_releases();
    flush = false;
    Route r = route(size, placement, 0);
    if (r.slice != nullptr) return r;
    if (r.wait_for_fence) {
      // A capped pool full of fence-pending memory: the fence rounds below wait for it.
      r = Route{};
      r.status = AllocStatus::out_of_memory;
      r.error = Error{ErrorKind::out_of_memory, size};
    }
    if (r.status != AllocStatus::out_of_memory) return r;
    // Other threads' pages, on their way or idle again (Note [Out of memory among threads]).
    if (extra_rounds < kOomExtraRounds) {
      ++extra_rounds;
      // A fence that passed since the last wait returns memory the route may use as it is; the
      // cleanup below would send its pages to the driver first (whose free waits behind any
      // parked stream).
      if (fences.reap(device, kGiveBack) != 0) continue;
      // Released now, or by the route itself (a fence passed meanwhile, and a direct pool
      // returned the page it freed to make room): the next round flushes.
      if (cleanup_all(true) != 0 || scope.has_releases()) continue;
      if (pages_handed_everywhere() != handed_before_flush) {
        flush = true;
        continue;
      }
      // Another shard grew and left idle pages again since it gave back.
      Route lent;
      if (sharded && lent_by_others(&lent)) return lent;
      if (sharded && trim_others()) {
        flush = true;
        continue;
      }
    }
    // Then the fences, oldest first, retrying after each (Note [Free fences]); this shard's,
    // then the other shards'. Waits that may last: others grow meanwhile as before.
    counted.done();
    if (fences.open_count() != 0 && !fences.close(device)) return r;  // a capture is open
    const FenceWait waited = wait_for_oldest_fence(scope, bound);
    // Nothing came back here (a slice ran out behind a park, or no fence is left): the other
    // shards' fences next, a slice each at most.
    if (waited != FenceWait::passed && sharded && !stuck && drain_others()) {
      // What came free there is lent first (Pool::new_page borrows another shard's idle page):
      // sent to the driver instead, its free would wait behind any parked stream. Only what no
      // page lent serves goes back to the driver, and the rounds wait for it.
      const Route lent = route(size, placement, 0);
      if (lent.slice != nullptr ||
          (lent.status != AllocStatus::out_of_memory && !lent.wait_for_fence))
        return lent;
      trim_others();
      flush = true;
      continue;
    }
    if (waited == FenceWait::none) {
      // Pages other threads gave up meanwhile are still on their way to the driver (with shards,
      // both threads' recoveries hand each other's idle pages over): wait for them while the
      // bound lasts, as long as flushes complete, for at most kOomExtraRounds flushes: a
      // neighbour that always has a page on its way must not keep a request the device cannot
      // serve spinning until the bound.
      if (stuck || device.releasing_bytes() == 0 || bound.over() ||
          ++arrival_rounds > kOomExtraRounds) {
        // A give-back right after (the hooks' retry of the request through the driver) would
        // wait the whole bound again for what this one waited for in vain.
        if (bound.over()) {
          give_back_stuck = GiveBackState{pending(), device.releasing_bytes(),
                                          frees.load(std::memory_order_relaxed),
                                          options.recovery_wait_micros};
        }
        return r;
      }
      flush = true;
      continue;
    }
    // What the fences returned serves as it is, before idle pages go back to the driver (whose
    // free of them waits behind any parked stream).
    reused = route(size, placement, 0);
    if (reused.slice != nullptr) return reused;
    cleanup_all(true);
  }
}

void MemoryManager::Impl::wait_for_recoveries(Scope& scope) {
  // A recovery's give-back and retry take a flush of released pages; one stuck behind a parked
  // stream must not hold other threads' growths for long.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(std::min(options.recovery_wait_micros,
                                                           kRecoveryGrowthWaitMicros));
  ++oom_growth_waits;
  scope.unlock();
  while (shards->recovering.load(std::memory_order_acquire) != 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  scope.relock();
}

}  // namespace poolcuda
