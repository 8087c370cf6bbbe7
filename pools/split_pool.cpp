// SplitPool: whole free slices within the exclusive pool's bound, split pages beyond it within
// the pool's budget of memory no release can return.
#include "pools/split_pool.h"

namespace poolcuda {

// Note [Split pools]
// ~~~~~~~~~~~~~~~~~~
// A split pool sizes a new page for its request and takes a free page, or a free part of one,
// whole as an exclusive pool does: up to a quarter above the request's class, up to twice it
// within the padding budget (Note [Exclusive pages]). When the free slice nearest the request is
// wider still, an exclusive pool grows a page beside it; a split pool serves the request from the
// bottom of that slice and leaves the rest free for later requests. Frees merge free neighbours
// back, and a page whose slices are all free is idle again: released by its period, before a
// growth (Note [Growing past idle pages]), by a cleanup or by out-of-memory recovery, as any idle
// page. So a program whose sizes vary from step to step reuses its large pages instead of
// returning them and allocating others, and the driver sees few calls.
// What it costs. A page split once may stay reserved for as long as any one allocation in it lives,
// however small, and no release can return it meanwhile: while it holds more than one slice (live,
// free or waiting for its fence) it counts whole. Split pages and the padding of whole takes stay
// within the exclusive pool's padding budget (a 16th of the device, and 15/16 of what the held
// bound leaves above the peak in use, each shared between shards, with the gap
// Note [Exclusive pages] describes): splitting an idle page that would pass it grows a page
// instead. The rest of a page already split is always used: that holds back nothing more. So a
// program that fills the device still gets all but that 16th of what it gets without the pools, as
// under the exclusive pool. (Counting only the free rest at the time of a split let a program that
// split fifteen pages for small allocations, filled their rests with large ones and freed those,
// hold 840 MiB of a 1 GiB device for 60 MiB live.)
// From the bottom: a page's first slice starts at the page, so a large buffer on a page of its own
// keeps an IPC handle of the driver's. A slice split off above another does not start its page,
// and cudaIpcGetMemHandle refuses it (Note [IPC handles] in interpose/pooling.cpp): this is why
// the default layout ends in an exclusive pool, not a split one.
SplitPool::SplitPool(PoolContext& ctx, std::uint64_t max_alloc_size,
                     std::optional<std::uint64_t> dealloc_period)
    : CarvedPool(ctx, dealloc_period), sizing_(ctx, max_alloc_size) {}

Slice* SplitPool::try_reserve(std::uint64_t size) {
  const std::uint64_t eff = align_up(size, alignment());
  Slice* slice = free_.fit(eff);
  if (slice == nullptr) return nullptr;
  const std::uint64_t held = held_back();
  if (slice->size <= sizing_.largest_reusable(size, held)) return take_whole(slice, size);
  const Page& page = *slice->page;
  const bool splits_a_whole_page = slice->size == page.size;
  if (splits_a_whole_page && held + page.size > sizing_.padding_budget()) return nullptr;
  return carve(slice, size, End::bottom);
}

AllocStatus SplitPool::grow(std::uint64_t size, Slice** out) {
  release_stale_before_growth();
  const std::uint64_t page_size = sizing_.page_for(size);
  const std::uint64_t exact = align_up(size, alignment());
  Page* page = nullptr;
  // Another shard's idle page serves if this pool would take it whole from its own free pages.
  AllocStatus status = new_page(page_size, &page, sizing_.largest_reusable(size, held_back()), 0,
                                page_size != exact ? Fallback::narrower : Fallback::none);
  if (status == AllocStatus::out_of_memory && page_size != exact) status = new_page(exact, &page);
  if (status != AllocStatus::ok) return status;
  Slice* slice = &page->slices.front();
  mark_live(slice, size);
  *out = slice;
  return AllocStatus::ok;
}

PoolReport SplitPool::describe() const { return sizing_.describe(kind_name(), dealloc_period_); }

}  // namespace poolcuda
