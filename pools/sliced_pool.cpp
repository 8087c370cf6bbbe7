// CarvedPool and SlicedPool. Invariants: the slices of a page tile it in address order; no two
// free slices are adjacent (free coalesces at once); every free slice is in free_ and nothing
// else is. A sliced pool's reserve takes a free slice that fits (Note [Free bins]) and serves
// from its top. A page whose slices are all free is a single free slice and sits in the idle list.
#include "pools/sliced_pool.h"

#include <algorithm>
#include <utility>

#include "pools/options.h"
#include "pools/slice_index.h"

namespace poolcuda {

// --- CarvedPool --------------------------------------------------------------------------------

CarvedPool::CarvedPool(PoolContext& ctx, std::optional<std::uint64_t> dealloc_period)
    : Pool(ctx, dealloc_period) {
  coalesces_ = true;
}

CarvedPool::~CarvedPool() { free_.clear(); }

// Changes a free slice's address and size; it moves between bins only when its bin changes.
void CarvedPool::rekey(Slice* slice, DevicePtr ptr, std::uint64_t size) {
  free_.resize(*slice, size, [ptr](Slice& s) { s.ptr = ptr; });
}

Slice* CarvedPool::take_whole(Slice* slice, std::uint64_t size) {
  free_.erase(*slice);
  // Its neighbours' marks go, else their frees would read it (Note [Free neighbours marked]).
  PageSlices& list = slice->page->slices;
  const auto at = list.iterator_to(*slice);
  if (at != list.begin()) std::prev(at)->free_after = 0;
  if (std::next(at) != list.end()) std::next(at)->free_before = 0;
  mark_live(slice, size);
  return slice;
}

Slice* CarvedPool::carve(Slice* slice, std::uint64_t size, End end) {
  const std::uint64_t eff = align_up(size, alignment());
  // The reservation inserts the new pointer in the index next (Note [Loads started early]).
  prefetch_index_cell(ctx_.index, end == End::top ? slice->ptr + slice->size - eff : slice->ptr);
  if (slice->size == eff) return take_whole(slice, size);
  if (single_slice(*slice->page)) split_page_bytes_ += slice->page->size;
  Slice* out = ctx_.slices.create();
  out->page = slice->page;
  out->size = eff;
  PageSlices& list = slice->page->slices;
  // The free rest and the slice it serves are neighbours; the rest's other neighbour, and the
  // served slice's, are not free (Note [Free neighbours marked]).
  if (end == End::top) {
    const auto above = std::next(list.iterator_to(*slice));
    if (above != list.end()) above->free_before = 0;
    out->ptr = slice->ptr + slice->size - eff;
    list.insert(above, *out);
    rekey(slice, slice->ptr, slice->size - eff);
    out->free_before = 1;
    slice->free_after = 0;
  } else {
    const auto at = list.iterator_to(*slice);
    if (at != list.begin()) std::prev(at)->free_after = 0;
    out->ptr = slice->ptr;
    list.insert(at, *out);
    rekey(slice, slice->ptr + eff, slice->size - eff);
    out->free_after = 1;
    slice->free_before = 0;
  }
  mark_live(out, size);
  return out;
}

// Note [Free neighbours marked]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With many live slices, a free waited for its slice's record, then for the records of both page
// neighbours, to learn whether either was free to merge with: a cache miss after a cache miss,
// for a merge that a nearly full pool seldom makes. So each slice carries two marks, set exactly
// while its neighbour before (after) it is free, and a free reads a neighbour's record only to
// merge with it. A slice becomes free only here (give_back) or as the rest of a carve, and both
// mark the slices beside it; a free slice served whole or carved clears the marks of the slices
// beside it, and a merged one's outer neighbours are marked again. Marks are plain byte stores,
// which the processor need not wait for (until the next lock). The consistency checks hold every
// mark to its neighbour's state.
void CarvedPool::on_free(Slice* slice) {
  Page& page = *slice->page;
  const bool was_split = !single_slice(page);
  PageSlices& list = page.slices;
  auto it = list.iterator_to(*slice);
  Slice* prev = slice->free_before != 0 && it != list.begin() &&
                        std::prev(it)->state == SliceState::free
                    ? &*std::prev(it)
                    : nullptr;
  auto after = std::next(it);
  Slice* next = slice->free_after != 0 && after != list.end() && after->state == SliceState::free
                    ? &*after
                    : nullptr;
  Slice* merged = slice;
  if (prev != nullptr) {
    // prev absorbs the slice (and next): it only grows, so only its successor can move.
    std::uint64_t size = prev->size + slice->size;
    if (next != nullptr) {
      size += next->size;
      free_.erase(*next);
      list.erase(list.iterator_to(*next));
      ctx_.slices.destroy(next);
    }
    list.erase(it);
    ctx_.slices.destroy(slice);
    rekey(prev, prev->ptr, size);
    merged = prev;
  } else if (next != nullptr) {
    // next absorbs the slice: it starts earlier and grows.
    list.erase(it);
    rekey(next, slice->ptr, next->size + slice->size);
    ctx_.slices.destroy(slice);
    merged = next;
  } else {
    free_.insert(*slice);
  }
  merged->free_before = 0;
  merged->free_after = 0;
  const auto at = list.iterator_to(*merged);
  if (at != list.begin()) std::prev(at)->free_after = 1;
  if (std::next(at) != list.end()) std::next(at)->free_before = 1;
  if (was_split && single_slice(page)) split_page_bytes_ -= page.size;
}

bool CarvedPool::free_set_consistent() const {
  if (!free_.consistent()) return false;
  std::uint64_t split = 0;
  for (const Page& page : ctx_.page_set) {
    if (page.pool != this) continue;
    if (!single_slice(page)) split += page.size;
    // A slice is marked exactly where its neighbour is free (Note [Free neighbours marked]).
    const Slice* before = nullptr;
    for (const Slice& slice : page.slices) {
      const bool first = before == nullptr;
      if ((slice.free_before != 0) != (!first && before->state == SliceState::free)) return false;
      if (!first && (before->free_after != 0) != (slice.state == SliceState::free)) return false;
      before = &slice;
    }
    if (!page.slices.empty() && page.slices.back().free_after != 0) return false;
  }
  return split == split_page_bytes_;
}

void CarvedPool::on_release(Page* page) {
  // An idle page is exactly one free slice.
  free_.erase(page->slices.front());
}

std::uint64_t CarvedPool::largest_free() const {
  return free_.largest();
}

// --- SlicedPool --------------------------------------------------------------------------------
//
// Note [Wider pages]
// ~~~~~~~~~~~~~~~~~~
// Every page is a driver allocation, and a driver call costs what a thousand pooled
// reservations do (about 100 us for a real cudaMalloc on an H200, whose cudaFree also waits for
// the device). On the stand-in, the 1,000-pair random trace up to 1 MiB spent 83% of its time in
// its 73 growths. So a sliced pool's page widens with the pool: a growth takes m configured pages
// in one allocation, m the largest power of two up to kWidestPage with m * kWidenDivisor pages'
// worth already held; a pool of 2 MiB pages that reaches 160 MiB makes 22 driver allocations
// instead of 80. A wide page is carved like any other and released whole when idle. What it
// costs: the newest page is at most a quarter of what the pool held before it, and so is the part
// of it not yet carved; a program that holds a few pages never widens (the one-buffer loop keeps
// one page). And a wide page is freed only once every slice in it is: a program that fills the
// device with small allocations, frees most of them and then asks for large ones gets back less
// memory from wide pages than from narrow ones (a 16 MiB page of 64 slices, seven in eight freed
// at random, is idle once in 5,000; a 2 MiB page of 8 slices, once in 3). On a 1 GiB stand-in
// device filled with 256 KiB buffers, seven in eight then freed, the plain run got 14 buffers of
// 64 MiB; the pools 5 with 2 MiB pages (a limit of sliced pages, README), 3 with pages widened
// until the pools held half the device, 4 with a quarter. So pages widen only while the shard
// holds less than a quarter of the device, and a wide page never takes it past that. What else
// bounds it: a 64th of the device, and the room the held bound and the budget leave
// (PoolContext::growth_room): the page narrows to fit, never below one configured page, which is
// all the bound and recovery count on (growth_bytes()). Fence-pending memory in the pool
// keeps it at one page, so the fence bound's "one page more at most" holds as it did; a cap keeps
// it too (the cap's arithmetic is in pages). A driver that refuses a wide page is asked for one
// configured page before the pool reports out of memory, so widening never turns a request the
// plain call would serve into a failure. Another shard's idle page of one configured page up to
// kWidestPage of them serves instead of the driver, whatever this shard's own growth may take:
// it adds nothing to the device (a shard past its quarter that borrowed only pages as narrow as
// its own left the wider idle pages of the shard beside it unused, and grew).

SlicedPool::SlicedPool(PoolContext& ctx, std::uint64_t page_size, std::uint64_t max_slice_size,
                       std::optional<std::uint64_t> cap,
                       std::optional<std::uint64_t> dealloc_period)
    : CarvedPool(ctx, dealloc_period),
      configured_page_(page_size),
      page_size_(page_size),
      max_slice_size_(max_slice_size),
      cap_(cap) {
  if (cap_ && *cap_ < page_size_) page_size_ = *cap_ / ctx.alignment * ctx.alignment;
}

Slice* SlicedPool::try_reserve(std::uint64_t size) {
  const std::uint64_t eff = align_up(size, alignment());
  Slice* slice = free_.fit(eff);
  return slice == nullptr ? nullptr : carve(slice, size);
}

Error SlicedPool::growth_limit(std::uint64_t size) const {
  if (!cap_) return {};
  const std::uint64_t eff = align_up(size, alignment());
  if (page_size_ == 0 || eff > page_size_ || usage_.bytes_reserved + page_size_ > *cap_)
    return Error{ErrorKind::pool_capacity_exceeded, *cap_};
  return {};
}

std::uint64_t SlicedPool::wide_page(std::uint64_t room) const {
  const std::uint64_t widen_below = ctx_.total_memory / kWideHeldShare;
  if (cap_ || page_size_ == 0 || pending_bytes_ != 0 || ctx_.totals.reserved >= widen_below)
    return page_size_;
  const std::uint64_t held = usage_.bytes_reserved / page_size_;
  const std::uint64_t most =
      std::min({room, ctx_.total_memory / kWidePageShare, widen_below - ctx_.totals.reserved});
  std::uint64_t m = 1;
  while (m * 2 <= kWidestPage && m * 2 * kWidenDivisor <= held && page_size_ * m * 2 <= most)
    m *= 2;
  return page_size_ * m;
}

AllocStatus SlicedPool::grow(std::uint64_t size, Slice** out) {
  Page* page = nullptr;
  const std::uint64_t wide = wide_page(ctx_.growth_room);
  // Another shard's idle page adds nothing to the device: any this pool could have widened to
  // will do, whatever this shard's own growth may take now.
  const std::uint64_t widest_borrowed = cap_ ? page_size_ : page_size_ * kWidestPage;
  AllocStatus status =
      new_page(wide, &page, std::max(wide, widest_borrowed), page_size_,
               wide != page_size_ ? Fallback::narrower : Fallback::none);
  if (status == AllocStatus::out_of_memory && wide != page_size_ &&
      ctx_.borrow != PoolContext::Borrow::only) {
    // Note [Wider pages]: never a failure of its own. The borrow above covered this size.
    const PoolContext::Borrow borrow = std::exchange(ctx_.borrow, PoolContext::Borrow::never);
    status = new_page(page_size_, &page);
    ctx_.borrow = borrow;
  }
  if (status != AllocStatus::ok) return status;
  widest_ = std::max(widest_, page->size);
  Slice* whole = &page->slices.front();
  free_.insert(*whole);
  *out = carve(whole, size);
  return AllocStatus::ok;
}

PoolReport SlicedPool::describe() const {
  PoolReport r;
  r.kind = kind_name();
  r.page_size = page_size_;
  r.max_slice_size = max_slice_size_;
  r.cap = cap_ ? *cap_ : 0;
  r.shape = "page=" + format_size(page_size_) + " slice<=" + format_size(max_slice_size_);
  if (cap_) r.shape += " cap=" + format_size(*cap_);
  if (page_size_ != configured_page_) r.notes = "page shrunk to the cap";
  if (widest_ > page_size_) r.notes = "pages widened up to " + format_size(widest_);
  if (dealloc_period_)
    r.notes += (r.notes.empty() ? "" : ", ") + std::string("period=") +
               std::to_string(*dealloc_period_);
  return r;
}

}  // namespace poolcuda
