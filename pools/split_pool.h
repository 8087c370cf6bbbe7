// SplitPool: pages sized by request and free pages taken whole as an exclusive pool takes them
// (Note [Exclusive pages] in page_pools.cpp); where an exclusive pool would grow beside a free
// page too wide for the request, a split pool splits it (Note [Split pools]). Depends on
// sliced_pool.h and page_pools.h only.
#pragma once

#include "pools/page_pools.h"
#include "pools/sliced_pool.h"

namespace poolcuda {

class SplitPool final : public CarvedPool {
 public:
  SplitPool(PoolContext& ctx, std::uint64_t max_alloc_size,
            std::optional<std::uint64_t> dealloc_period);

  bool accepts(std::uint64_t size) const override { return size <= sizing_.max_alloc_size(); }
  const char* kind_name() const override { return "split"; }
  Slice* try_reserve(std::uint64_t size) override;
  AllocStatus grow(std::uint64_t size, Slice** out) override;
  PoolReport describe() const override;
  std::uint64_t growth_bytes(std::uint64_t size) const override { return sizing_.page_for(size); }

 private:
  // Padding and split pages: the memory no release can return (Note [Split pools]).
  std::uint64_t held_back() const { return usage_.bytes_padding + split_page_bytes(); }

  PageSizing sizing_;
};

}  // namespace poolcuda
