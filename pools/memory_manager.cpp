// MemoryManager: routing of reservations (persistent windows, the `persistent` setting, dynamic
// pools in order with spill from a full capped pool), the free path (pointer index, pins, free
// fences), cleanup and out-of-memory recovery. Reports and consistency checks are in
// manager_inspect.cpp. Depends on pools/ only; the Device is its only way to the hardware.
//
// Note [Free fences]
// ~~~~~~~~~~~~~~~~~~
// A program may free a buffer that a kernel on another stream still uses: the real cudaFree
// waits for the device, so that was safe before the pools. Handing such a slice to the next
// reservation at once would let two kernels share bytes. Under FreeFence::events a free
// therefore (1) removes the slice from the pointer index at once, so a second free is a
// detected double free; (2) marks it pending: its bytes are neither in use nor idle
// (pending_fence_bytes in the report); and (3) appends it to the open epoch (FenceQueue, an
// intrusive chain: no allocation per free). The open epoch is closed, by recording one
// Device fence after all work issued so far, when it holds options.fence_batch frees, or a
// quarter of fence_slack bytes (at least 1 MiB: early fences are usually passed by the time the
// bound below needs their memory), or when a reservation misses (cannot be served from free
// memory by the pool routing picked, i.e. just before a pool would grow or the reservation
// would fail for capacity). If fence_record()
// returns kNoFence (a capture is open) the epoch simply stays open. Closed epochs are reaped,
// oldest first, when an epoch closes and on every miss before growing: a passed fence returns
// its slices to their pools, which coalesce them. Reaping only queries (fence_passed), never
// blocks; when a miss reaped something, routing restarts so the returned memory is used before
// the device is asked for more. FreeFence::sync calls Device::synchronize() and frees at once;
// FreeFence::none frees at once (single-stream programs, measurements).
//
// The bound. Reaping alone cannot keep up with a host that runs far ahead of the device (the
// usual case on a GPU: kernels are queued, not finished). A loop that allocates and frees one
// size then misses every page-full of frees, finds the fence it just recorded not yet passed,
// and grows: without a bound the pool grows for as long as the host stays ahead, every new page
// idle a moment later. So fence-pending bytes are bounded by
//     limit = max(options.fence_slack, bytes in use / 8)
// (the slack lets short bursts run ahead freely; the share of the live set keeps the bound from
// being tiny next to a large working set). When a miss has closed the open epoch and reaped,
// and the pending bytes still exceed the limit, the manager waits for the OLDEST closed epoch
// (fence_wait_for), gives its slices back, reaps whatever else has passed meanwhile and routes
// again; it repeats while the pending bytes exceed the limit and closed epochs remain, and only
// then grows. Waiting on the oldest fence, not on the newest nor on the whole device, is what
// keeps this cheap: that fence was recorded the longest time ago, so the device is most likely
// past it or close to it, the wait is short, and later fences that passed meanwhile come back
// in the same step. The real cudaFree synchronizes the whole device on every call; this waits,
// rarely, for a point the device has (nearly) reached.
// The wait is bounded: at most kFenceWaitBoundMicros (manager_impl.h) in total per
// reservation; when the bound expires the reservation grows as if there were no bound. A real
// cudaMalloc never waits on streams, and a program may park a stream on a host function that
// only the allocating thread will release: an unbounded wait here (holding the manager's lock,
// so other threads reserving on the device wait too) would deadlock it. Under normal device
// lag the bound is ample, so memory stays bounded; when fences do not pass, growth is throttled
// to one page per bound, never stopped.
// fence_slack 0 leaves only the share of the live set: no pool grows while more than an
// eighth of the bytes in use wait on fences (with nothing in use: while any do) and the oldest
// fence passes within the bound. If the miss could not close the open epoch
// (kNoFence: a capture is open) nothing is waited for: the memory freed during the capture has
// no fence to wait on, and blocking a capturing thread for older work would not free it, so the
// pool grows as before. Only the out-of-memory path and drain_fences() wait without limit
// (fence_wait, for every fence): there the program would otherwise fail, and waiting is what
// the real cudaFree would have done at the time of each free.
//
// Capture under FreeFence::sync. A device-wide synchronize while a stream capture is open
// would invalidate the capture, so while Device::capture_active() says one is open a free
// under sync retires its slice through the open epoch exactly as under events; the epoch is
// closed and reaped by later misses, cleanups or drain_fences() like any other.
//
// Note [Exit]
// ~~~~~~~~~~~
// The destructor releases nothing. A manager lives as long as the process; at exit the CUDA
// runtime may already be torn down, so releasing pages would call into a dead driver, and the
// process's memory goes away anyway. Tests that check for leaks free every slice and run an
// explicit cleanup first.
#include "pools/memory_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "pools/options.h"
#include "pools/layout.h"
#include "pools/manager_impl.h"
#include "pools/sliced_pool.h"

namespace poolcuda {

namespace {
constexpr std::uint64_t kLargestRequest = std::uint64_t{1} << 62;  // 4 EiB
// A pending slice whose fence has passed returns to its pool (which coalesces it).
constexpr auto kGiveBack = [](Slice* s) { s->page->pool->give_back(s); };
}  // namespace

MemoryManager::Impl::Impl(Device& d, const ManagerOptions& o)
    : device(d), options(o), ctx(d) {
  total_memory = device.memory_info().total_bytes;
  persistent = std::make_unique<PersistentPool>(ctx);
  build_pools(options.layout);
}

void MemoryManager::Impl::build_pools(const PoolLayout& layout) {
  pools.clear();
  for (const PoolSpec& spec : resolve_layout(layout, total_memory, ctx.alignment)) {
    switch (spec.kind) {
      case PoolKind::sliced:
        pools.push_back(std::make_unique<SlicedPool>(ctx, spec.page_size, spec.max_slice_size,
                                                     spec.cap, spec.dealloc_period));
        break;
      case PoolKind::exclusive:
        pools.push_back(
            std::make_unique<ExclusivePool>(ctx, spec.max_alloc_size, spec.dealloc_period));
        break;
      case PoolKind::direct:
        pools.push_back(std::make_unique<DirectPool>(ctx, spec.reclaim_at));
        break;
    }
  }
  capacity_warned.assign(pools.size(), false);
  options.layout = layout;
}

void MemoryManager::Impl::drop_everything() {
  fences.forget(device);
  index.clear();
  pools.clear();
  persistent.reset();
  ctx.page_set.clear();
  ctx.slices.reset();
  ctx.pages.reset();
  ctx.next_deadline = kNever;
  ctx.totals = {};
  persistent = std::make_unique<PersistentPool>(ctx);
  build_pools(options.layout);
  ++generation;
}

void MemoryManager::Impl::log(LogLevel level, const std::string& message) const {
  if (options.log == LogLevel::off || level > options.log) return;
  if (options.log_sink) {
    options.log_sink(level, message);
  } else {
    std::fprintf(stderr, "poolcuda: %s\n", message.c_str());
  }
}

MemoryUsage MemoryManager::Impl::usage() const {
  MemoryUsage total = persistent->usage();
  for (const auto& pool : pools) total += pool->usage();
  return total;
}

std::uint64_t MemoryManager::Impl::pending() const {
  std::uint64_t bytes = persistent->pending_bytes();
  for (const auto& pool : pools) bytes += pool->pending_bytes();
  return bytes;
}

std::uint64_t MemoryManager::Impl::idle() const {
  std::uint64_t bytes = persistent->idle_page_bytes();
  for (const auto& pool : pools) bytes += pool->idle_page_bytes();
  return bytes;
}

std::uint64_t MemoryManager::Impl::free_bytes() const {
  std::uint64_t bytes = persistent->free_bytes();
  for (const auto& pool : pools) bytes += pool->free_bytes();
  return bytes;
}

// --- Routing -------------------------------------------------------------------------------------

bool MemoryManager::Impl::reclaim_on_miss(bool* refused) {
  if (!fences.any()) return false;
  *refused = fences.open_count() != 0 && !fences.close(device);
  return fences.reap(device, kGiveBack) != 0;
}

std::uint64_t MemoryManager::Impl::fence_limit() const {
  return std::max(options.fence_slack, usage().bytes_in_use / 8);
}

bool MemoryManager::Impl::wait_over_limit(std::uint32_t* budget_us) {
  if (!fences.any_closed() || *budget_us == 0) return false;
  const std::uint64_t waiting = pending();
  const std::uint64_t limit = fence_limit();
  if (waiting <= limit) return false;
  // A capture is open: the program is recording a graph; never stall it on an old fence.
  if (device.capture_active()) return false;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const bool passed = fences.wait_oldest_for(device, *budget_us, kGiveBack);
  const auto spent = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  *budget_us = passed && spent.count() < *budget_us
                   ? *budget_us - static_cast<std::uint32_t>(spent.count())
                   : 0;
  ++fence_waits;
  fence_wait_seconds += static_cast<double>(spent.count()) * 1e-6;
  if (!passed) {
    ++fence_wait_timeouts;
    if (options.log == LogLevel::full)
      log(LogLevel::full, "the oldest free fence did not pass within " +
                              std::to_string(kFenceWaitBoundMicros) + " us: growing with " +
                              std::to_string(waiting) + " B pending, bound " +
                              std::to_string(limit) + " B");
    return false;
  }
  fences.reap(device, kGiveBack);  // later fences the device passed meanwhile
  if (options.log == LogLevel::full)
    log(LogLevel::full, "waited for the oldest free fence: " + std::to_string(waiting) +
                            " B pending, bound " + std::to_string(limit) + " B, " +
                            std::to_string(pending()) + " B pending after");
  return true;
}

Slice* MemoryManager::Impl::route(std::uint64_t size, Error* error, AllocStatus* status) {
  const bool persistent_mode =
      windows > 0 || options.persistent == PersistentMode::enforced;
  const bool size_match = options.persistent == PersistentMode::size_match;
  bool reclaimed = false;
  bool refused = false;
  std::uint32_t wait_budget_us = kFenceWaitBoundMicros;  // for the whole reservation
  // Before any growth (Note [Free fences]): the first miss closes the open epoch and reaps
  // passed fences; while fence-pending bytes exceed their bound, each miss waits for the oldest
  // closed epoch. Either way, when memory came back, routing starts over.
  auto miss = [&] {
    if (!reclaimed) {
      reclaimed = true;
      if (reclaim_on_miss(&refused)) return true;
    }
    return !refused && wait_over_limit(&wait_budget_us);
  };
  *status = AllocStatus::ok;

restart:
  if (persistent_mode || size_match) {
    if (Slice* s = persistent->try_reserve(size)) return s;
  }
  if (persistent_mode || (size_match && persistent->has_size(size))) {
    if (miss()) goto restart;
    Slice* s = nullptr;
    *status = persistent->grow(size, &s);
    if (*status == AllocStatus::ok) return s;
    *error = Error{*status == AllocStatus::out_of_memory ? ErrorKind::out_of_memory
                                                          : ErrorKind::device_error, size};
    return nullptr;
  }

  Error capacity;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    Pool& pool = *pools[i];
    if (!pool.accepts(size)) continue;
    if (Slice* s = pool.try_reserve(size)) return s;
    if (Error limit = pool.growth_limit(size)) {
      if (!capacity_warned[i]) {
        capacity_warned[i] = true;
        log(LogLevel::basic, "memory pool " + std::to_string(i) + " (" + pool.describe().shape +
                                 ") is at capacity (first hit at an allocation of " +
                                 std::to_string(size) +
                                 " B); spilling to the next accepting pool. The plan is short "
                                 "for this workload.");
      }
      capacity = limit;
      continue;
    }
    if (miss()) goto restart;
    Slice* s = nullptr;
    *status = pool.grow(size, &s);
    if (*status == AllocStatus::ok) return s;
    // A spill already in hand says more (the plan was short) than the failure behind it.
    *error = capacity ? capacity
                      : Error{*status == AllocStatus::out_of_memory ? ErrorKind::out_of_memory
                                                                     : ErrorKind::device_error,
                              size};
    return nullptr;
  }
  if (capacity && miss()) goto restart;
  *error = capacity ? capacity : Error{ErrorKind::buffer_too_big, size};
  return nullptr;
}

void MemoryManager::Impl::implicit_cleanup() {
  persistent->cleanup(false);
  std::uint64_t next = persistent->deadline();
  for (const auto& pool : pools) {
    pool->cleanup(false);
    next = std::min(next, pool->deadline());
  }
  ctx.next_deadline = next;
}

std::uint64_t MemoryManager::Impl::cleanup_all(bool explicit_cleanup) {
  std::uint64_t released = persistent->cleanup(explicit_cleanup);
  for (const auto& pool : pools) released += pool->cleanup(explicit_cleanup);
  ctx.next_deadline = kNever;
  for (const auto& pool : pools) ctx.next_deadline = std::min(ctx.next_deadline, pool->deadline());
  return released;
}

bool MemoryManager::Impl::drain() {
  const bool closed = fences.open_count() == 0 || fences.close(device);
  fences.wait_all(device, kGiveBack);
  return closed;
}

void MemoryManager::Impl::recover_from_oom() {
  drain();
  cleanup_all(true);
}

// --- Free path -----------------------------------------------------------------------------------

void MemoryManager::Impl::retire(Slice* slice) {
  Pool* pool = slice->page->pool;
  pool->to_pending(slice);
  switch (options.free_fence) {
    case FreeFence::none:
      pool->give_back(slice);
      return;
    case FreeFence::sync:
      // A device-wide synchronize would invalidate an open capture: the slice waits in an
      // epoch like an events free (Note [Free fences]).
      if (!device.capture_active()) {
        device.synchronize();
        pool->give_back(slice);
        return;
      }
      [[fallthrough]];
    case FreeFence::events:
      fences.add(slice);
      // Also close by bytes: a fence recorded early is usually passed by the time the bound on
      // pending bytes needs its memory, so a miss reaps instead of waiting.
      if (fences.open_count() >= std::max<std::uint32_t>(options.fence_batch, 1) ||
          fences.open_bytes() >= epoch_bytes())
        close_epoch();
      return;
  }
}

void MemoryManager::Impl::close_epoch() {
  if (fences.close(device)) fences.reap(device, kGiveBack);
}

FreeOutcome MemoryManager::Impl::classify(DevicePtr ptr) const {
  auto it = ctx.page_set.upper_bound(ptr, PageOrder{});
  if (it == ctx.page_set.begin()) return FreeOutcome::not_mine;
  --it;
  if (ptr >= it->base + it->size) return FreeOutcome::not_mine;
  // Error path only: a linear walk of one page's slices.
  for (const Slice& s : it->slices) {
    if (ptr >= s.ptr && ptr < s.ptr + s.size)
      return s.state == SliceState::live ? FreeOutcome::interior_pointer
                                         : FreeOutcome::double_free;
  }
  return FreeOutcome::not_mine;  // unreachable while slices tile their page
}

// --- Public interface ----------------------------------------------------------------------------

MemoryManager::MemoryManager(Device& device, const ManagerOptions& options)
    : impl_(std::make_unique<Impl>(device, options)) {}

MemoryManager::~MemoryManager() = default;

Reservation MemoryManager::allocate(std::uint64_t size) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  // Zero, and sizes so large that aligning them would wrap around, are refused outright.
  if (size == 0 || size > kLargestRequest)
    return Reservation{0, Error{ErrorKind::buffer_too_big, size}};
  ++m.ctx.clock;
  if (m.ctx.clock >= m.ctx.next_deadline) m.implicit_cleanup();

  Error error;
  AllocStatus status = AllocStatus::ok;
  Slice* slice = m.route(size, &error, &status);
  if (slice == nullptr && status == AllocStatus::out_of_memory) {
    m.recover_from_oom();
    error = Error{};
    slice = m.route(size, &error, &status);
    if (slice != nullptr) {
      ++m.oom_recoveries;
    } else if (status == AllocStatus::out_of_memory) {
      ++m.oom_failures;
    }
    // Guarded like the log:full lines: no strings are built under log:off.
    if (slice == nullptr && status == AllocStatus::out_of_memory &&
        m.options.log != LogLevel::off) {
      const MemoryUsage u = m.usage();
      m.log(LogLevel::basic,
            "out of device memory: requested " + std::to_string(size) + " B, in use " +
                std::to_string(u.bytes_in_use) + " B, reserved " +
                std::to_string(u.bytes_reserved) + " B, idle " + std::to_string(m.idle()) +
                " B, pending fence " + std::to_string(m.pending()) + " B");
    }
  }
  if (slice == nullptr) return Reservation{0, error};
  m.index.insert(slice->ptr, slice);
  if (m.options.log == LogLevel::full)
    m.log(LogLevel::full, "allocate " + std::to_string(size) + " B -> " +
                              std::to_string(slice->ptr) + " (" + slice->page->pool->describe().kind +
                              ")");
  return Reservation{slice->ptr, Error{}};
}

FreeOutcome MemoryManager::free(DevicePtr ptr) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  Slice* slice = ptr == 0 ? nullptr : m.index.erase(ptr);
  if (slice == nullptr) return m.classify(ptr);
  if (slice->pins > 0) {
    slice->page->pool->to_held(slice);
  } else {
    m.retire(slice);
  }
  if (m.options.log == LogLevel::full) m.log(LogLevel::full, "free " + std::to_string(ptr));
  return FreeOutcome::freed;
}

std::uint64_t MemoryManager::live_size(DevicePtr ptr) const {
  std::lock_guard lock(impl_->mutex);
  const Slice* slice = impl_->index.find(ptr);
  return slice == nullptr ? 0 : slice->requested;
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
}

Error MemoryManager::install_layout(const PoolLayout& layout) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  // Pending slices still belong to the old pools: wait for their fences (a quiescent point,
  // not the hot path), then return every idle page.
  m.drain();
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
  std::lock_guard lock(impl_->mutex);
  if (explicit_cleanup) {
    impl_->close_epoch();
    impl_->fences.reap(impl_->device, kGiveBack);
  }
  impl_->cleanup_all(explicit_cleanup);
}

MemoryUsage MemoryManager::memory_usage() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->usage();
}

std::uint64_t MemoryManager::idle_bytes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->idle();
}

void MemoryManager::forget() {
  std::lock_guard lock(impl_->mutex);
  impl_->drop_everything();
}

RetainedSlice MemoryManager::retain(DevicePtr ptr) {
  std::lock_guard lock(impl_->mutex);
  Slice* slice = ptr == 0 ? nullptr : impl_->index.find(ptr);
  if (slice == nullptr) return {};
  ++slice->pins;
  return RetainedSlice{ptr, impl_->generation, slice};
}

bool MemoryManager::release_retained(const RetainedSlice& pin) {
  std::lock_guard lock(impl_->mutex);
  Impl& m = *impl_;
  if (!pin || pin.generation != m.generation) return false;
  Slice* slice = static_cast<Slice*>(pin.node);
  if (slice->ptr != pin.ptr || slice->pins == 0) return false;
  if (--slice->pins == 0 && slice->state == SliceState::held) m.retire(slice);
  return true;
}

bool MemoryManager::drain_fences() {
  std::lock_guard lock(impl_->mutex);
  return impl_->drain();
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
