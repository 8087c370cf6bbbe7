// The pools whose every slice is a whole page (one device allocation per slice), and the sizing
// of a page for one request that ExclusivePool shares with SplitPool (split_pool.h):
//  - PageSizing: a request's size class, and the widest free page it may take whole (Note
//    [Exclusive pages]).
//  - ExclusivePool: one request per page, pages sized by size class; reuse takes the smallest
//    free page that fits, up to a bound on the waste (Note [Exclusive pages]).
//  - PersistentPool: exact fit by effective size (align_up(size, alignment)); reuse only by the
//    same effective size; idle slices are released on explicit cleanup only.
//  - DirectPool: exact fit like the persistent pool; above `reclaim_at` reserved bytes, idle
//    allocations are released (oldest first) until the new one fits.
// Depends on pool.h (and options.h for format_size) only.
#pragma once

#include <unordered_map>

#include "pools/pool.h"

namespace poolcuda {

// How many times its size class a free page may be for a request whose growth the held bound
// would make room for (Note [Wide reuse at the held bound] in memory_manager.cpp).
inline constexpr std::uint64_t kWideReuseAtBound = 4;

// How a pool that gives a request a page of its own sizes that page, and how much wider a free
// page the request may take whole (Note [Exclusive pages]).
class PageSizing {
 public:
  PageSizing(const PoolContext& ctx, std::uint64_t max_alloc_size)
      : ctx_(ctx), max_alloc_size_(max_alloc_size) {}
  std::uint64_t max_alloc_size() const { return max_alloc_size_; }
  // The page a new request of `size` gets: its size class.
  std::uint64_t page_for(std::uint64_t size) const;
  // The largest free page a request of `size` may take.
  std::uint64_t largest_page_for(std::uint64_t size) const;
  // largest_page_for(), lowered to what a pool whose live pages hold `padding` bytes of padding
  // may still take (at least a quarter above the class): the largest page the pool reuses for
  // `size` now, its own or another shard's.
  std::uint64_t largest_reusable(std::uint64_t size, std::uint64_t padding) const;
  // The same for a request whose growth the held bound would make room for: up to
  // kWideReuseAtBound times the class, within the same padding bounds.
  std::uint64_t largest_reusable_at_bound(std::uint64_t size, std::uint64_t padding) const;
  // The padding and split-off free bytes a pool may keep in pages it cannot release: a 16th of
  // the device, shared between the shards.
  std::uint64_t padding_budget() const;
  // The report of a pool of kind `kind` that sizes its pages so.
  PoolReport describe(const char* kind, const std::optional<std::uint64_t>& period) const;

 private:
  const PoolContext& ctx_;
  std::uint64_t max_alloc_size_;
};

class PagePool : public Pool {
 public:
  using Pool::Pool;
  ~PagePool() override;
  std::size_t free_slices() const override { return free_.size(); }
  bool free_set_consistent() const override { return free_.consistent(); }

 protected:
  // Takes a page's slice out of the free set and hands it out.
  Slice* hand_out(Slice* slice, std::uint64_t size);
  // Allocates a page of `page_size` (or takes another shard's idle one of up to `max_page`) and
  // hands its slice out for `size`.
  AllocStatus grow_page(std::uint64_t page_size, std::uint64_t size, Slice** out,
                        std::uint64_t max_page = 0, Fallback fallback = Fallback::none);
  // The free slice of exactly `eff` bytes, or nullptr.
  Slice* exact(std::uint64_t eff);

  void on_free(Slice* slice) override { free_.insert(*slice); }
  void on_release(Page* page) override;
  std::uint64_t largest_free() const override;

  FreeSet free_;
};

class ExclusivePool final : public PagePool {
 public:
  ExclusivePool(PoolContext& ctx, std::uint64_t max_alloc_size,
                std::optional<std::uint64_t> dealloc_period);
  bool accepts(std::uint64_t size) const override { return size <= sizing_.max_alloc_size(); }
  const char* kind_name() const override { return "exclusive"; }
  Slice* try_reserve(std::uint64_t size) override;
  Slice* try_reserve_at_bound(std::uint64_t size) override;
  bool has_wider_free(std::uint64_t size) const override {
    return free_.largest() > sizing_.largest_reusable(size, usage_.bytes_padding);
  }
  AllocStatus borrow_at_bound(std::uint64_t size, Slice** out) override;
  AllocStatus grow(std::uint64_t size, Slice** out) override;
  PoolReport describe() const override;
  std::uint64_t growth_bytes(std::uint64_t size) const override { return sizing_.page_for(size); }

 private:
  PageSizing sizing_;
};

class PersistentPool final : public PagePool {
 public:
  explicit PersistentPool(PoolContext& ctx) : PagePool(ctx, std::nullopt) {}
  bool accepts(std::uint64_t) const override { return true; }
  const char* kind_name() const override { return "persistent"; }
  Slice* try_reserve(std::uint64_t size) override { return hand_out(exact(eff(size)), size); }
  AllocStatus grow(std::uint64_t size, Slice** out) override;
  PoolReport describe() const override;

  // Whether the pool holds a slice (live or not) of the effective size of `size`.
  bool has_size(std::uint64_t size) const;
  // Free slices of the effective size of `size`.
  std::uint64_t free_count(std::uint64_t size) const;
  // Adds one free slice of the effective size of `size` (a new page, handed to no one).
  AllocStatus add_free(std::uint64_t size);

 protected:
  void on_release(Page* page) override;

 private:
  std::uint64_t eff(std::uint64_t size) const { return align_up(size, alignment()); }
  std::unordered_map<std::uint64_t, std::uint64_t> sizes_;  // effective size -> slices held
};

class DirectPool final : public PagePool {
 public:
  DirectPool(PoolContext& ctx, std::uint64_t reclaim_at) : PagePool(ctx, std::nullopt),
      reclaim_at_(reclaim_at) {}
  bool accepts(std::uint64_t) const override { return true; }
  const char* kind_name() const override { return "direct"; }
  bool has_reclaim_bound() const override { return true; }
  Slice* try_reserve(std::uint64_t size) override {
    return hand_out(exact(align_up(size, alignment())), size);
  }
  AllocStatus grow(std::uint64_t size, Slice** out) override;
  PoolReport describe() const override;

 private:
  std::uint64_t reclaim_at_;
};

}  // namespace poolcuda
