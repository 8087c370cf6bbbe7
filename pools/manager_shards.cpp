// The shards of a MemoryManager: which shard a thread reserves from, when a thread moves and
// a new shard is made, which requests a thread's own shard serves, the gate that keeps
// captures, persistent windows, capped layouts and layout changes on the first shard, the idle
// pages shards lend each other, the clocks they share, and what one shard's out-of-memory
// recovery takes from the others.
//
// Note [Shards]
// ~~~~~~~~~~~~~
// Thread caches (Note [Thread caches]) serve threads that reuse sizes; sizes that do not repeat
// still reach the pools, and with one lock two threads took turns: each pair moved the lock and
// the pools' state (free sets, index, slices) between their cores, and two threads made fewer
// pairs per second than one. The lock was rarely found held (1.5% of reservations on a random
// trace): the cost is the state moving, so contention cannot tell when to split. So a manager's
// pools are split into shards: each shard is a whole set of pools (MemoryManager::Impl, with its
// own lock, pages, index, fences and caches) over the same Device, and every thread has a home.
// Which shard. A thread starts at the first. Each shard remembers the thread that reserved from
// it last; a reservation of the calling thread in its home is shared when another thread
// reserved there since. A shared reservation within kShardWindow of the thread's reservations
// after another shared one moves the thread to a later shard (1 to options.shards - 1, taken in
// turn, so two threads that move at once part), made then if new. The thread that moves forgets
// its last reservation in the shard it leaves, so the one that stays does not move as well. A
// thread's first kShardSettle reservations in its homes (one count for every device's manager, as
// the home itself is) neither move it nor count as sharing for the others: a thread whose sizes
// repeat reaches the shard only until its thread cache holds them (two reservations per size), and
// a move then made a shard, and a page in each of its pools, for calls the cache served from then
// on (two threads each looping one 64 KiB buffer held two pages in a quarter of the runs); a busy
// thread must not move for a newcomer's settling either, or it would leave its warm shard to the
// newcomer. A program with one allocating thread never makes a second shard; a thread that reserves
// now and then beside a busy one moves itself after kShardSettle + 2 reservations, and the busy one
// stays.
// Which requests. Each shard holds a partly used page of every sliced pool it serves, so a
// request a sliced pool serves comes from the thread's own shard only when that pool's pages
// are at most a kShardPageShare-th of the most bytes the device has had in use since its layout
// was installed or its memory forgotten (plan(), redone every kShardPlanEvery reservations from
// what each shard published), or at most a kShardDeviceShare-th of the device's memory; larger
// ones come from the first shard, whose lock the threads then share for them. The device's share
// is there from the start: with only the peak, every sliced request of a program came from the
// first shard until its first plan, and the 8 MiB pool's until a quarter of a GiB was in use,
// and a thread's requests went back and forth between the two shards' pages meanwhile. On the
// stand-in's 16 GiB, with two threads (medians of ten interleaved runs through the library):
// the ring of 16 buffers each, 512 B to 16 MiB, 3.12M → 4.52M pairs a second; 10k random sizes
// up to 1 MiB 2.14M → 2.72M, reserving 1.16 → 1.05 times the live bytes; 100k of them 3.26M →
// 5.28M, 1.37 → 1.17 times, 598 → 267 driver allocations. What it costs: in each shard, a
// partly used page of each such pool, each at most a 1024th of the device unless the pool's
// pages widened with what it holds (Note [Wider pages] in sliced_pool.cpp), even for a program
// that holds far less; the held bound allows each shard that much (Note [Held memory bound]).
// For pages larger than that share (any on a device under 2 GiB), the peak decides, and the
// most, not the bytes in use now: what a partly used page costs is weighed against the
// program's peak, and a program whose use swings (a ring of buffers of random sizes) otherwise
// sent its threads to the first shard's lock whenever its use dipped: 16 buffers each of two
// threads, 512 B to 16 MiB, kept 2 MiB pages in the first shard most of the time (2.1M pairs per
// second, against 3.1M to 3.4M in medians of eight runs once the peak decided, with the same
// 1.45 times the bytes in use reserved). A peak that fades by a 64th a plan kept less of that
// (2.6M). The pools at the end of the layout whose pages are sized by their requests
// (exclusive, split, direct) need no partly used page in each shard (a split pool splits only
// pages it already holds), and their idle pages shards lend: their requests always come from
// the thread's own.
// Frees. A pointer lies in the pages of one shard at most, and each shard's pages and index
// are its own: a free tries the calling thread's home shard first, then the others, and the
// first shard whose pages hold the pointer decides (freed, or the bad-free classification of
// Note [Thread caches] and classify()). So a thread may free what another allocated, as with
// one shard; it costs one more lock per shard tried.
// The gate. Shards other than the first take reservations only while the gate is open. It
// closes while a stream capture or a persistent window is open (the capture policy primes and
// pins the first shard's persistent pool: a capture's reservations must find that memory),
// while the layout has a capped pool (a cap holds for the device only if one shard takes every
// reservation), and while a layout is installed. A later shard reads the gate under its own
// lock, and closing it takes every later shard's lock once after storing false, so when the
// close returns no reservation that saw it open is still under way there; the reservation that
// finds it closed goes to the first shard. Frees, pins and cleanups reach every shard whatever
// the gate says, and the device-wide settings (stream order, freezes, captures, windows) are
// set in every shard under the `shards` lock, which also makes new shards, so a new shard starts
// from them; no shard is made while the gate is closed.
// Idle pages. A shard that must grow takes, instead of a new page from the device, an idle page of
// a size its pool can use from another shard (borrow_page, called from Pool::new_page under the
// growing shard's lock). Two shards that borrow from each other at once must not wait for each
// other, so the other shard's lock is only tried, kBorrowTries times a few pauses apart (Note
// [Spinning before parking] in pools/lock_order.h), a shard that is itself borrowing is passed over
// at once (it holds its own lock meanwhile), and a shard whose published idle bytes are too few,
// and whose thread caches parked nothing since they were last emptied, is not tried at all; a shard
// tried first sweeps its thread caches (the slices parked in caches no call used since the last
// sweep go back to its pools). Without this, pages one thread freed sat idle in its shard while the
// other thread's shard grew: the 64 MiB random traces with two threads reserved 1.65 times their
// live bytes instead of 1.38.
// Clocks. Dealloc periods count reservations, and each shard has its own clock: a shard no
// thread calls home any more would never see its idle pages expire. Each time a shard's clock
// crosses a multiple of kShardClockSync (its reservations move it, and 64 at a time the requests
// its threads' caches serve), every other shard whose clock is behind catches up with it and
// runs the cleanups and cache sweeps that come due.
// Out of memory. A shard's recovery has the other shards' thread caches give back their parked
// slices (unpark_others) and counts what the other shards hold unused before it declares a
// request out of reach; then they give back their idle pages without waiting (trim_others),
// and the recovering shard waits for those pages to reach the driver, again in each extra
// round while they grow new idle pages (Note [Out of memory among threads] in
// manager_recovery.cpp), and once this shard's fences are all waited for, their fence-pending
// memory is waited for too (drain_others), all within the one recovery bound; what those waits
// free is lent to the recovering shard if a page of it fits, and only then goes to the driver,
// whose free waits behind any parked stream. So memory idle or freed in one shard is never the
// reason another shard's reservation fails. A sliced pool's request that still fails
// in the thread's own shard is routed once more in each other shard, the first one first,
// without waits: their used pages may have room. (Once only the first was tried: on a 96 MiB
// device, a thread alone in the first shard was refused 415 KB with 11 MB free inside the pages
// that two exited threads' last slices kept in the later shards, where the plain run had room.)
// What else a shard costs. The fence bound and a direct pool's reclaim threshold are per shard.
// Reports add the shards up, except the peaks (Note [Device peaks]).
//
// Note [Device peaks]
// ~~~~~~~~~~~~~~~~~~~
// A device's peaks in use and reserved are what an operator divides to see the pools' overhead.
// With one shard they are exact. The sum of each shard's own peak is not a peak of the device:
// the shards peak at different times, and two threads of random sizes up to 64 MiB, 6 GiB live
// at most, showed 9 GiB at the peak that way (peak reserved ÷ in use 1.39 where the driver saw
// 1.49). Reserved bytes change only at growths and releases, so the shards add them up in one
// counter (DeviceReserved in pool.h), which a page lent from one shard to another leaves as it
// is: its peak is exact. (Sampled as bytes in use are, from the figures the other shards last
// published, it counted a page a shard had given up but not yet published as gone beside the
// page another shard then got, and said 2.16 GiB of a 2 GiB device.) Nothing adds the bytes in
// use up at every reservation without a line all threads write, so their peak is sampled: a
// shard adds its exact figure to the others' as they last published them (at each of their
// scopes' end) every kShardPublishEvery reservations, whenever its own bytes in use rose by a
// 64th since its last sample, and at each growth. The report takes the most of those samples, of
// each shard's own peak (none is above the device's) and of the figures now. A rise of the
// device's bytes in use between two samples that no shard's own growth or rise shows can go
// unseen.
#include <algorithm>
#include <limits>
#include <new>

#include "pools/layout.h"
#include "pools/manager_shards.h"

namespace poolcuda {


bool layout_capped(const PoolLayout& layout) {
  return std::any_of(layout.custom.begin(), layout.custom.end(),
                     [](const PoolSpec& spec) { return spec.cap.has_value(); });
}

MemoryManager::Shards::Shards(Device& d, const ManagerOptions& o)
    : device(d),
      options(o),
      // Under persistent:enforced and size-match every request is the persistent pool's, whose
      // exact-fit pages (and primed captures) one shard must hold.
      limit(o.persistent == PersistentMode::enforced || o.persistent == PersistentMode::size_match
                ? 1
                : std::clamp<std::uint32_t>(o.shards, 1, kMaxShards)) {
  shard[0] = std::make_unique<Impl>(d, o);
  shard[0]->shards = this;
  shard[0]->ctx.borrow_page = &borrow_page;
  shard[0]->ctx.borrow_owner = shard[0].get();
  shard[0]->ctx.shards_made = &made;
  shard[0]->ctx.device_reserved = &device_reserved;
  shard[0]->ctx.device_peak_in_use = &held_peak;
  capped = layout_capped(o.layout);
  plan_layout(o.layout);
  if (capped) {
    gate_holds = 1;
    open.store(false, std::memory_order_relaxed);
  }
}


void MemoryManager::Shards::note_sharing(ShardHome& t, std::uint32_t k, bool shared) {
  if (t.settling < kShardSettle) {
    ++t.settling;
    return;
  }
  if (!shared) {
    if (t.since_shared < kShardWindow) ++t.since_shared;
    return;
  }
  const bool move = t.since_shared < kShardWindow;
  t.since_shared = 0;
  if (!move) return;
  // Threads move to the later shards, taking them in turn, so that threads that find their
  // shard shared at once part; the first shard keeps the requests too large for the others.
  const std::uint32_t next = 1 + moves.fetch_add(1, std::memory_order_relaxed) % (limit - 1);
  if (next == k) return;
  if (next >= count() && !make_shards(next + 1)) return;  // the thread stays where it is
  t.index = next;
  // The thread that stays must not see this one's last reservation as sharing, or both move.
  Impl& left = *shard[k];
  std::lock_guard hold(left.mutex);
  if (left.last_reserver == &t) left.last_reserver = nullptr;
}

bool MemoryManager::Shards::make_shards(std::uint32_t n) {
  // Tried, not waited for, as in plan(): the thread stays and moves at a later chance.
  if (!control.try_lock()) return false;
  std::lock_guard hold(control, std::adopt_lock);
  // While the gate is closed, no new shard: it would have to start inside a window or capture.
  if (gate_holds != 0) return false;
  for (std::uint32_t j = count(); j < n; ++j) {
    try {
      auto fresh = std::make_unique<Impl>(device, options);
      fresh->shards = this;
      fresh->shard_index = j;
      fresh->ctx.borrow_page = &borrow_page;
      fresh->ctx.borrow_owner = fresh.get();
      fresh->ctx.shards_made = &made;
      fresh->ctx.device_reserved = &device_reserved;
      fresh->ctx.device_peak_in_use = &held_peak;
      fresh->stream_ordered = stream_ordered;
      fresh->frozen = frozen;
      fresh->update_cache_gate();
      {
        // Its clock starts where the first shard's is, so its pages age with the device's; and
        // the first shard's idle and unused bytes are published now, as its later scopes will.
        std::lock_guard first(shard[0]->mutex);
        fresh->ctx.clock = shard[0]->ctx.clock;
        shard[0]->publish_figures();
      }
      shard[j] = std::move(fresh);
    } catch (const std::bad_alloc&) {
      return false;
    }
    made.store(j + 1, std::memory_order_release);
  }
  return true;
}

void MemoryManager::Shards::hold_gate(int delta) {
  if (delta > 0) {
    if (gate_holds++ != 0) return;
    open.store(false, std::memory_order_release);
    // Every later shard's lock once: a reservation that saw the gate open has left it.
    for (std::uint32_t k = 1; k < count(); ++k) {
      shard[k]->mutex.lock();
      shard[k]->mutex.unlock();
    }
  } else if (gate_holds > 0 && --gate_holds == 0) {
    open.store(true, std::memory_order_release);
  }
}

void MemoryManager::Shards::plan_layout(const PoolLayout& layout) {
  pools_plan.clear();
  const Impl& first = *shard[0];
  for (const PoolSpec& spec : resolve_layout(layout, first.total_memory, first.ctx.alignment)) {
    switch (spec.kind) {
      case PoolKind::sliced:
        pools_plan.push_back({spec.max_slice_size, spec.page_size});
        break;
      case PoolKind::exclusive:
      case PoolKind::split:
        pools_plan.push_back({spec.max_alloc_size, 0});
        break;
      case PoolKind::direct:
        pools_plan.push_back({std::numeric_limits<std::uint64_t>::max(), 0});
        break;
    }
  }
  // The pools at the end whose pages are sized by their requests: a shard needs no partly used
  // page of those, and lends its idle ones; every request they serve may come from the thread's
  // own shard.
  // A custom layout need not be sorted: every request a pool before the tail takes stays below.
  std::size_t tail = pools_plan.size();
  while (tail > 0 && pools_plan[tail - 1].page == 0) --tail;
  std::uint64_t below = 0;
  for (std::size_t i = 0; i < tail; ++i) below = std::max(below, pools_plan[i].max_request);
  sharded_above.store(tail == pools_plan.size() ? std::numeric_limits<std::uint64_t>::max()
                                                : below,
                      std::memory_order_relaxed);
  // The plan for the sliced pools starts over, from what is held at each plan(), and so does the
  // held bound's peak.
  planned_peak = 0;
  set_sharded_max();
  held_peak.store(0, std::memory_order_relaxed);
  device_in_use_peak.store(0, std::memory_order_relaxed);
  device_reserved.peak.store(device_reserved.now.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
}

void MemoryManager::Shards::plan() {
  std::uint64_t in_use = 0;
  const std::uint32_t n = count();
  for (std::uint32_t k = 0; k < n; ++k)
    in_use += shard[k]->in_use_published.load(std::memory_order_relaxed);
  // Tried, not waited for: a layout change may hold it across fence waits, and the next plan
  // comes soon.
  if (!control.try_lock()) return;
  std::lock_guard hold(control, std::adopt_lock);
  planned_peak = std::max(planned_peak, in_use);
  set_sharded_max();
}

void MemoryManager::Shards::set_sharded_max() {
  const std::uint64_t largest_page =
      std::max(planned_peak / kShardPageShare, shard[0]->total_memory / kShardDeviceShare);
  std::uint64_t largest = 0;
  for (const PlannedPool& pool : pools_plan) {
    if (pool.page == 0 || pool.page > largest_page) break;
    largest = pool.max_request;
  }
  sharded_max.store(largest, std::memory_order_relaxed);
}

void MemoryManager::Shards::sync_clocks(std::uint32_t k, std::uint64_t clock) {
  others(k, [&](Impl& m) {
    Impl::Scope scope(m);
    if (m.ctx.clock < clock) m.tick(clock - m.ctx.clock);
  });
}
bool MemoryManager::Shards::borrow_page(void* owner, std::uint64_t min_size,
                                        std::uint64_t max_size, DevicePtr* base,
                                        std::uint64_t* size) {
  Impl& self = *static_cast<Impl*>(owner);
  Shards& s = *self.shards;
  const std::uint32_t n = s.count();
  // Another shard borrowing holds its own lock until it gives up on this one's: it is passed
  // over at once, so two shards that borrow from each other do not spin against each other.
  self.borrowing.store(true, std::memory_order_relaxed);
  struct ClearBorrowing {
    Impl& self;
    ~ClearBorrowing() { self.borrowing.store(false, std::memory_order_relaxed); }
  } clear_borrowing{self};
  for (std::uint32_t j = 0; j < n; ++j) {
    if (j == self.shard_index) continue;
    Impl& other = *s.shard[j];
    const bool parked = other.may_have_parked.load(std::memory_order_relaxed);
    if (!parked && other.idle_published.load(std::memory_order_relaxed) < min_size) continue;
    // Under this shard's lock: a shard that stays busy is passed over rather than waited for,
    // so two shards never wait on each other. Its calls are short: a few microseconds of tries
    // usually find it free (Note [Spinning before parking] in pools/lock_order.h).
    bool locked = false;
    for (int tries = 0; tries < kBorrowTries; ++tries) {
      if (other.borrowing.load(std::memory_order_relaxed)) break;
      if ((locked = other.mutex.try_lock_beside())) break;
      for (int i = 0; i < kSpinPauses; ++i) cpu_relax();
    }
    if (!locked) continue;
    // Pages that only parked slices keep are the program's freed memory too (Note [Thread
    // caches]): the caches no call used since the last sweep give them back first, so they can
    // be lent. A cache in use keeps them: lending its pages away would only send its thread to
    // borrow them back, each flush undoing the last.
    const bool unparked = parked && other.flush_caches(false, CacheFlush::unused) != 0;
    bool found = false;
    for (const auto& pool : other.pools) {
      if (pool->hand_over_idle(min_size, max_size, base, size)) {
        found = true;
        break;
      }
    }
    // The page counts in this shard's published bytes before it leaves the other's: the held
    // bound's device-wide figure must not lose it in between (Note [Held memory bound]).
    if (found)
      self.reserved_published.store(self.reserved_to_publish() + *size, std::memory_order_relaxed);
    if (found || unparked) other.publish_figures();
    if (found) s.pages_moved.fetch_add(1, std::memory_order_release);
    other.mutex.unlock_beside();
    if (found) return true;
  }
  return false;
}

std::uint64_t MemoryManager::Shards::unused_elsewhere(std::uint32_t k) const {
  std::uint64_t n = 0;
  others(k, [&](Impl& m) { n += m.unused_published.load(std::memory_order_relaxed); });
  return n;
}
bool MemoryManager::Shards::unpark_others(std::uint32_t k) {
  bool gave = false;
  others(k, [&](Impl& m) {
    Impl::Scope scope(m);  // its unlock publishes what came back as unused
    gave = m.flush_caches(false) != 0 || gave;
  });
  return gave;
}
MemoryManager::Shards::Held MemoryManager::Shards::held(std::uint32_t k, std::uint64_t reserved,
                                                        std::uint64_t in_use) {
  Held h{reserved + held_claims.load(std::memory_order_relaxed), in_use};
  others(k, [&](const Impl& m) {
    h.reserved += m.reserved_published.load(std::memory_order_relaxed);
    h.peak_in_use += m.in_use_published.load(std::memory_order_relaxed);
  });
  h.peak_in_use = std::max(held_peak.load(std::memory_order_relaxed), h.peak_in_use);
  return h;
}

void MemoryManager::Shards::note_held_peak(std::uint64_t in_use) { raise_to(held_peak, in_use); }

void MemoryManager::Shards::note_device_peaks(std::uint32_t k, std::uint64_t in_use) {
  others(k, [&](const Impl& m) { in_use += m.in_use_published.load(std::memory_order_relaxed); });
  raise_to(device_in_use_peak, in_use);
}

bool MemoryManager::Shards::idle_elsewhere(std::uint32_t k) const {
  bool any = false;
  others(k, [&](const Impl& m) { any |= m.idle_published.load(std::memory_order_relaxed) != 0; });
  return any;
}

std::uint64_t MemoryManager::Shards::release_idle_elsewhere(std::uint32_t k,
                                                            std::uint64_t bytes) {
  std::uint64_t released = 0;
  others(k, [&](Impl& m) {
    if (released >= bytes || m.idle_published.load(std::memory_order_relaxed) == 0) return;
    Impl::Scope scope(m);  // the pages go to the device as it ends
    if (m.frozen != 0 || m.capture_windows != 0) return;
    const std::uint64_t gave = m.release_fitting_idle(bytes - released);
    m.held_released_bytes += gave;
    released += gave;
  });
  return released;
}

bool MemoryManager::Shards::reap_others(std::uint32_t k) {
  bool took = false;
  others(k, [&](Impl& m) {
    Impl::Scope scope(m);  // its unlock publishes the idle bytes borrow_page looks at
    if (m.frozen != 0) return;
    const bool unparked = m.flush_caches(false) != 0;
    took = m.close_and_reap() != 0 || unparked || took;
  });
  return took;
}

bool MemoryManager::Shards::trim_others(std::uint32_t k) {
  bool gave = false;
  others(k, [&](Impl& m) {
    // Nothing waits here: the pages go to the device as the scope ends, and the recovering
    // shard waits for them, within its own bound.
    Impl::Scope scope(m);
    if (m.frozen != 0) return;
    const bool parked = m.flush_caches(false) != 0;
    m.close_and_reap();
    gave = m.cleanup_all(true) != 0 || parked || gave;
  });
  return gave;
}
bool MemoryManager::Shards::drain_others(std::uint32_t k, WaitBound& bound) {
  bool passed = false;
  others(k, [&](Impl& m) {
    Impl::Scope scope(m);
    if (m.frozen != 0 || m.pending() == 0) return;
    if (!m.fences.any_closed()) m.close_epoch();
    // One slice at most: the recovery routes again before it waits again (Note
    // [Stream-ordered frees]).
    while (m.pending() != 0 && m.fences.any_closed()) {
      const Impl::FenceWait wait = m.wait_for_oldest_fence(scope, bound);
      if (wait == Impl::FenceWait::none) break;
      passed = true;
      if (wait == Impl::FenceWait::slice) break;
    }
    // The pages that came idle stay for the recovering shard to borrow (its caller routes
    // before it trims).
  });
  return passed;
}
}  // namespace poolcuda
