// ExclusivePool, PersistentPool and DirectPool: one slice per page, so a free slice is a free
// page and there is nothing to split or coalesce. The free set bins pages by size (Note [Free
// bins]): a near-smallest fit is a look at one bin and a bit search, an exact fit a scan of one.
#include "pools/page_pools.h"

#include <algorithm>

#include "pools/options.h"

namespace poolcuda {

PagePool::~PagePool() { free_.clear(); }

Slice* PagePool::hand_out(Slice* slice, std::uint64_t size) {
  if (slice == nullptr) return nullptr;
  free_.erase(*slice);
  mark_live(slice, size);
  return slice;
}

Slice* PagePool::exact(std::uint64_t eff) { return free_.exact(eff); }

AllocStatus PagePool::grow_page(std::uint64_t page_size, std::uint64_t size, Slice** out,
                                std::uint64_t max_page, Fallback fallback) {
  Page* page = nullptr;
  const AllocStatus status = new_page(page_size, &page, max_page, 0, fallback);
  if (status != AllocStatus::ok) return status;
  Slice* slice = &page->slices.front();
  mark_live(slice, size);
  *out = slice;
  return AllocStatus::ok;
}

void PagePool::on_release(Page* page) { free_.erase(page->slices.front()); }

std::uint64_t PagePool::largest_free() const { return free_.largest(); }

// --- ExclusivePool -----------------------------------------------------------------------------

// Note [Exclusive pages]
// ~~~~~~~~~~~~~~~~~~~~~~
// A page holds one request, so its waste is page size minus request. New pages get the request's
// size class: the request rounded up to an eighth of its power of two, but never to more than 2 MiB
// (so at most 12.5% over for small requests and 2 MiB for large ones, the driver's own granularity
// for large allocations: a request that nearly fills the device still fits as it would without the
// pools; and should the rounded page not fit, the exact size is tried). Sizes that differ by a few
// bytes share pages. Reuse takes the smallest free page that fits (to within a bin: Note [Free
// bins]), but never one larger than twice the request's class: an idle 8 GiB scratch page must
// not serve a 100 MiB request (7.9 GiB of padding, and every further request then needs a page of
// its own while the device is full). Twice,
// not less: programs whose sizes vary from step to step (a training step's activations follow its
// sequence length) otherwise keep growing new pages beside idle ones a little too small or too
// large; a class plus a quarter left the bundled training trace at 2.55 times its live bytes, twice
// the class at 2.35, and the 64 MiB random traces went from 1.54 and 1.68 to 1.40 and 1.46.
// Padding in a live page is the one memory recovery cannot return, so it is bounded twice. Per
// page, at 1/64 of the device: a 12 GiB request on a 15 GiB idle page left a 16 GiB device 3 GiB
// short of what the plain program had. And in all: a page more than a quarter above the class is
// taken only while the pool's padding stays within 1/16 of the device, and within what the held
// bound leaves above the device's most bytes in use (15/16 of that room: (hold - 1) times them, or
// kHeldSlack for each shard if more; the device's figure is the one the held bound last saw at a
// growth, or this shard's own peak if higher): padding past that let the pages in use alone hold
// more than the bound once the program was back at its peak, and every growth passed it (random
// sizes up to 1 GiB held 1.78 times their peak on an 80 GiB device, whose 16th is 5 GiB; 1.50 with
// this, and 8% fewer driver allocations). Without the 16th, 260 MiB requests on idle 500 MiB pages
// would each waste 240 MiB, and a program filling a 16 GiB device with them after freeing thirty
// such pages would get about half of what plain CUDA gives. (A budget of 1/64 cost the 1 GiB random
// traces four times the driver allocations; 1/16 keeps the gains above.) With shards
// (Note [Shards]) each shard's pool gets its share of that budget, a 16th divided by the shards
// made so far. At the held bound a request may take a page of up to four times its class instead,
// within the same two bounds (Note [Wide reuse at the held bound] in memory_manager.cpp). A shard
// made later lowers the shares but not what the earlier ones already hold: the k-th shard can hold
// a 16th divided by k, so n shards together up to the n-th harmonic number of 16ths (a seventh of
// the device with 5 shards, the most `auto` makes). A device-wide count would close that gap. A
// page too large for every request stays idle until its dealloc period, a growth
// (Note [Growing past idle pages] in pool.cpp) or a cleanup returns it; out-of-memory recovery
// returns every idle page before it gives up, so such memory is never lost to a later request that
// needs the device.
std::uint64_t PageSizing::page_for(std::uint64_t size) const {
  const std::uint64_t alignment = ctx_.alignment;
  const std::uint64_t eff = align_up(size, alignment);
  const std::uint64_t step = std::max<std::uint64_t>(
      alignment,
      std::min<std::uint64_t>((std::uint64_t{1} << (63 - __builtin_clzll(eff))) / 8, 2 * MiB));
  return std::min(align_up(eff, step), std::max(eff, align_up(max_alloc_size_, alignment)));
}

std::uint64_t PageSizing::largest_page_for(std::uint64_t size) const {
  const std::uint64_t page = page_for(size);
  const std::uint64_t device_share = ctx_.total_memory / 64;
  return page + (device_share != 0 ? std::min(page, device_share) : page);
}

std::uint64_t PageSizing::padding_budget() const {
  std::uint64_t budget = ctx_.total_memory / 16;
  if (ctx_.hold_percent >= 100) {
    std::uint64_t peak = ctx_.totals.in_use_peak;
    if (ctx_.device_peak_in_use != nullptr)
      peak = std::max(peak, ctx_.device_peak_in_use->load(std::memory_order_relaxed));
    // The bound's room above the peak, as held_figures() sets the bound; a 16th of it is left
    // to the size classes' rounding of the pages grown later.
    const std::uint64_t room =
        std::max(peak / 100 * (ctx_.hold_percent - 100), kHeldSlack * ctx_.shares());
    budget = std::min(budget, room / 16 * 15);
  }
  return budget / ctx_.shares();
}

std::uint64_t PageSizing::largest_reusable(std::uint64_t size, std::uint64_t padding) const {
  const std::uint64_t page = page_for(size);
  const std::uint64_t quarter = page + page / 4;
  const std::uint64_t widest = largest_page_for(size);
  if (widest <= quarter) return widest;
  // Beyond a quarter above the class, only within the pool's padding budget.
  const std::uint64_t budget = padding_budget();
  const std::uint64_t room = padding < budget ? budget - padding : 0;
  return std::max(quarter, std::min(widest, size + room));
}

std::uint64_t PageSizing::largest_reusable_at_bound(std::uint64_t size,
                                                   std::uint64_t padding) const {
  const std::uint64_t page = page_for(size);
  const std::uint64_t device_share = ctx_.total_memory / 64;
  const std::uint64_t extra = page * (kWideReuseAtBound - 1);
  const std::uint64_t widest = page + (device_share != 0 ? std::min(extra, device_share) : extra);
  // The same two padding bounds as any reuse (Note [Exclusive pages]).
  const std::uint64_t budget = padding_budget();
  const std::uint64_t room = padding < budget ? budget - padding : 0;
  return std::max(largest_reusable(size, padding), std::min(widest, size + room));
}

PoolReport PageSizing::describe(const char* kind,
                                const std::optional<std::uint64_t>& period) const {
  PoolReport r;
  r.kind = kind;
  r.max_slice_size = max_alloc_size_;
  r.shape = "max=" + format_size(max_alloc_size_);
  if (period) r.notes = "period=" + std::to_string(*period);
  return r;
}

ExclusivePool::ExclusivePool(PoolContext& ctx, std::uint64_t max_alloc_size,
                             std::optional<std::uint64_t> dealloc_period)
    : PagePool(ctx, dealloc_period), sizing_(ctx, max_alloc_size) {}

Slice* ExclusivePool::try_reserve(std::uint64_t size) {
  return hand_out(
      free_.fit(align_up(size, alignment()), sizing_.largest_reusable(size, usage_.bytes_padding)),
      size);
}


Slice* ExclusivePool::try_reserve_at_bound(std::uint64_t size) {
  return hand_out(free_.fit(align_up(size, alignment()),
                            sizing_.largest_reusable_at_bound(size, usage_.bytes_padding)),
                  size);
}

AllocStatus ExclusivePool::borrow_at_bound(std::uint64_t size, Slice** out) {
  if (ctx_.borrow != PoolContext::Borrow::only) return AllocStatus::out_of_memory;
  return grow_page(sizing_.page_for(size), size, out,
                   sizing_.largest_reusable_at_bound(size, usage_.bytes_padding));
}

AllocStatus ExclusivePool::grow(std::uint64_t size, Slice** out) {
  release_stale_before_growth();
  const std::uint64_t page = sizing_.page_for(size);
  const std::uint64_t exact = align_up(size, alignment());
  // Another shard's idle page serves if this pool would take it from its own free pages.
  const AllocStatus status =
      grow_page(page, size, out, sizing_.largest_reusable(size, usage_.bytes_padding),
                page != exact ? Fallback::narrower : Fallback::none);
  if (status != AllocStatus::out_of_memory || page == exact) return status;
  return grow_page(exact, size, out);
}

PoolReport ExclusivePool::describe() const {
  return sizing_.describe(kind_name(), dealloc_period_);
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

std::uint64_t PersistentPool::free_count(std::uint64_t size) const {
  const std::uint64_t e = eff(size);
  return free_.count_exact(e);
}

AllocStatus PersistentPool::add_free(std::uint64_t size) {
  Page* page = nullptr;
  const AllocStatus status = new_page(eff(size), &page);
  if (status != AllocStatus::ok) return status;
  ++sizes_[eff(size)];
  free_.insert(page->slices.front());
  return AllocStatus::ok;
}

PoolReport PersistentPool::describe() const {
  PoolReport r;
  r.kind = kind_name();
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
  r.kind = kind_name();
  r.shape = "reclaim=" + format_size(reclaim_at_);
  return r;
}

}  // namespace poolcuda
