// SlicedPool: pages of one size carved into slices. Near-best fit from size-binned free lists,
// split on reserve, coalesce with free neighbours on free; an optional cap bounds the bytes the
// pool may reserve. Depends on pool.h (and options.h for format_size) only.
#pragma once

#include "pools/pool.h"

namespace poolcuda {

class SlicedPool final : public Pool {
 public:
  // `page_size` and the cap as configured; the page shrinks to the cap (aligned down) when the
  // cap is smaller, and a cap below the alignment never allocates.
  SlicedPool(PoolContext& ctx, std::uint64_t page_size, std::uint64_t max_slice_size,
             std::optional<std::uint64_t> cap, std::optional<std::uint64_t> dealloc_period);
  ~SlicedPool() override;

  bool accepts(std::uint64_t size) const override { return size <= max_slice_size_; }
  const char* kind_name() const override { return "sliced"; }
  Slice* try_reserve(std::uint64_t size) override;
  Error growth_limit(std::uint64_t size) const override;
  AllocStatus grow(std::uint64_t size, Slice** out) override;
  PoolReport describe() const override;

  std::uint64_t page_size() const { return page_size_; }
  std::uint64_t growth_bytes(std::uint64_t) const override { return page_size_; }
  std::size_t free_slices() const override { return free_.size(); }
  bool free_set_consistent() const override { return free_.consistent(); }

 protected:
  void on_free(Slice* slice) override;
  void on_release(Page* page) override;
  std::uint64_t largest_free() const override;

 private:
  Slice* carve(Slice* slice, std::uint64_t size);
  void rekey(Slice* slice, DevicePtr ptr, std::uint64_t size);

  std::uint64_t configured_page_;
  std::uint64_t page_size_;  // effective: shrunk to the cap
  std::uint64_t max_slice_size_;
  std::optional<std::uint64_t> cap_;
  FreeSet free_;
};

}  // namespace poolcuda
