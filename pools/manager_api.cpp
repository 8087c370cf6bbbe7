// The public MemoryManager methods: each takes the manager's lock through a Scope (Note
// [Outside the lock] in memory_manager.cpp) and calls into the routing, free-path and fence
// logic of memory_manager.cpp. Reports and consistency checks are in manager_inspect.cpp.
#include "pools/manager_impl.h"

namespace poolcuda {

namespace {
constexpr std::uint64_t kLargestRequest = std::uint64_t{1} << 62;  // 4 EiB
}  // namespace

MemoryManager::MemoryManager(Device& device, const ManagerOptions& options)
    : impl_(std::make_unique<Impl>(device, options)) {}

MemoryManager::~MemoryManager() = default;

Reservation MemoryManager::allocate(std::uint64_t size, Placement placement) {
  // Zero, and sizes so large that aligning them would wrap around, are refused outright.
  if (size == 0 || size > kLargestRequest)
    return Reservation{0, Error{ErrorKind::buffer_too_big, size}};
  Impl& m = *impl_;
  // The calling thread's cache first, without the manager's lock (Note [Thread caches]).
  if (size <= kThreadCacheSliceMax && placement == Placement::automatic &&
      m.caches_open.load(std::memory_order_acquire)) {
    if (ThreadCache* cache = find_thread_cache(m.id)) {
      bool clock_due = false;
      const DevicePtr ptr = cache->take(size, m.caches_open, &clock_due);
      if (clock_due) m.advance_clock(kThreadCacheClockBatch);
      if (ptr != 0) return Reservation{ptr, Error{}, false};
    }
  }
  Impl::Scope scope(m);
  m.index.reserve_one();
  m.tick(1);

  std::uint32_t wait_budget_us = kFenceWaitBoundMicros;  // for the whole reservation
  bool may_flush = true;  // once per reservation (Note [Releases before growth])
  Route r = m.route(size, placement, wait_budget_us, may_flush);
  while (r.wait_for_fence || r.flush_releases) {
    if (r.flush_releases) {
      may_flush = false;
      m.flush_before_growth(scope, &wait_budget_us);
    } else if (r.patient) {
      m.wait_for_oldest_fence(scope);
    } else {
      m.wait_for_oldest_fence(scope, &wait_budget_us);
    }
    r = m.route(size, placement, wait_budget_us, may_flush);
  }
  if (r.slice == nullptr && r.status == AllocStatus::out_of_memory) {
    r = m.recover_from_oom(scope, size, placement);
    if (r.slice != nullptr) {
      ++m.oom_recoveries;
    } else if (r.status == AllocStatus::out_of_memory) {
      ++m.oom_failures;
      if (m.options.log != LogLevel::off) {
        const MemoryUsage u = m.usage();
        const std::uint64_t idle = m.idle();
        m.log(LogLevel::basic,
              "out of device memory: requested " + std::to_string(size) + " B, in use " +
                  std::to_string(u.bytes_in_use) + " B, reserved " +
                  std::to_string(u.bytes_reserved) + " B, idle pages " + std::to_string(idle) +
                  " B, free space inside used pages (too fragmented for this request) " +
                  std::to_string(m.free_bytes() - idle) + " B, pending fence " +
                  std::to_string(m.pending()) + " B");
      }
    }
  }
  if (r.slice == nullptr) return Reservation{0, r.error};
  m.index.insert(r.slice->ptr, r.slice);
  m.cache_new_slice(r.slice, placement);
  m.trace(LogEvent::Kind::allocate, size, r.slice->ptr, r.slice->page->pool->kind_name());
  return Reservation{r.slice->ptr, Error{}, r.grew};
}

FreeOutcome MemoryManager::free(DevicePtr ptr) {
  Impl& m = *impl_;
  if (ptr != 0 && m.caches_open.load(std::memory_order_acquire)) {
    if (ThreadCache* cache = find_thread_cache(m.id)) {
      switch (cache->give(ptr, m.caches_open)) {
        case ThreadCache::Give::parked: return FreeOutcome::freed;
        case ThreadCache::Give::double_free: return FreeOutcome::double_free;
        case ThreadCache::Give::not_here: break;
      }
    }
  }
  Impl::Scope scope(m);
  Slice* slice = ptr == 0 ? nullptr : m.index.erase(ptr);
  if (slice == nullptr) return m.classify(ptr);
  // Parked in a thread's cache: the program freed it already, and nothing changes (the entry
  // goes back where it was; the table just shrank, so this insert never grows it).
  if (slice->cache != nullptr && !m.uncache(slice)) {
    m.index.insert(ptr, slice);
    return FreeOutcome::double_free;
  }
  m.recent_frees[m.recent_next] = ptr;
  m.recent_next = (m.recent_next + 1) % kRecentFrees;
  if (slice->pins > 0) {
    slice->page->pool->to_held(slice);
  } else {
    m.retire(slice);
  }
  m.trace(LogEvent::Kind::free, 0, ptr, "");
  m.finish_sync_frees(scope);
  return FreeOutcome::freed;
}

std::uint64_t MemoryManager::live_size(DevicePtr ptr) const {
  std::lock_guard lock(impl_->mutex);
  Slice* slice = impl_->index.find(ptr);
  if (slice == nullptr || (slice->cache != nullptr && impl_->parked(slice))) return 0;
  return slice->requested;
}

void MemoryManager::set_mode(AllocationMode mode) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  if (m.options.persistent == PersistentMode::disabled ||
      m.options.persistent == PersistentMode::enforced)
    return;
  if (mode == AllocationMode::persistent) {
    ++m.windows;
  } else if (m.windows > 0) {
    --m.windows;
  }
  m.update_cache_gate();
}

void MemoryManager::set_capture_window(bool open) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  if (open) {
    ++m.capture_windows;
  } else if (m.capture_windows > 0) {
    --m.capture_windows;
  }
  m.update_cache_gate();
}

Error MemoryManager::install_layout(const PoolLayout& layout) {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  // Pending slices still belong to the old pools: wait for their fences (a quiescent point,
  // not the hot path), then return every idle page.
  m.flush_caches(false);
  m.drain(scope);
  m.cleanup_all(true);
  std::uint64_t busy = 0;
  for (const auto& pool : m.pools) busy += pool->usage().bytes_in_use + pool->pending_bytes();
  if (busy > 0) return Error{ErrorKind::pools_in_use, busy};
  m.build_pools(layout);
  // A new layout is a new plan: its peaks start from what is held now.
  m.ctx.totals.in_use_peak = m.ctx.totals.in_use;
  m.ctx.totals.reserved_peak = m.ctx.totals.reserved;
  return {};
}

void MemoryManager::cleanup(bool explicit_cleanup) {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  m.flush_caches(false, !explicit_cleanup);
  if (explicit_cleanup) m.close_and_reap();
  m.cleanup_all(explicit_cleanup);
}

void MemoryManager::fence_open_frees() {
  Impl& m = *impl_;
  if (!m.fences.open_hint()) return;
  Impl::Scope scope(m);
  m.close_epoch();
}

GiveBack MemoryManager::give_back_all(std::uint32_t max_microseconds) {
  Impl& m = *impl_;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::microseconds(max_microseconds);
  Impl::Scope scope(m);
  if (m.frozen != 0) return GiveBack::nothing;
  m.flush_caches(false);
  if (m.idle() == 0 && m.pending() == 0 && m.device.releasing_bytes() == 0)
    return GiveBack::nothing;
  if (m.device.capture_active()) return GiveBack::nothing;
  m.close_and_reap();
  // Nothing moved since an earlier call ran out of a bound at least this long (a stream parked
  // before it holds the fences or the driver's frees): waiting again would only cost it again.
  const Impl::GiveBackState now{m.pending(), m.device.releasing_bytes(),
                                m.frees.load(std::memory_order_relaxed), max_microseconds};
  if (m.idle() == 0 && m.give_back_stuck && m.give_back_stuck->same_as(now))
    return GiveBack::timed_out;
  ++m.give_backs;
  bool timed_out = false;
  while (m.pending() != 0) {
    // Frees other threads made while the lock was released wait in the open epoch.
    if (!m.fences.any_closed()) m.close_epoch();
    if (!m.fences.any_closed()) break;  // no fence could be recorded
    if (!m.wait_for_oldest_fence(scope, deadline)) {
      timed_out = true;
      break;
    }
  }
  m.cleanup_all(true);
  scope.unlock();  // the pages go to the device
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
      deadline - std::chrono::steady_clock::now());
  const bool flushed = m.device.flush_releases(
      static_cast<std::uint32_t>(std::max<std::int64_t>(left.count(), 0)));
  scope.relock();
  if (!timed_out && flushed) {
    m.give_back_stuck.reset();
    return GiveBack::done;
  }
  ++m.give_back_timeouts;
  m.give_back_stuck = Impl::GiveBackState{m.pending(), m.device.releasing_bytes(),
                                          m.frees.load(std::memory_order_relaxed),
                                          max_microseconds};
  return GiveBack::timed_out;
}

bool MemoryManager::frozen() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->frozen != 0;
}

std::uint64_t MemoryManager::frees() const {
  std::lock_guard lock(impl_->mutex);  // the list of caches
  return impl_->frees.load(std::memory_order_relaxed) + impl_->parked_frees();
}

bool MemoryManager::flush_releases(std::uint32_t max_microseconds) {
  return impl_->device.flush_releases(max_microseconds);
}

MemoryUsage MemoryManager::memory_usage() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->program_usage();
}

std::uint64_t MemoryManager::alignment() const { return impl_->ctx.alignment; }

std::uint64_t MemoryManager::idle_bytes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->idle();
}

void MemoryManager::forget() {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  m.drop_everything();
}

void MemoryManager::set_stream_ordered(bool ordered) {
  std::lock_guard lock(impl_->mutex);  // frees read the flag under this lock: a barrier
  impl_->stream_ordered = ordered;
  impl_->update_cache_gate();  // and the caches' frees read the gate under theirs
}


void MemoryManager::set_frozen(bool frozen) {
  std::lock_guard lock(impl_->mutex);
  if (frozen) {
    ++impl_->frozen;
  } else if (impl_->frozen > 0) {
    --impl_->frozen;
  }
  impl_->update_cache_gate();
}

RetainedSlice MemoryManager::retain(DevicePtr ptr) {
  std::lock_guard lock(impl_->mutex);
  Slice* slice = ptr == 0 ? nullptr : impl_->index.find(ptr);
  if (slice == nullptr) return {};
  if (slice->cache != nullptr && !impl_->uncache(slice)) return {};  // parked: freed
  ++slice->pins;
  return RetainedSlice{ptr, impl_->generation, slice};
}

bool MemoryManager::release_retained(const RetainedSlice& pin) {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  if (!pin || pin.generation != m.generation) return false;
  Slice* slice = static_cast<Slice*>(pin.node);
  if (slice->ptr != pin.ptr || slice->pins == 0) return false;
  if (--slice->pins == 0 && slice->state == SliceState::held) m.retire(slice);
  m.finish_sync_frees(scope);
  return true;
}

std::uint64_t MemoryManager::prime(const CaptureProfile& profile) {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  // Slices a graph released just now wait for their fence: give the device a bounded time to
  // pass it, so they count as free instead of being doubled (priming is rare: a capture begin).
  m.close_epoch();
  std::uint32_t budget = kPrimeWaitMicros;
  while (m.persistent->pending_bytes() > 0 && budget > 0 && m.fences.any_closed())
    m.wait_for_oldest_fence(scope, &budget);
  std::uint64_t added = 0;
  for (const auto& [size, count] : profile) {
    if (size == 0 || size > kLargestRequest) continue;
    for (std::uint64_t have = m.persistent->free_count(size); have < count; ++have) {
      if (m.frozen != 0 || m.persistent->add_free(size) != AllocStatus::ok) return added;
      added += align_up(size, m.ctx.alignment);
    }
  }
  return added;
}

bool MemoryManager::reissue(const RetainedSlice& pin, std::uint64_t requested) {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  if (!pin || pin.generation != m.generation || requested == 0) return false;
  Slice* slice = static_cast<Slice*>(pin.node);
  if (slice->ptr != pin.ptr || slice->state != SliceState::held || requested > slice->size)
    return false;
  m.index.reserve_one();
  slice->page->pool->reissue(slice, requested);
  m.index.insert(slice->ptr, slice);
  return true;
}

std::uint64_t MemoryManager::pinned_size(const RetainedSlice& pin) const {
  std::lock_guard lock(impl_->mutex);
  if (!pin || pin.generation != impl_->generation) return 0;
  const Slice* slice = static_cast<const Slice*>(pin.node);
  return slice->ptr == pin.ptr ? slice->size : 0;
}

bool MemoryManager::drain_fences() {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  return m.drain(scope);
}

std::uint64_t MemoryManager::fence_waits() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->fence_waits;
}

std::uint64_t MemoryManager::fence_wait_timeouts() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->fence_wait_timeouts;
}

}  // namespace poolcuda
