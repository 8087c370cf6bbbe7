// Host memory for the pools' own bookkeeping when it grows large: the slice index's table and
// the slabs' chunks of slice and page records. Depends on nothing in poolcuda.
//
// Note [Tables on huge pages]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With a million slices live, a free finds its slice through a hash table of 32 MiB and reads a
// record in 80 MiB of slab chunks: every lookup lands on a 4 KiB page the TLB no longer holds,
// and on the 2-core virtual build machine the page walk cost as much as the cache miss itself.
// Blocks of kHugeTableBytes or more therefore come from their own mapping, aligned to 2 MiB and
// marked MADV_HUGEPAGE, so the kernel backs them with transparent huge pages where it has them
// (`enabled` set to `always` or `madvise`; with `never`, or a kernel without them, they are
// ordinary pages and nothing else changes). Measured on `slices-1M` through the library: a pair
// with a million slices live went from about 1,250 to 1,000 ns in three interleaved runs. Smaller
// blocks, what a program with a few thousand allocations ever has, stay on the heap, so no
// program holds a 2 MiB page of bookkeeping it does not need.
#pragma once

#include <cstddef>

namespace poolcuda {

inline constexpr std::size_t kHugeTableBytes = std::size_t{2} << 20;

// `bytes` of host memory aligned to 64 bytes (to 2 MiB from kHugeTableBytes up), contents
// unspecified. Throws std::bad_alloc when the system has none.
void* allocate_table(std::size_t bytes);

// Gives back a block of allocate_table(bytes); nullptr is ignored.
void free_table(void* block, std::size_t bytes) noexcept;

// A unique_ptr deleter for such a block.
struct TableDeleter {
  std::size_t bytes = 0;
  void operator()(void* block) const noexcept { free_table(block, bytes); }
};

}  // namespace poolcuda
