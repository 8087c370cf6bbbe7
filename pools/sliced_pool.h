// The pools that carve their pages into slices. CarvedPool holds what they share: near-best fit
// from size-binned free lists, split on reserve, coalesce with free neighbours on free.
// SlicedPool: pages of one size; an optional cap bounds the bytes the pool may reserve.
// SplitPool (split_pool.h): pages sized by request. Depends on pool.h (and options.h for
// format_size) only.
#pragma once

#include "pools/pool.h"

namespace poolcuda {

class CarvedPool : public Pool {
 public:
  CarvedPool(PoolContext& ctx, std::optional<std::uint64_t> dealloc_period);
  ~CarvedPool() override;
  std::size_t free_slices() const override { return free_.size(); }
  // FreeBins::consistent(), and the split pages counted right.
  bool free_set_consistent() const override;

 protected:
  // Which end of a free slice a reservation takes: the top keeps the free part's address and
  // node; the bottom puts a page's first reservation at the page's start.
  enum class End { top, bottom };
  // Serves `size` from the free `slice`; what is left stays free.
  Slice* carve(Slice* slice, std::uint64_t size, End end = End::top);
  // Hands out the whole free `slice` for `size`: its bytes beyond the request are padding.
  Slice* take_whole(Slice* slice, std::uint64_t size);
  void on_free(Slice* slice) override;
  void on_release(Page* page) override;
  std::uint64_t largest_free() const override;
  // Bytes of the pages that hold more than one slice (live, free or waiting): pages a small
  // allocation may keep reserved whole, whatever the others in them do.
  std::uint64_t split_page_bytes() const { return split_page_bytes_; }

  FreeSet free_;

 private:
  void rekey(Slice* slice, DevicePtr ptr, std::uint64_t size);
  static bool single_slice(const Page& page) { return page.slices.size() == 1; }

  std::uint64_t split_page_bytes_ = 0;
};

// A sliced pool's growth takes a page `m` times its configured size, m a power of two up to
// kWidestPage, once the pool holds kWidenDivisor * m pages' worth, never more than a
// kWidePageShare-th of the device, and only while its shard holds less than a kWideHeldShare-th
// of the device (Note [Wider pages] in sliced_pool.cpp).
inline constexpr std::uint64_t kWidenDivisor = 4;
inline constexpr std::uint64_t kWidestPage = 8;
inline constexpr std::uint64_t kWidePageShare = 64;
inline constexpr std::uint64_t kWideHeldShare = 4;

class SlicedPool final : public CarvedPool {
 public:
  // `page_size` and the cap as configured; the page shrinks to the cap (aligned down) when the
  // cap is smaller, and a cap below the alignment never allocates.
  SlicedPool(PoolContext& ctx, std::uint64_t page_size, std::uint64_t max_slice_size,
             std::optional<std::uint64_t> cap, std::optional<std::uint64_t> dealloc_period);

  bool accepts(std::uint64_t size) const override { return size <= max_slice_size_; }
  const char* kind_name() const override { return "sliced"; }
  Slice* try_reserve(std::uint64_t size) override;
  bool pages_larger_than(std::uint64_t device_bytes) const override {
    return page_size_ > device_bytes;
  }
  Error growth_limit(std::uint64_t size) const override;
  AllocStatus grow(std::uint64_t size, Slice** out) override;
  PoolReport describe() const override;

  std::uint64_t page_size() const { return page_size_; }
  // The least a growth takes: one configured page (a wider one only where there is room).
  std::uint64_t growth_bytes(std::uint64_t) const override { return page_size_; }
  // The page the next growth asks for, within `room` bytes.
  std::uint64_t wide_page(std::uint64_t room) const;

 private:
  std::uint64_t configured_page_;
  std::uint64_t page_size_;  // effective: shrunk to the cap
  std::uint64_t max_slice_size_;
  std::uint64_t widest_ = 0;  // the widest page a growth made (Note [Wider pages])
  std::optional<std::uint64_t> cap_;
};

}  // namespace poolcuda
