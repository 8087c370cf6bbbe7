// The public MemoryManager methods: each finds the shard or shards it concerns (Note [Shards]
// in manager_shards.cpp), takes each one's lock through a Scope (Note [Outside the lock] in
// memory_manager.cpp) and calls into the routing, free-path and fence logic of
// memory_manager.cpp. Reports and consistency checks are in manager_inspect.cpp.
#include "pools/manager_shards.h"

namespace poolcuda {

namespace {
constexpr std::uint64_t kLargestRequest = std::uint64_t{1} << 62;  // 4 EiB
// Slice starts looked up before a page's slices are walked (Note [Locating a pointer]).
constexpr int kLocateProbes = 64;
}  // namespace

MemoryManager::MemoryManager(Device& device, const ManagerOptions& options)
    : shards_(std::make_unique<Shards>(device, options)) {}

MemoryManager::~MemoryManager() = default;

Reservation MemoryManager::allocate(std::uint64_t size, Placement placement) {
  // Zero, and sizes so large that aligning them would wrap around, are refused outright.
  if (size == 0 || size > kLargestRequest)
    return Reservation{0, Error{ErrorKind::buffer_too_big, size}};
  Shards& s = *shards_;
  if (s.limit == 1) {
    Impl::ReserveNotes notes;
    return s.at(0).reserve(size, placement, nullptr, nullptr, false, true, notes);
  }
  return s.allocate(size, placement);
}

Reservation MemoryManager::Shards::allocate(std::uint64_t size, Placement placement) {
  Shards& s = *this;
  // The calling thread's own shard serves the requests whose pages are small next to the
  // device's peak in use or to the device; captures and persistent windows close the gate (Note
  // [Shards]).
  const bool own = placement == Placement::automatic && s.open.load(std::memory_order_relaxed) &&
                   (size <= s.sharded_max.load(std::memory_order_relaxed) ||
                    size > s.sharded_above.load(std::memory_order_relaxed));
  ShardHome& thread = this_thread_home();
  std::uint32_t k = own ? s.home(thread) : 0;
  // One Reservation, returned by name on every path: it is built where the caller wants it
  // (copying it out of a callee's frame cost a store-forwarding stall per call).
  // Out of memory in the thread's own shard tries the other shards, the first one first, when
  // the request is a sliced pool's: their used pages may still have room (every other shard's
  // idle memory is already back with the driver, an exclusive or direct pool has no room inside
  // pages, and a split pool's split pages stay within its budget, Note [Split pools]).
  const std::uint32_t shards_made = s.count();
  bool fallback = placement == Placement::automatic && shards_made > 1 &&
                  size <= s.sharded_above.load(std::memory_order_relaxed);
  Impl::ReserveNotes notes;
  Reservation r = s.at(k).reserve(size, placement, k == 0 ? nullptr : &s.open, &thread, own,
                                  !fallback, notes);
  if (notes.cached) {  // no shard was locked: nothing to note but the clock
    if (notes.clock_crossed) s.sync_clocks(k, notes.clock);
    return r;
  }
  if (notes.gate_closed) {
    k = 0;
    fallback = false;  // this is the first shard's try, and its last
    notes = {};
    r = s.at(0).reserve(size, placement, nullptr, &thread, false, true, notes);
  } else if (own) {
    s.note_sharing(thread, k, notes.shared);
  }
  if (notes.clock_crossed) s.sync_clocks(k, notes.clock);
  if (notes.plan_due) s.plan();
  if (fallback && r.ptr == 0 && r.error.kind == ErrorKind::out_of_memory) {
    const Reservation own_failure = r;
    const std::uint32_t last = k == shards_made - 1 ? shards_made - 2 : shards_made - 1;
    for (std::uint32_t j = 0; j < shards_made && r.ptr == 0; ++j) {
      if (j == k) continue;
      notes = {};
      notes.quick = true;  // recovery ran already: routing only, without waits
      // Not the thread's home: its reservation there tells no sharing (Note [Shards]).
      r = s.at(j).reserve(size, placement, j == 0 ? nullptr : &s.open, nullptr, false, j == last,
                          notes);
    }
    // A later shard whose gate closed meanwhile answered nothing: the own shard's failure stands.
    if (r.ptr == 0 && r.error.kind == ErrorKind::none) r = own_failure;
  }
  return r;
}

Reservation MemoryManager::Impl::reserve(std::uint64_t size, Placement placement,
                                         const std::atomic<bool>* gate, const ShardHome* thread,
                                         bool home, bool last_try, ReserveNotes& out) {
  // The calling thread's cache first, without the shard's lock (Note [Thread caches]).
  if (placement == Placement::automatic && caches_open.load(std::memory_order_acquire)) {
    if (ThreadCache* cache = find_thread_cache(id)) {
      bool clock_due = false;
      const DevicePtr ptr = cache->take(size, caches_open, &clock_due);
      if (clock_due) {
        // Reported like a reservation's: a shard whose threads only hit their caches must still
        // bring the other shards' clocks along (their sweeps and periods run on them).
        out.clock = advance_clock(kThreadCacheClockBatch, *cache);
        out.clock_crossed = (out.clock - kThreadCacheClockBatch) / kShardClockSync !=
                            out.clock / kShardClockSync;
      }
      if (ptr != 0) {
        out.cached = true;
        return Reservation{ptr, Error{}, false};
      }
    }
  }
  Scope scope(*this);
  if (gate != nullptr && !gate->load(std::memory_order_acquire)) {
    out.gate_closed = true;
    return {};
  }
  // A thread still settling in its home leaves no mark there: a busy thread must not move
  // for a newcomer's first reservations, which never move the newcomer (Note [Shards]).
  if (thread != nullptr && !(home && thread->settling < kShardSettle)) {
    if (home) out.shared = last_reserver != nullptr && last_reserver != thread;
    last_reserver = thread;
  }
  index.reserve_one();
  const std::uint64_t clock_before = ctx.clock;
  tick(1);
  out.clock = ctx.clock;
  out.clock_crossed = clock_before / kShardClockSync != ctx.clock / kShardClockSync;
  out.plan_due = clock_before / kShardPlanEvery != ctx.clock / kShardPlanEvery;
  if (out.plan_due || clock_before / kShardPublishEvery != ctx.clock / kShardPublishEvery) {
    in_use_published.store(ctx.totals.in_use, std::memory_order_relaxed);
    sample_device_peaks();
  }

  // For the whole reservation.
  std::uint32_t wait_budget_us = out.quick ? 0 : kFenceWaitBoundMicros;
  std::uint32_t progress_us = kFenceProgressTotalMicros;  // Note [A host far ahead]
  bool may_flush = !out.quick;  // once per reservation (Note [Releases before growth])
  bool may_wait_recovery = !out.quick;  // once too (Note [Growth during a recovery])
  HeldReservation held;  // Note [Held memory bound]
  held.budget_us = out.quick ? 0 : kHeldWaitBoundMicros;
  // The claim ends when the reservation grows (route), ends, or waits for anything but the held
  // bound's releases: other shards must not count it through a recovery.
  const auto drop_claim = [&] {
    if (held.claim == 0) return;
    shards->held_claims.fetch_sub(held.claim, std::memory_order_relaxed);
    held.claim = 0;
  };
  struct DropClaimAtEnd {
    const decltype(drop_claim)& drop;
    ~DropClaimAtEnd() { drop(); }
  } drop_claim_at_end{drop_claim};
  Route r = route(size, placement, wait_budget_us, may_flush, may_wait_recovery, &held);
  while (r.wait_for_fence || r.flush_releases || r.wait_for_recovery || r.wait_for_gate ||
         r.trim_elsewhere_bytes != 0) {
    if (r.wait_for_gate) {
      // The gate ranks before a shard's lock: taken with this one released, held for one route.
      scope.unlock();
      std::unique_lock growth(shards->growth_gate);
      scope.relock();
      held.gate_held = true;
      r = route(size, placement, wait_budget_us, may_flush, may_wait_recovery, &held);
      held.gate_held = false;
      continue;
    }
    if (r.trim_elsewhere_bytes != 0) {
      ++held.trims_elsewhere;
      if (held.claim == 0) {
        held.claim = r.claim_bytes;
        shards->held_claims.fetch_add(held.claim, std::memory_order_relaxed);
      }
      scope.unlock();
      shards->release_idle_elsewhere(shard_index, r.trim_elsewhere_bytes);
      scope.relock();
    } else if (r.for_held_bound) {
      flush_before_growth(scope, &held.budget_us);
    } else {
      drop_claim();
      if (r.wait_for_recovery) {
        may_wait_recovery = false;
        wait_for_recoveries(scope);
      } else if (r.flush_releases) {
        may_flush = false;
        flush_before_growth(scope, &wait_budget_us);
      } else if (r.patient) {
        wait_for_oldest_fence(scope, false);
      } else {
        wait_for_oldest_fence(scope, &wait_budget_us, &progress_us);
      }
    }
    r = route(size, placement, wait_budget_us, may_flush, may_wait_recovery, &held);
  }
  if (r.slice == nullptr && r.status == AllocStatus::out_of_memory && !out.quick) {
    drop_claim();
    r = recover_from_oom(scope, size, placement);
    if (r.slice != nullptr) ++oom_recoveries;
  }
  // The waits above released the lock: the gate may have closed meanwhile, and nothing may
  // enter a later shard once it has (Note [Shards]). The slice goes back unused; a failure is
  // not one yet, since the first shard tries next.
  if (gate != nullptr && !gate->load(std::memory_order_acquire)) {
    if (r.slice != nullptr) {
      r.slice->page->pool->to_pending(r.slice);
      r.slice->page->pool->give_back(r.slice);
    }
    out.gate_closed = true;
    return {};
  }
  if (r.slice == nullptr && r.status == AllocStatus::out_of_memory && last_try) {
    ++oom_failures;
    if (options.log != LogLevel::off) {
      const MemoryUsage u = usage();
      const std::uint64_t idle_now = idle();
      // With shards, these are the last shard tried; the report has the others.
      const std::uint32_t n = shards == nullptr ? 1 : shards->count();
      std::string message =
          "out of device memory: requested " + std::to_string(size) + " B" +
              (n > 1 ? "; in shard " + std::to_string(shard_index) + " of " +
                           std::to_string(n) + ":"
                     : ",") +
              " in use " + std::to_string(u.bytes_in_use) + " B, padding " +
              std::to_string(u.bytes_padding) + " B, reserved " +
              std::to_string(u.bytes_reserved) + " B, idle pages " + std::to_string(idle_now) +
              " B, free space inside used pages (too fragmented for this request) " +
              std::to_string(free_bytes() - idle_now) + " B, pending fence " +
              std::to_string(pending()) + " B, given back but not yet freed by the driver " +
              std::to_string(releases_on_the_way()) + " B" + (n > 1 ? " (the device's)" : "");
      if (options.refusal_sink)
        options.refusal_sink(std::move(message));
      else
        log(LogLevel::basic, std::move(message));
    }
  }
  if (route_capped != nullptr) {
    if (r.slice != nullptr) {
      route_capped->note_spill();
    } else if (r.error.kind == ErrorKind::pool_capacity_exceeded) {
      route_capped->note_refusal();
      ++cap_refusals;
    }
  }
  if (r.slice == nullptr) return Reservation{0, r.error};
  // Note [Device peaks]: a rise of this shard's bytes in use by a 64th since its last sample.
  if (ctx.totals.in_use > peaks_sampled_in_use + peaks_sampled_in_use / 64) sample_device_peaks();
  index.insert(r.slice->ptr, r.slice);
  cache_new_slice(r.slice, placement);
  trace(LogEvent::Kind::allocate, size, r.slice->ptr, r.slice->page->pool);
  return Reservation{r.slice->ptr, Error{}, r.grew};
}

FreeOutcome MemoryManager::free(DevicePtr ptr, StreamToken stream) {
  Shards& s = *shards_;
  const std::uint32_t n = s.count();
  if (n == 1) {
    // A shard made meanwhile may have taken the pointer's page: then look in every shard.
    const FreeOutcome outcome = s.at(0).free_pointer(ptr, stream);
    if (outcome != FreeOutcome::not_mine || s.count() == 1) return outcome;
  }
  // Each pointer lies in the pages of one shard at most: the calling thread's own first. Only
  // idle pages are lent, so a live pointer's page never moves; but a bad free (a second free of
  // a pointer whose page went idle) must still be told apart by the shard that holds the page,
  // never passed to the driver as not ours: a page lent meanwhile from a shard not tried yet to
  // one tried already is looked for again.
  const std::uint32_t first = s.home(this_thread_home());  // shards are never unmade
  for (int pass = 1;; ++pass) {
    const std::uint64_t moves = s.pages_moved.load(std::memory_order_acquire);
    const std::uint32_t shards_now = s.count();  // one made meanwhile may hold a lent page
    FreeOutcome outcome = s.at(first).free_pointer(ptr, stream);
    for (std::uint32_t k = 0; k < shards_now && outcome == FreeOutcome::not_mine; ++k)
      if (k != first) outcome = s.at(k).free_pointer(ptr, stream);
    // A few passes: each one needs another page lent during it.
    if (outcome != FreeOutcome::not_mine || pass == 4 ||
        s.pages_moved.load(std::memory_order_acquire) == moves)
      return outcome;
  }
}

FreeOutcome MemoryManager::Impl::free_pointer(DevicePtr ptr, StreamToken stream) {
  index.prefetch(ptr);  // read after the lock (Note [Loads started early] in pool.h)
  if (ptr != 0 && caches_open.load(std::memory_order_acquire)) {
    if (ThreadCache* cache = find_thread_cache(id)) {
      switch (cache->give(ptr, caches_open, stream != kNoStream)) {
        case ThreadCache::Give::parked: return FreeOutcome::freed;
        case ThreadCache::Give::double_free: return FreeOutcome::double_free;
        case ThreadCache::Give::not_here: break;
      }
    }
  }
  Scope scope(*this);
  Slice* slice = ptr == 0 ? nullptr : index.erase(ptr);
  if (slice == nullptr) return classify(ptr);
  prefetch_free_neighbourhood(*slice);
  // Parked in a thread's cache: the program freed it already, and nothing changes (the entry
  // goes back where it was; the table just shrank, so this insert never grows it).
  if (slice->cache != nullptr && !uncache(slice)) {
    index.insert(ptr, slice);
    return FreeOutcome::double_free;
  }
  recent_frees[recent_next] = ptr;
  recent_next = (recent_next + 1) % kRecentFrees;
  const std::uint64_t synchronized_before = sync_added;
  if (slice->pins > 0) {
    slice->held_era = held_era;  // Note [Releases inside a window]
    held_since_window = true;
    slice->page->pool->to_held(slice);
    if (stream != kNoStream) fence_held_free(slice, stream);
  } else {
    retire(slice, stream);
  }
  trace(LogEvent::Kind::free, 0, ptr, nullptr);
  // Only a free that joined the chain: a stream-ordered one must not wait for another thread's
  // synchronize, or for the one a capture refused earlier.
  if (sync_added != synchronized_before) finish_sync_frees(scope);
  return FreeOutcome::freed;
}

std::uint64_t MemoryManager::live_size(DevicePtr ptr) const {
  std::uint64_t size = 0;
  shards_->each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    Slice* slice = m.index.find(ptr);
    if (slice != nullptr && (slice->cache == nullptr || !m.parked(slice))) size = slice->requested;
  });
  return size;
}

// Note [Locating a pointer]
// cudaPointerGetAttributes of a pointer inside an allocation (a tensor's view, an import) asks
// whether it lies in pooled free memory, and this answered by walking every slice of the page
// under the shard's lock: with 400,000 live 512 B buffers a query took 41 to 67 us against 1.7 to
// 2.9 us plainly, and held the shard's allocations up meanwhile. Slices start at multiples of
// the alignment from their page's base, and the index finds a live slice by its start: so the
// starts at and below the pointer are looked up first, nearest first, kLocateProbes of them at
// most. The first slice found there is the only one that can hold the pointer; when it is live
// and does, that is the answer (and the page is in use). Otherwise (a free or parked slice, a
// pointer far into a large allocation) the walk decides, as before. The query now takes 0.53 us.
PointerPlace MemoryManager::locate(DevicePtr ptr) const {
  PointerPlace place;
  shards_->each([&](Impl& m) {
    if (place.pooled) return;
    std::lock_guard lock(m.mutex);
    auto it = m.ctx.page_set.upper_bound(ptr, PageOrder{});
    if (it == m.ctx.page_set.begin()) return;
    --it;
    if (ptr >= it->base + it->size) return;
    place = PointerPlace{true, it->base, it->size, 0, false};
    const auto live = [&m](Slice& s) {
      return s.state == SliceState::live && (s.cache == nullptr || !m.parked(&s));
    };
    // Note [Locating a pointer]: the slice starts just below the pointer first.
    const std::uint64_t step = m.ctx.alignment;
    DevicePtr start = it->base + (ptr - it->base) / step * step;
    for (int probe = 0; probe < kLocateProbes; ++probe, start -= step) {
      Slice* s = m.index.find(start);
      if (s != nullptr && live(*s) && ptr < s->ptr + s->size) {
        place.page_in_use = true;
        place.allocation = s->ptr;
        place.allocation_size = s->requested;
        return;
      }
      if (s != nullptr || start == it->base) break;
    }
    for (Slice& s : it->slices) {
      const bool is_live = live(s);
      place.page_in_use |= is_live;
      if (is_live && ptr >= s.ptr && ptr < s.ptr + s.size) {
        place.allocation = s.ptr;
        place.allocation_size = s.requested;
      }
    }
  });
  return place;
}

void MemoryManager::set_mode(AllocationMode mode) {
  Shards& s = *shards_;
  if (s.options.persistent == PersistentMode::disabled ||
      s.options.persistent == PersistentMode::enforced)
    return;
  std::lock_guard control(s.control);
  // A window's memory comes from the first shard: the gate closes before the window opens.
  if (!s.nest(s.windows, mode == AllocationMode::persistent)) return;
  s.each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    m.windows = s.windows;
    m.update_cache_gate();
  });
}

void MemoryManager::set_capture_window(bool open) {
  Shards& s = *shards_;
  std::lock_guard control(s.control);
  if (!s.nest(s.captures, open)) return;
  s.each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    m.capture_windows = s.captures;
    m.update_cache_gate();
  });
}

Error MemoryManager::install_layout(const PoolLayout& layout) {
  Shards& s = *shards_;
  std::lock_guard control(s.control);
  // No reservation enters a later shard until the layout is in place, so a later shard found
  // empty stays empty (the pages a reservation under way took meanwhile are idle, and go back
  // just before the shard's pools are replaced).
  s.hold_gate(+1);
  // Pending slices still belong to the old pools: wait for their fences (a quiescent point,
  // not the hot path), then return every idle page.
  const auto empty_out = [](Impl& m, Impl::Scope& scope) {
    m.flush_caches(false);
    m.drain(scope);
    m.cleanup_all(true);
    std::uint64_t busy = 0;
    for (const auto& pool : m.pools) busy += pool->usage().bytes_in_use + pool->pending_bytes();
    return busy;
  };
  const auto rebuild = [&](Impl& m) {
    m.build_pools(layout);
    // A new layout is a new plan: its peaks start from what is held now.
    m.ctx.totals.in_use_peak = m.ctx.totals.in_use;
    m.ctx.totals.reserved_peak = m.ctx.totals.reserved;
  };
  std::uint64_t busy = 0;
  for (std::uint32_t k = 1; k < s.count(); ++k) {
    Impl::Scope scope(s.at(k));
    busy += empty_out(s.at(k), scope);
  }
  if (busy == 0) {
    Impl::Scope scope(s.at(0));
    busy = empty_out(s.at(0), scope);
    if (busy == 0) {
      s.page_warnings.store(0, std::memory_order_relaxed);  // a new layout may warn again
      rebuild(s.at(0));
    }
  }
  if (busy > 0) {
    s.hold_gate(-1);
    return Error{ErrorKind::pools_in_use, busy};
  }
  for (std::uint32_t k = 1; k < s.count(); ++k) {
    Impl& m = s.at(k);
    Impl::Scope scope(m);
    m.cleanup_all(true);
    rebuild(m);
  }
  const bool was_capped = s.capped;
  s.options.layout = layout;  // for shards made later
  s.plan_layout(layout);
  s.capped = layout_capped(layout);
  // While a layout has a capped pool, one shard takes every reservation (its cap is the
  // device's): the hold taken above stays for it.
  if (!(s.capped && !was_capped)) s.hold_gate(-1);
  if (was_capped && !s.capped) s.hold_gate(-1);
  return {};
}

void MemoryManager::cleanup(bool explicit_cleanup) {
  shards_->each([&](Impl& m) {
    Impl::Scope scope(m);
    m.flush_caches(false, explicit_cleanup ? CacheFlush::every : CacheFlush::unused);
    if (explicit_cleanup) m.close_and_reap();
    m.cleanup_all(explicit_cleanup);
  });
}

void MemoryManager::fence_open_frees() {
  shards_->each([](Impl& m) {
    if (!m.fences.open_hint()) return;
    Impl::Scope scope(m);
    m.close_epoch();
  });
}

// Note [One wait per refused request]
// A request the pools refused after their recovery goes to CUDA, and one CUDA refuses too is
// tried once more after the pools gave everything back (pooling.cpp's give_back_idle), whose
// flush waits up to ten seconds for the pages on their way to the driver. When the recovery's own
// flush had just run out of its ten seconds behind a release stuck in the driver's free (a stream
// parked on a host function holds it), that second flush waited for the same release again: the
// program was refused after 20 seconds under free_fence:none, where plain CUDA refused at once and
// the documents promise one bound. So a recovery that runs out remembers, for its thread, the
// release it waited for, and the next give-back of a refused request on that thread (normally
// that request's own retry; every shard of the device, as the release is the device's) does not
// wait while that release is still inside the driver's free (it still gives its pages). Only
// once: a later request waits its bound again, since the park may end meanwhile.

GiveBack MemoryManager::give_back_all(std::uint32_t max_microseconds, GiveBackWait wait) {
  WaitBound bound{std::chrono::microseconds(max_microseconds)};
  GiveBack result = GiveBack::nothing;
  // Read once for every shard: the stuck release is the device's.
  const std::uint64_t waited_behind =
      wait == GiveBackWait::before_park ? 0 : std::exchange(t_recovery_ran_out_behind, 0);
  shards_->each([&](Impl& m) {
    const GiveBack one = m.give_back(bound, max_microseconds, wait, waited_behind);
    result = std::max(result, one);  // timed_out over done over nothing
  });
  return result;
}

GiveBack MemoryManager::Impl::give_back(WaitBound& bound, std::uint32_t asked_microseconds,
                                        GiveBackWait wait, std::uint64_t waited_behind) {
  Scope scope(*this);
  if (frozen != 0) return GiveBack::nothing;
  flush_caches(false);
  if (idle() == 0 && pending() == 0 && device.releasing_bytes() == 0) return GiveBack::nothing;
  // During a capture no fence is recorded (FenceQueue::close refuses: a record could invalidate
  // it), but fences recorded before it are waited for, as a recovery does: the memory they cover
  // comes back once they pass, and what was freed since the last one waits for the capture to
  // end. The release thread frees in relaxed capture mode (Note [Releases during capture] in
  // interpose/release_worker.cpp).
  const bool capture = device.capture_active();
  close_and_reap();
  // Nothing moved since an earlier call ran out of a bound at least this long (a stream parked
  // before it holds the fences or the driver's frees): waiting again would only cost it again.
  const GiveBackState now{pending(), device.releasing_bytes(),
                          frees.load(std::memory_order_relaxed), asked_microseconds};
  if (idle() == 0 && give_back_stuck && give_back_stuck->same_as(now)) return GiveBack::timed_out;
  // The page inside the driver's free when an earlier flush before a park ran out is inside
  // still: the pages this give-back would queue behind it could not arrive before the park that
  // holds it ends, nor within this bound, and the pools keep them; waiting for fences would only
  // make this host function wait (Note [Give-backs behind a stuck release] in
  // memory_manager.cpp). A give-back for a refused request gives its pages and waits its whole
  // bound, unless the request's own recovery just did.
  const bool before_park = wait == GiveBackWait::before_park;
  const std::uint64_t in_flight = device.release_in_flight();
  if (before_park && ((give_back_stuck_release != 0 && in_flight == give_back_stuck_release) ||
                      releases_stuck())) {
    ++give_backs;
    ++give_back_timeouts;
    return GiveBack::timed_out;
  }
  ++give_backs;
  bool timed_out = false;
  const bool with_lanes = wait == GiveBackWait::every_fence;
  const auto waiting = [&] {
    return with_lanes ? pending() != 0 : fences.open_count() != 0 || fences.any_closed_epoch();
  };
  while (waiting()) {
    // Frees other threads made while the lock was released wait in the open epoch.
    if (with_lanes ? !fences.any_closed() : !fences.any_closed_epoch()) close_epoch();
    if (with_lanes ? !fences.any_closed() : !fences.any_closed_epoch()) break;  // no fence
    if (wait_for_oldest_fence(scope, bound, with_lanes) == FenceWait::none) {
      timed_out = true;
      break;
    }
  }
  cleanup_all(true, before_park);
  // Note [One wait per refused request].
  const bool recovery_waited =
      waited_behind != 0 && device.release_in_flight() == waited_behind;
  scope.unlock();  // the pages go to the device
  const bool flushed = !recovery_waited && flush_within(device, bound);
  scope.relock();
  // A flush that ran out during a capture may be pages the driver refused for it, not stuck.
  if (capture && !timed_out) return flushed ? GiveBack::done : GiveBack::timed_out;
  if (flushed)
    give_back_stuck_release = 0;
  else if (before_park)
    give_back_stuck_release = device.release_in_flight();
  if (!timed_out && flushed) {
    give_back_stuck.reset();
    return GiveBack::done;
  }
  ++give_back_timeouts;
  give_back_stuck = GiveBackState{pending(), device.releasing_bytes(),
                                  frees.load(std::memory_order_relaxed), asked_microseconds};
  return GiveBack::timed_out;
}

void MemoryManager::begin_growth_hold() {
  shards_->recovering.fetch_add(1, std::memory_order_acq_rel);
}

void MemoryManager::end_growth_hold() {
  shards_->recovering.fetch_sub(1, std::memory_order_acq_rel);
}

bool MemoryManager::frozen() const {
  Impl& first = shards_->at(0);
  std::lock_guard lock(first.mutex);
  return first.frozen != 0;
}

std::uint64_t MemoryManager::frees() const {
  std::uint64_t n = 0;
  shards_->each([&](Impl& m) {
    std::lock_guard lock(m.mutex);  // the list of caches
    n += m.frees.load(std::memory_order_relaxed) + m.parked_frees();
  });
  return n;
}

bool MemoryManager::flush_releases(std::uint32_t max_microseconds) {
  return shards_->device.flush_releases(max_microseconds);
}

MemoryUsage MemoryManager::memory_usage() const {
  MemoryUsage total;
  shards_->each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    total += m.program_usage();
  });
  return total;
}

std::uint64_t MemoryManager::alignment() const { return shards_->at(0).ctx.alignment; }

std::uint64_t MemoryManager::idle_bytes() const {
  std::uint64_t idle = 0;
  shards_->each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    idle += m.idle() + m.freed_page_bytes(false);
  });
  return idle;
}

// Note [Memory info after a free]
// A free's memory waits for its fence, which the query records when it finds the free in the
// open batch: on an idle device the fence passes at once, but not before the query looks, so a
// program that freed 90% of the device and asked at once was told a tenth of it was free (plain
// cudaFree had waited for the device before the query could run). So the query waits for the
// fences it finds, within kMemInfoFenceWaitMicros for all of them: enough for a device with
// nothing queued, and a bounded cost when work is queued (the plain free would have waited for
// that work; the query tells what is free now). A wait that ran out (work is queued) is not
// made again until the program frees more, so a program that polls the figure while its
// kernels run pays it once per batch of frees; and it never waits for a stream-ordered free's
// fence, which plain CUDA does not wait for either.
// With work queued the wait runs out, and memory freed behind that work still waits for its
// fence. A page that holds nothing but such memory (and parked slices) counts as free all the
// same: the plain cudaFree had waited for that work, so the program's next query found the
// memory free, and frameworks size their arenas from it (a program that freed eight 64 MiB
// buffers behind a 300 ms kernel and asked for 90% of the reported free got 45% of a 1 GiB
// device). A request that needs the page waits for the fence in out-of-memory recovery, as the
// plain free waited. But a batch's fence is recorded when the batch closes, and small frees can
// wait in the open batch while the program launches more work: that fence waits for the later
// work too, which the plain free never waited for (three 4 MiB frees, then a queue of memsets
// of 12 s: the request of the reported free size failed after 10 s where the plain one got it
// at once). So a batch counts only while no work was put on a stream since its first free
// (work_since_free.h: the launches, copies and memsets the hooks see, on any device, each noted
// before its call and once the call has queued it, so that a batch begun during the call is
// marked too). A page
// that a live slice keeps, or a stream-ordered free's memory, does not count.
std::uint64_t MemoryManager::idle_bytes_now() {
  std::uint64_t idle = 0;
  WaitBound bound{std::chrono::microseconds(kMemInfoFenceWaitMicros)};
  shards_->each([&](Impl& m) {
    Impl::Scope scope(m);
    if (m.frozen == 0 && m.fences.any()) {
      m.close_and_reap();
      const std::uint64_t frees = m.frees.load(std::memory_order_relaxed);
      if (m.fences.any_closed_epoch() && m.mem_info_wait_ran_out != frees) {
        while (m.fences.any_closed_epoch() &&
               m.wait_for_oldest_fence(scope, bound, false) != Impl::FenceWait::none) {
        }
        if (m.fences.any_closed_epoch()) m.mem_info_wait_ran_out = frees;
      }
    }
    idle += m.idle() + m.freed_page_bytes(true);
  });
  return idle;
}

void MemoryManager::forget() {
  Shards& s = *shards_;
  s.each([](Impl& m) {
    Impl::Scope scope(m);
    m.drop_everything();
  });
  // The program's memory is gone: the plan starts over from what it holds next.
  std::lock_guard control(s.control);
  s.planned_peak = 0;
  s.set_sharded_max();
  s.held_peak.store(0, std::memory_order_relaxed);
  s.device_in_use_peak.store(0, std::memory_order_relaxed);
  s.device_reserved.peak.store(s.device_reserved.now.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
}

void MemoryManager::set_stream_ordered(bool ordered) {
  Shards& s = *shards_;
  std::lock_guard control(s.control);
  s.stream_ordered = ordered;
  s.each([&](Impl& m) {
    std::lock_guard lock(m.mutex);  // frees read the flag under this lock: a barrier
    m.stream_ordered = ordered;
    m.update_cache_gate();  // and the caches' frees read the gate under theirs
  });
}

void MemoryManager::set_frozen(bool frozen) {
  Shards& s = *shards_;
  std::lock_guard control(s.control);
  if (frozen) {
    ++s.frozen;
  } else if (s.frozen > 0) {
    --s.frozen;
  }
  s.each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    m.frozen = s.frozen;
    m.update_cache_gate();
  });
}

RetainedSlice MemoryManager::retain(DevicePtr ptr) {
  RetainedSlice pin;
  if (ptr == 0) return pin;
  const std::uint32_t n = shards_->count();
  for (std::uint32_t k = 0; k < n && !pin; ++k) {
    Impl& m = shards_->at(k);
    std::lock_guard lock(m.mutex);
    Slice* slice = m.index.find(ptr);
    if (slice == nullptr) continue;
    if (slice->cache != nullptr && !m.uncache(slice)) return {};  // parked: freed
    ++slice->pins;
    pin = RetainedSlice{ptr, m.generation, slice, k};
  }
  return pin;
}

// Note [Frees a graph's release makes]
// A slice the program freed while a graph pinned it is freed when the last pin goes: when CUDA
// reports the graph gone, on a thread of its own, and the library takes that report at its next
// call. That call may come after the program parked a stream on a host function it opens later,
// and under free_fence:sync the free's synchronize then waited for the park: the program's next
// cudaMalloc, of any size, hung where plain CUDA returned at once. So such a free waits for a
// fence event in every mode, which nothing ever blocks on: under sync too, its memory comes back
// once the device has passed the event (a request that needs it before then waits for it, within
// the out-of-memory bound, as under events).
//
// Note [Releases inside a window]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// CUDA reports a graph gone on a thread of its own, and the report may come late: behind a
// program that captures, destroys and captures again in a loop, the stand-in's thread fell 30
// to 100 graphs behind on a busy machine. The releases then arrive inside the next capture's
// window, where no fence can be recorded (it would break the capture): the slices waited in the
// open epoch for the windows to close, each capture primed a fresh slice beside them, and a
// 4 GiB device ran out with all of it pending, where the plain run (whose cudaFree in the
// relaxed capture freed at once) never failed. So each capture begin records a fence before its
// window opens (prime() or record_window_fence(); an empty epoch's if no free is open), in the
// first shard, where captures reserve, and advances that shard's held era with it, under the
// lock that every free takes; a free of a pinned slice notes the era. A slice released while a
// window is open and freed in an earlier era was freed before that fence was recorded, so the
// fence covers whatever work was queued before its free, as the release's own fence would: it
// joins that fence's epoch and comes back when the fence passes (at once if it passed already).
// (Usually it was freed before the window began at all: a free while a capture is open pins the
// slice for that capture too.) A begin records no fence when no pinned slice was freed and no free
// is open since the last one (or ever), whose fence then still follows every held slice's free. A
// slice freed in the current era, one held in another shard, and one held across a multiple of 256
// fences (the era is one byte) wait in the open epoch as before, for the windows to close. While
// another capture is open on the device no fence can be recorded: a begin then leaves the last
// fence and era as they are.
//
// Note [Stream-ordered frees of pinned slices]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A cudaFreeAsync of a pinned slice (a capture is open on its device, or a graph pins it) holds
// it until its pins go, and the release used to fence it as a plain free: on the streams of the
// memory's device. The program's promise is about the free's own stream, which may be another
// device's (a device-1 stream that wrote device-0 memory through peer access frees it there): a
// release at a graph's destroy gave the slice back while that stream, parked on a host function,
// had yet to make its write, and the next cudaMalloc's owner got the write. So such a free records
// its fence on its stream at once (a stream of another device takes one during a capture here),
// and the release waits for that fence alone, as an unpinned free would have. One the stream
// cannot take (it captures, or it is the device's own while a capture is open) is fenced as
// before. The fences wait in a map by pointer (such frees are rare) until the release, or until a
// reissue (capture_share), which needs the fence passed as well.
void MemoryManager::Impl::fence_held_free(Slice* slice, StreamToken stream) {
  FreeFence mode = options.free_fence;
  if (mode == FreeFence::automatic) mode = stream_ordered ? FreeFence::none : FreeFence::events;
  if (mode == FreeFence::none) return;
  StreamToken lane = stream;
  const FenceHandle fence = device.fence_record_on(stream, lane);
  if (fence == kNoFence) return;
  const HeldFence held{fence, lane, thread_serial(this_thread_home())};
  try {
    auto [it, fresh] = held_fences.try_emplace(slice->ptr, held);
    if (!fresh) {  // never left behind (a release, a reissue or a reset takes it): defensive
      device.fence_destroy(it->second.fence);
      it->second = held;
    }
  } catch (const std::bad_alloc&) {
    device.fence_destroy(fence);  // fenced as a plain free when its pins go
  }
}

bool MemoryManager::release_retained(const RetainedSlice& pin) {
  Impl* shard = shards_->pinned(pin);
  if (shard == nullptr) return false;
  Impl& m = *shard;
  Impl::Scope scope(m);
  if (pin.generation != m.generation) return false;
  Slice* slice = static_cast<Slice*>(pin.node);
  if (slice->ptr != pin.ptr || slice->pins == 0) return false;
  if (--slice->pins != 0 || slice->state != SliceState::held) return true;
  if (auto held = m.held_fences.find(slice->ptr); held != m.held_fences.end()) {
    const Impl::HeldFence fence = held->second;
    m.held_fences.erase(held);
    m.frees.store(m.frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    slice->page->pool->to_pending(slice);
    slice->freed_in_order = 1;
    try {
      // Lanes of their own: these fences come in the order of the releases, not of the frees.
      m.fences.add_ordered(slice, fence.fence, fence.lane, kReleasedHolds | fence.thread);
    } catch (const std::bad_alloc&) {
      m.device.fence_destroy(fence.fence);
      m.fences.add(slice);
    }
    return true;
  }
  const FenceQueue::ClosedEpoch window =
      m.capture_windows > 0 && slice->held_era != m.held_era
          ? m.fences.closed_epoch(m.window_epoch)
          : FenceQueue::ClosedEpoch::unknown;
  if (window == FenceQueue::ClosedEpoch::unknown) {
    m.retire(slice, kNoStream, Impl::FreeBy::release);
    return true;
  }
  m.frees.store(m.frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  Pool* pool = slice->page->pool;
  pool->to_pending(slice);
  if (window == FenceQueue::ClosedEpoch::waiting) {
    m.fences.join_closed(slice, m.window_epoch);
  } else {
    pool->give_back(slice);
  }
  return true;
}

std::uint64_t MemoryManager::prime(const CaptureProfile& profile, bool* short_of_room) {
  // A capture's reservations come from the first shard (its gate is closed meanwhile).
  Impl& m = shards_->at(0);
  Impl::Scope scope(m);
  // Slices a graph released just now wait for their fence: give the device a bounded time to
  // pass it, so they count as free instead of being doubled (priming is rare: a capture begin).
  // The fence is the window's too (Note [Releases inside a window]).
  m.record_window_fence();
  std::uint32_t budget = kPrimeWaitMicros;
  while (m.persistent->pending_bytes() > 0 && budget > 0 && m.fences.any_closed())
    m.wait_for_oldest_fence(scope, &budget);
  // Near a full device the spare slices would take room the window may need for memory the
  // pools do not serve, which nothing can give back until the capture ends (Note [Priming]):
  // they take at most half of what the device has free.
  const std::uint64_t room = m.device.memory_info().free_bytes / 2;
  std::uint64_t added = 0;
  for (const auto& [size, count] : profile) {
    if (size == 0 || size > kLargestRequest) continue;
    const std::uint64_t slice = align_up(size, m.ctx.alignment);
    for (std::uint64_t have = m.persistent->free_count(size); have < count; ++have) {
      if (added + slice > room) {
        if (short_of_room != nullptr) *short_of_room = true;
        return added;
      }
      if (m.frozen != 0 || m.persistent->add_free(size) != AllocStatus::ok) return added;
      added += slice;
    }
  }
  return added;
}

void MemoryManager::record_window_fence() {
  Impl& m = shards_->at(0);
  Impl::Scope scope(m);
  m.record_window_fence();
}

bool MemoryManager::wait_for_window_fence(std::uint32_t budget_us) {
  Impl& m = shards_->at(0);  // where prime() records it
  Impl::Scope scope(m);
  // Fences pass in the order recorded: the oldest first, until the window's has.
  while (m.fences.closed_epoch(m.window_epoch) == FenceQueue::ClosedEpoch::waiting &&
         budget_us > 0)
    m.wait_for_oldest_fence(scope, &budget_us);
  return m.fences.closed_epoch(m.window_epoch) == FenceQueue::ClosedEpoch::passed;
}

bool MemoryManager::reissue(const RetainedSlice& pin, std::uint64_t requested) {
  Impl* shard = shards_->pinned(pin);
  if (shard == nullptr || requested == 0) return false;
  Impl& m = *shard;
  Impl::Scope scope(m);
  if (pin.generation != m.generation) return false;
  Slice* slice = static_cast<Slice*>(pin.node);
  if (slice->ptr != pin.ptr || slice->state != SliceState::held || requested > slice->size)
    return false;
  // Work queued before the program's free may still use it: a fence recorded after that free
  // must have passed (Note [Releases inside a window]). Without this, capture_share:on handed a
  // buffer freed in one capture, while a kernel on another stream still wrote it, to the next.
  m.fences.reap(m.device, kGiveBack);
  if (slice->held_era == m.held_era ||
      m.fences.closed_epoch(m.window_epoch) != FenceQueue::ClosedEpoch::passed)
    return false;
  // A stream-ordered free's own fence, which the window's may not cover (another device's
  // stream: Note [Stream-ordered frees of pinned slices]): passed too, and it goes with the free.
  if (auto held = m.held_fences.find(slice->ptr); held != m.held_fences.end()) {
    if (!m.device.fence_passed(held->second.fence)) return false;
    m.device.fence_destroy(held->second.fence);
    m.held_fences.erase(held);
  }
  m.index.reserve_one();
  slice->page->pool->reissue(slice, requested);
  m.index.insert(slice->ptr, slice);
  return true;
}

std::uint64_t MemoryManager::pinned_size(const RetainedSlice& pin) const {
  Impl* shard = shards_->pinned(pin);
  if (shard == nullptr) return 0;
  std::lock_guard lock(shard->mutex);
  if (pin.generation != shard->generation) return 0;
  const Slice* slice = static_cast<const Slice*>(pin.node);
  return slice->ptr == pin.ptr ? slice->size : 0;
}

bool MemoryManager::drain_fences() {
  bool closed = true;
  shards_->each([&](Impl& m) {
    Impl::Scope scope(m);
    closed = m.drain(scope) && closed;
  });
  return closed;
}

bool MemoryManager::drain_fences_within(WaitBound& bound) {
  bool drained = true;
  shards_->each([&](Impl& m) {
    Impl::Scope scope(m);
    drained = m.drain(scope, &bound) && drained;
  });
  return drained;
}

std::uint64_t MemoryManager::fence_waits() const {
  std::uint64_t n = 0;
  shards_->each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    n += m.fence_waits;
  });
  return n;
}

std::uint64_t MemoryManager::fence_wait_timeouts() const {
  std::uint64_t n = 0;
  shards_->each([&](Impl& m) {
    std::lock_guard lock(m.mutex);
    n += m.fence_wait_timeouts;
  });
  return n;
}

}  // namespace poolcuda
