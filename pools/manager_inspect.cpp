// The read side of a MemoryManager: report() snapshots (taken under the lock, rendered
// elsewhere by report.cpp), and the test inspections pages() and check_consistency(), which
// walk every page and slice and cross-check them with the free sets, the pointer index, the
// pending epochs and the counters.
#include <algorithm>
#include <map>
#include <string>

#include "pools/manager_shards.h"

namespace poolcuda {

namespace {

const char* reuse_word(FreeFence mode, bool stream_ordered) {
  switch (mode) {
    case FreeFence::automatic: return stream_ordered ? "ordered" : "fenced";
    case FreeFence::events: return "fenced";
    case FreeFence::sync: return "synchronized";
    case FreeFence::none: return "unfenced";
  }
  return "fenced";
}

// Adds one shard's pool figures to another's: the shards share the layout, so the settings
// echoed are the same; the largest free block is the largest of either.
void add_pool(PoolReport& total, const PoolReport& shard) {
  const std::uint64_t largest = std::max(total.largest_free, shard.largest_free);
#define POOLCUDA_ADD(member, label, unit, detail) total.member += shard.member;
  POOLCUDA_POOL_NUMBERS(POOLCUDA_ADD)
#undef POOLCUDA_ADD
  total.page_size = shard.page_size;
  total.max_slice_size = shard.max_slice_size;
  total.cap = shard.cap;
  total.largest_free = largest;
}

}  // namespace

ManagerReport MemoryManager::report() const {
  // The shards one after another, each under its lock, and again while their pages changed
  // meanwhile: a page lent between two snapshots counted in both (a device of 2 GiB reported
  // 2.4 GiB reserved while threads allocated), or in neither, and so did a page one shard gave
  // back after its snapshot while another grew before its own. A snapshot that no such change
  // crossed adds up to the shards' counter of their pages (DeviceReserved); under changes that
  // never stop, the last of kReportAttempts stands.
  for (int attempt = 1;; ++attempt) {
    const std::uint64_t moves = shards_->pages_moved.load(std::memory_order_acquire);
    ManagerReport r = report_once();
    if ((shards_->pages_moved.load(std::memory_order_acquire) == moves &&
         r.bytes_reserved == shards_->device_reserved.now.load(std::memory_order_relaxed)) ||
        attempt == kReportAttempts)
      return r;
  }
}

ManagerReport MemoryManager::report_once() const {
  ManagerReport r;
  bool first = true;
  // Note [Device peaks]: no shard's own peak is above the device's.
  std::uint64_t in_use_peak = shards_->device_in_use_peak.load(std::memory_order_relaxed);
  std::uint64_t reserved_peak = shards_->device_reserved.peak.load(std::memory_order_relaxed);
  shards_->each([&](const Impl& m) {
    std::lock_guard lock(m.mutex);
    const ManagerReport one = m.snapshot();
    in_use_peak = std::max(in_use_peak, one.bytes_in_use_peak);
    reserved_peak = std::max(reserved_peak, one.bytes_reserved_peak);
    if (first) {
      r = one;
      first = false;
      return;
    }
    for (std::size_t i = 0; i < r.dynamic.size() && i < one.dynamic.size(); ++i)
      add_pool(r.dynamic[i], one.dynamic[i]);
    add_pool(r.persistent, one.persistent);
    for (std::size_t b = 0; b < kSizeBuckets; ++b) {
      r.live_sizes.slices[b] += one.live_sizes.slices[b];
      r.live_sizes.bytes[b] += one.live_sizes.bytes[b];
    }
#define POOLCUDA_ADD(group, member, label, unit, detail) r.member += one.member;
    POOLCUDA_MANAGER_NUMBERS(POOLCUDA_ADD)
#undef POOLCUDA_ADD
  });
  // The manager's, not a sum: shards:auto resolved, and one while a capped pool keeps the gate
  // shut for good (Note [Shards]). Nor are the peaks; the figures now are at most them.
  r.shard_limit = shards_->capped ? 1 : shards_->limit;
  r.bytes_in_use_peak = std::max(in_use_peak, r.bytes_in_use);
  r.bytes_reserved_peak = std::max(reserved_peak, r.bytes_reserved);
  return r;
}

ManagerReport MemoryManager::Impl::snapshot() const {
  const Impl& m = *this;
  ManagerReport r;
  r.device = m.options.device_index;
  r.shards = 1;
  for (const auto& pool : m.pools) r.dynamic.push_back(pool->report());
  r.persistent = m.persistent->report();
  r.pending_fence_bytes = m.pending();
  r.idle_bytes = m.idle();
  r.hole_bytes = m.free_bytes() - r.idle_bytes;
  r.oom_recoveries = m.oom_recoveries;
  r.oom_failures = m.oom_failures;
  r.oom_growth_waits = m.oom_growth_waits;
  r.cap_refusals = m.cap_refusals;
  r.bytes_in_use_peak = m.ctx.totals.in_use_peak;
  r.bytes_reserved_peak = m.ctx.totals.reserved_peak;
  r.live_sizes = m.ctx.totals.live_sizes;
  r.fence_waits = m.fence_waits;
  r.fence_wait_timeouts = m.fence_wait_timeouts;
  r.fence_wait_seconds = m.fence_wait_seconds;
  r.held_released_bytes = m.held_released_bytes;
  r.held_overruns = m.held_overruns;
  r.held_early_growths = m.held_early_growths;
  r.give_backs = m.give_backs;
  r.give_back_timeouts = m.give_back_timeouts;
  r.reuse = reuse_word(m.options.free_fence, m.stream_ordered);
  m.fill_cache_report(r);  // and the figures in use
  return r;
}

std::vector<PageView> MemoryManager::pages() const {
  std::vector<PageView> out;
  shards_->each([&](const Impl& m) {
    std::lock_guard lock(m.mutex);
    for (const Page& page : m.ctx.page_set) out.push_back(PageView{page.base, page.size});
  });
  std::sort(out.begin(), out.end(),
            [](const PageView& a, const PageView& b) { return a.base < b.base; });
  return out;
}

std::string MemoryManager::check_consistency() const {
  std::string breach;
  std::uint32_t k = 0;
  std::uint64_t reserved = 0;
  shards_->each([&](const Impl& m) {
    if (breach.empty()) {
      breach = m.check_consistency();
      if (!breach.empty() && shards_->count() > 1)
        breach = "shard " + std::to_string(k) + ": " + breach;
    }
    std::lock_guard lock(m.mutex);
    reserved += m.ctx.totals.reserved;
    ++k;
  });
  // With no call under way: the shards' counter of their pages is their pages.
  if (breach.empty() && reserved != shards_->device_reserved.now.load(std::memory_order_relaxed))
    breach = "the device's reserved bytes (" +
             std::to_string(shards_->device_reserved.now.load(std::memory_order_relaxed)) +
             ") are not its shards' (" + std::to_string(reserved) + ")";
  return breach;
}

std::string MemoryManager::Impl::check_consistency() const {
  std::lock_guard lock(mutex);
  const Impl& m = *this;
  struct Sums {
    MemoryUsage usage;
    std::uint64_t pending = 0;
    std::uint64_t free_slices = 0;
    std::uint64_t pages = 0;
  };
  std::map<const Pool*, Sums> sums;
  std::uint64_t live = 0;
  DevicePtr previous_end = 0;
  for (const Page& page : m.ctx.page_set) {
    const std::string where = "page at " + std::to_string(page.base);
    if (page.base < previous_end) return where + " overlaps the previous page";
    previous_end = page.base + page.size;
    Sums& s = sums[page.pool];
    s.pages += 1;
    s.usage.bytes_reserved += page.size;
    DevicePtr cursor = page.base;
    std::uint64_t busy = 0;
    bool previous_free = false;
    for (const Slice& slice : page.slices) {
      if (slice.ptr != cursor) return where + ": slices do not tile the page";
      if (slice.page != &page) return where + ": slice points at another page";
      if (slice.size == 0 || slice.size % m.ctx.alignment != 0)
        return where + ": slice size not a positive multiple of the alignment";
      cursor += slice.size;
      const bool is_free = slice.state == SliceState::free;
      if (is_free && previous_free && page.pool->slices_coalesce())
        return where + ": two adjacent free slices";
      previous_free = is_free;
      switch (slice.state) {
        case SliceState::free:
          s.free_slices += 1;
          break;
        case SliceState::live:
          if (m.index.find(slice.ptr) != &slice) return where + ": live slice not indexed";
          ++live;
          [[fallthrough]];
        case SliceState::held:
          ++busy;
          s.usage.number_allocs += 1;
          s.usage.bytes_in_use += slice.requested;
          s.usage.bytes_padding += slice.size - slice.requested;
          if (slice.requested > slice.size) return where + ": slice smaller than its request";
          break;
        case SliceState::pending:
          ++busy;
          s.pending += slice.size;
          break;
      }
    }
    if (cursor != page.base + page.size) return where + ": slices do not cover the page";
    if (busy != page.busy) return where + ": busy count is wrong";
  }
  if (live != m.index.size()) return "the pointer index holds entries that are not live slices";
  std::uint64_t pending_chain = 0;
  std::string chain_error;
  m.fences.for_each_pending([&](const Slice* s) {
    if (s->state != SliceState::pending) chain_error = "a fence epoch holds a non-pending slice";
    pending_chain += s->size;
  });
  if (!chain_error.empty()) return chain_error;
  std::vector<const Pool*> all;
  all.push_back(m.persistent.get());
  for (const auto& pool : m.pools) all.push_back(pool.get());
  std::uint64_t pending_total = 0;
  for (const Pool* pool : all) {
    const Sums& s = sums[pool];
    const std::string which = "pool " + pool->describe().kind + " " + pool->describe().shape;
    if (!(s.usage == pool->usage())) return which + ": usage counters differ from its slices";
    if (s.pending != pool->pending_bytes()) return which + ": pending bytes differ";
    if (s.free_slices != pool->free_slices()) return which + ": free set differs from its slices";
    if (!pool->free_set_consistent())
      return which + ": a free slice sits in the wrong bin, or split pages are miscounted";
    if (s.pages != pool->pages()) return which + ": page count differs";
    pending_total += s.pending;
  }
  if (m.options.free_fence != FreeFence::sync && m.options.free_fence != FreeFence::none &&
      pending_total != pending_chain)
    return "pending slices missing from the fence epochs";
  if (sums.size() > all.size()) return "a page belongs to no pool of this manager";
  const MemoryUsage total = m.usage();
  if (m.ctx.totals.in_use != total.bytes_in_use || m.ctx.totals.reserved != total.bytes_reserved)
    return "the manager-wide totals differ from the pools' counters";
  // Thread caches hold live, indexed slices that point back at them, and nothing else.
  std::uint64_t cached = 0;
  for (const auto& cache : m.caches) {
    std::lock_guard hold(cache->lock);
    std::uint64_t parked = 0;
    for (std::size_t i = 0; i < cache->count(); ++i) {
      const ThreadCache::Entry& e = cache->at(i);
      if (e.slice->cache != cache.get() || e.slice->state != SliceState::live ||
          m.index.find(e.ptr) != e.slice || e.slice->requested != e.requested ||
          e.slice->size != e.size)
        return "a thread cache holds a slice that does not match it";
      if (e.parked) parked += e.size;
    }
    if (parked != cache->parked_bytes()) return "a thread cache's parked bytes are wrong";
    cached += cache->count();
  }
  std::uint64_t marked = 0;
  for (const Page& page : m.ctx.page_set)
    for (const Slice& slice : page.slices)
      marked += (slice.state == SliceState::live || slice.state == SliceState::held) &&
                slice.cache != nullptr;
  if (marked != cached) return "slices marked cached that no thread cache holds";
  return {};
}

}  // namespace poolcuda
