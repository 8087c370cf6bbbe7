// Layout resolution: turns a PoolLayout (a preset or a custom list from POOLCUDA_CONF) into the
// concrete list of dynamic pools for one device, given its total memory and alignment. Pure
// function: no Device call, no I/O. Depends on options.h only.
#pragma once

#include <cstdint>
#include <vector>

#include "pools/options.h"

namespace poolcuda {

// The resolved pools, in routing order. Every PoolSpec comes out normalised:
//  - sliced: page_size rounded up to the alignment; max_slice_size defaults to the page and is
//    never larger than it; cap and dealloc_period as given.
//  - exclusive: max_alloc_size rounded up to the alignment.
//  - direct: reclaim_at as given.
// Presets (docs/pools.md, "The default layout"):
//  - subslices: sliced pools with pages 2 MiB, 8 MiB, 32 MiB, ... (x4), each accepting slices up
//    to a quarter of its page, while 32 pages of the next size fit in the device's memory (the
//    2 MiB pool always exists); then an exclusive tail accepting anything up to the device's
//    memory, idle pages released after 10,000 reservations.
//  - exclusive: exclusive pools with max 32 KiB, 512 KiB, 8 MiB, ... (x16) below the device's
//    memory, then one up to the device's memory; pool i releases idle pages after
//    5000 * (i + 1)^2 reservations.
std::vector<PoolSpec> resolve_layout(const PoolLayout& layout, std::uint64_t total_memory,
                                     std::uint64_t alignment);

}  // namespace poolcuda
