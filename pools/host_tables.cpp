// Large bookkeeping blocks on their own 2 MiB-aligned mappings (Note [Tables on huge pages] in
// host_tables.h), small ones on the heap.
#include "pools/host_tables.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

namespace poolcuda {

namespace {

constexpr std::size_t kTableAlignment = 64;

std::size_t mapped_bytes(std::size_t bytes) {
  return (bytes + kHugeTableBytes - 1) & ~(kHugeTableBytes - 1);
}

}  // namespace

void* allocate_table(std::size_t bytes) {
  if (bytes < kHugeTableBytes)
    return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{kTableAlignment});
  const std::size_t size = mapped_bytes(bytes);
  if (size < bytes) throw std::bad_alloc();  // wrapped around
  // One huge page more than needed, then the parts before the first 2 MiB boundary and after
  // the block are unmapped: the block starts on a boundary, so every 2 MiB of it can be one page.
  const std::size_t span = size + kHugeTableBytes;
  void* mapped = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(mapped);
  const std::uintptr_t aligned = (start + kHugeTableBytes - 1) & ~(kHugeTableBytes - 1);
  if (aligned > start) ::munmap(mapped, aligned - start);
  const std::uintptr_t end = start + span;
  if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  // A hint: refused (no transparent huge pages in this kernel) it changes nothing.
  (void)::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void free_table(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  if (bytes < kHugeTableBytes) {
    ::operator delete(block, std::align_val_t{kTableAlignment});
    return;
  }
  ::munmap(block, mapped_bytes(bytes));
}

}  // namespace poolcuda
