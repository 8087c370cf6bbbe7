// Preset ladders and normalisation of custom pool lists (layout.h documents the rules).
#include "pools/layout.h"

#include <algorithm>

namespace poolcuda {

namespace {

constexpr std::uint64_t kLadderBase = 2 * MiB;
constexpr std::uint64_t kLadderStep = 4;
constexpr std::uint64_t kSliceFraction = 4;   // a pool accepts slices up to page / 4
constexpr std::uint64_t kPagesPerDevice = 32;  // a rung exists only if 32 pages fit
// The largest sliced page. A larger page strands memory: one 40 MiB activation kept a 512 MiB
// page of a taller ladder alive, and the bundled workload peaked at 1.73 GiB reserved for
// 189 MiB in use (64 steps/s on the stand-in); stopping the ladder at 8 MiB pages and sending
// everything above 2 MiB to the exclusive tail gave 706 MiB at 149 steps/s (309 MiB under
// free_fence:sync). Large requests are few, so a page of their own costs little.
constexpr std::uint64_t kLargestPage = 8 * MiB;
constexpr std::uint64_t kTailPeriod = 10000;
constexpr std::uint64_t kBucketBase = 32 * KiB;
constexpr std::uint64_t kBucketStep = 16;

// The ladder of sliced pools, then a tail for every larger request: an exclusive pool, or with
// `split_tail` a split pool (Note [Split pools] in split_pool.cpp).
// The first rung is there whenever one of its pages fits in the device (or the device's size is
// unknown): on a smaller one it could never grow (Note [Pages larger than the device] in
// memory_manager.cpp), and the tail serves every size.
std::vector<PoolSpec> subslices(std::uint64_t total, std::uint64_t alignment, bool split_tail) {
  std::vector<PoolSpec> pools;
  for (std::uint64_t page = kLadderBase;
       page <= kLargestPage && pools.size() + 1 < kMaxPools &&
       (pools.empty() ? total == 0 || page <= total : page * kPagesPerDevice <= total);
       page *= kLadderStep) {
    PoolSpec spec;
    spec.kind = PoolKind::sliced;
    spec.page_size = align_up(page, alignment);
    spec.max_slice_size = std::min(spec.page_size, align_up(page / kSliceFraction, alignment));
    pools.push_back(spec);
  }
  PoolSpec tail;
  tail.kind = split_tail ? PoolKind::split : PoolKind::exclusive;
  tail.max_alloc_size = align_up(std::max<std::uint64_t>(total, 1), alignment);
  tail.dealloc_period = kTailPeriod;
  pools.push_back(tail);
  return pools;
}

std::vector<PoolSpec> exclusive(std::uint64_t total, std::uint64_t alignment) {
  std::vector<PoolSpec> pools;
  auto add = [&](std::uint64_t max) {
    PoolSpec spec;
    spec.kind = PoolKind::exclusive;
    spec.max_alloc_size = align_up(max, alignment);
    const std::uint64_t i = pools.size() + 1;
    spec.dealloc_period = 5000 * i * i;
    pools.push_back(spec);
  };
  for (std::uint64_t max = kBucketBase; max < total && pools.size() + 1 < kMaxPools;
       max *= kBucketStep)
    add(max);
  add(std::max<std::uint64_t>(total, 1));
  return pools;
}

PoolSpec normalise(PoolSpec spec, std::uint64_t alignment) {
  switch (spec.kind) {
    case PoolKind::sliced:
      spec.page_size = align_up(std::max<std::uint64_t>(spec.page_size, 1), alignment);
      spec.max_slice_size =
          spec.max_slice_size == 0 ? spec.page_size : std::min(spec.max_slice_size, spec.page_size);
      break;
    case PoolKind::exclusive:
    case PoolKind::split:
      spec.max_alloc_size = align_up(std::max<std::uint64_t>(spec.max_alloc_size, 1), alignment);
      break;
    case PoolKind::direct:
      break;
  }
  return spec;
}

}  // namespace

std::vector<PoolSpec> resolve_layout(const PoolLayout& layout, std::uint64_t total_memory,
                                     std::uint64_t alignment) {
  switch (layout.preset) {
    case PoolPreset::subslices:
      return subslices(total_memory, alignment, false);
    case PoolPreset::split:
      return subslices(total_memory, alignment, true);
    case PoolPreset::exclusive:
      return exclusive(total_memory, alignment);
    case PoolPreset::custom:
      break;
  }
  std::vector<PoolSpec> pools;
  for (const PoolSpec& spec : layout.custom) pools.push_back(normalise(spec, alignment));
  return pools;
}

}  // namespace poolcuda
