// SlicedPool. Invariants: the slices of a page tile it in address order; no two free slices
// are adjacent (free coalesces at once); every free slice is in free_ and nothing else is.
// A page whose slices are all free is a single free slice and sits in the idle list.
#include "pools/sliced_pool.h"

#include "pools/config.h"

namespace poolcuda {

SlicedPool::SlicedPool(PoolContext& ctx, std::uint64_t page_size, std::uint64_t max_slice_size,
                       std::optional<std::uint64_t> cap,
                       std::optional<std::uint64_t> dealloc_period)
    : Pool(ctx, dealloc_period),
      configured_page_(page_size),
      page_size_(page_size),
      max_slice_size_(max_slice_size),
      cap_(cap) {
  coalesces_ = true;
  if (cap_ && *cap_ < page_size_) page_size_ = *cap_ / ctx.alignment * ctx.alignment;
}

SlicedPool::~SlicedPool() { free_.clear(); }

Slice* SlicedPool::carve(Slice* slice, std::uint64_t size) {
  const std::uint64_t eff = align_up(size, alignment());
  free_.erase(free_.iterator_to(*slice));
  if (Slice* rest = split(slice, eff)) free_.insert(*rest);
  mark_live(slice, size);
  return slice;
}

Slice* SlicedPool::try_reserve(std::uint64_t size) {
  const std::uint64_t eff = align_up(size, alignment());
  auto it = free_.lower_bound(eff, SizeKeyOrder{});
  if (it == free_.end()) return nullptr;
  return carve(&*it, size);
}

Error SlicedPool::growth_limit(std::uint64_t size) const {
  if (!cap_) return {};
  const std::uint64_t eff = align_up(size, alignment());
  if (page_size_ == 0 || eff > page_size_ || usage_.bytes_reserved + page_size_ > *cap_)
    return Error{ErrorKind::pool_capacity_exceeded, *cap_};
  return {};
}

AllocStatus SlicedPool::grow(std::uint64_t size, Slice** out) {
  Page* page = nullptr;
  const AllocStatus status = new_page(page_size_, &page);
  if (status != AllocStatus::ok) return status;
  Slice* whole = &page->slices.front();
  free_.insert(*whole);
  *out = carve(whole, size);
  return AllocStatus::ok;
}

void SlicedPool::on_free(Slice* slice) {
  PageSlices& list = slice->page->slices;
  auto it = list.iterator_to(*slice);
  if (it != list.begin()) {
    Slice& prev = *std::prev(it);
    if (prev.state == SliceState::free) {
      free_.erase(free_.iterator_to(prev));
      prev.size += slice->size;
      list.erase(it);
      ctx_.slices.destroy(slice);
      slice = &prev;
      it = list.iterator_to(prev);
    }
  }
  auto next = std::next(it);
  if (next != list.end() && next->state == SliceState::free) {
    Slice& after = *next;
    free_.erase(free_.iterator_to(after));
    slice->size += after.size;
    list.erase(next);
    ctx_.slices.destroy(&after);
  }
  free_.insert(*slice);
}

void SlicedPool::on_release(Page* page) {
  // An idle page is exactly one free slice.
  free_.erase(free_.iterator_to(page->slices.front()));
}

std::uint64_t SlicedPool::largest_free() const {
  return free_.empty() ? 0 : free_.rbegin()->size;
}

PoolReport SlicedPool::describe() const {
  PoolReport r;
  r.kind = "sliced";
  r.page_size = page_size_;
  r.max_slice_size = max_slice_size_;
  r.cap = cap_ ? *cap_ : 0;
  r.shape = "page=" + format_size(page_size_) + " slice<=" + format_size(max_slice_size_);
  if (cap_) r.shape += " cap=" + format_size(*cap_);
  if (page_size_ != configured_page_) r.shape += " (page shrunk to the cap)";
  if (dealloc_period_) r.shape += " period=" + std::to_string(*dealloc_period_);
  return r;
}

}  // namespace poolcuda
