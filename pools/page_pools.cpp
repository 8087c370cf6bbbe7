// ExclusivePool, PersistentPool and DirectPool: one slice per page, so a free slice is a free
// page and there is nothing to split or coalesce. The free set orders pages by (size, address):
// smallest-fit and exact-fit are both one lower_bound.
#include "pools/page_pools.h"

#include <algorithm>

#include "pools/options.h"

namespace poolcuda {

PagePool::~PagePool() { free_.clear(); }

Slice* PagePool::hand_out(Slice* slice, std::uint64_t size) {
  if (slice == nullptr) return nullptr;
  free_.erase(free_.iterator_to(*slice));
  mark_live(slice, size);
  return slice;
}

Slice* PagePool::exact(std::uint64_t eff) {
  auto it = free_.lower_bound(eff, SizeKeyOrder{});
  return it != free_.end() && it->size == eff ? &*it : nullptr;
}

AllocStatus PagePool::grow_page(std::uint64_t page_size, std::uint64_t size, Slice** out) {
  Page* page = nullptr;
  const AllocStatus status = new_page(page_size, &page);
  if (status != AllocStatus::ok) return status;
  Slice* slice = &page->slices.front();
  mark_live(slice, size);
  *out = slice;
  return AllocStatus::ok;
}

void PagePool::on_release(Page* page) { free_.erase(free_.iterator_to(page->slices.front())); }

std::uint64_t PagePool::largest_free() const { return free_.empty() ? 0 : free_.rbegin()->size; }

// --- ExclusivePool -----------------------------------------------------------------------------

ExclusivePool::ExclusivePool(PoolContext& ctx, std::uint64_t max_alloc_size,
                             std::optional<std::uint64_t> dealloc_period)
    : PagePool(ctx, dealloc_period), max_alloc_size_(max_alloc_size) {}

Slice* ExclusivePool::try_reserve(std::uint64_t size) {
  // Exponential average with weight 1/8: follows a workload's drift without one outlier
  // resizing every later page.
  average_ = average_ == 0 ? size : average_ - average_ / 8 + size / 8;
  auto it = free_.lower_bound(align_up(size, alignment()), SizeKeyOrder{});
  return it == free_.end() ? nullptr : hand_out(&*it, size);
}

std::uint64_t ExclusivePool::page_size_for(std::uint64_t size) const {
  const std::uint64_t a = alignment();
  const std::uint64_t want = align_up(std::max(average_, size), a);
  return std::max(align_up(size, a), std::min(want, align_up(max_alloc_size_, a)));
}

AllocStatus ExclusivePool::grow(std::uint64_t size, Slice** out) {
  return grow_page(page_size_for(size), size, out);
}

PoolReport ExclusivePool::describe() const {
  PoolReport r;
  r.kind = "exclusive";
  r.max_slice_size = max_alloc_size_;
  r.shape = "max=" + format_size(max_alloc_size_);
  if (dealloc_period_) r.notes = "period=" + std::to_string(*dealloc_period_);
  return r;
}

// --- PersistentPool ----------------------------------------------------------------------------

AllocStatus PersistentPool::grow(std::uint64_t size, Slice** out) {
  const AllocStatus status = grow_page(eff(size), size, out);
  if (status == AllocStatus::ok) ++sizes_[eff(size)];
  return status;
}

void PersistentPool::on_release(Page* page) {
  PagePool::on_release(page);
  auto it = sizes_.find(page->size);
  if (it != sizes_.end() && --it->second == 0) sizes_.erase(it);
}

bool PersistentPool::has_size(std::uint64_t size) const { return sizes_.count(eff(size)) != 0; }

PoolReport PersistentPool::describe() const {
  PoolReport r;
  r.kind = "persistent";
  r.shape = "exact fit";
  return r;
}

// --- DirectPool --------------------------------------------------------------------------------

AllocStatus DirectPool::grow(std::uint64_t size, Slice** out) {
  const std::uint64_t eff = align_up(size, alignment());
  while (usage_.bytes_reserved + eff > reclaim_at_ && !idle_.empty())
    release_page(&idle_.front());
  return grow_page(eff, size, out);
}

PoolReport DirectPool::describe() const {
  PoolReport r;
  r.kind = "direct";
  r.shape = "reclaim=" + format_size(reclaim_at_);
  return r;
}

}  // namespace poolcuda
