// NodeSlab<T>: a host-side slab of fixed-size nodes with an intrusive free list. Slices and pages
// come from here, so the hot path never calls `new`: a node is recycled in O(1) and the slab only
// grows by whole chunks: kChunk nodes first, each chunk twice the last until one is a huge page
// (Note [Tables on huge pages] in host_tables.h), then huge pages. A chunk's nodes are handed out
// in address order the first time, so a chunk's memory is first written when its nodes are
// first used: a new chunk costs no pass over all of it (on the first allocation of a process or
// of a shard, the first chunks' page faults were a third of its cost). Not thread-safe; the owning
// MemoryManager's lock protects it. Depends on host_tables.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "pools/host_tables.h"

namespace poolcuda {

template <typename T, std::size_t kChunk = 1024>
class NodeSlab {
  static_assert(alignof(T) <= 64, "chunks come from allocate_table(), aligned to 64 bytes");

 public:
  NodeSlab() = default;
  NodeSlab(const NodeSlab&) = delete;
  NodeSlab& operator=(const NodeSlab&) = delete;
  ~NodeSlab() = default;  // nodes must be trivially destructible or already destroyed

  template <typename... Args>
  T* create(Args&&... args) {
    Cell* cell = free_;
    if (cell != nullptr) {
      free_ = cell->next;
    } else {
      if (unused_ == unused_end_) grow();
      cell = unused_++;
    }
    ++live_;
    return ::new (static_cast<void*>(cell->bytes)) T(std::forward<Args>(args)...);
  }

  void destroy(T* node) {
    node->~T();
    Cell* cell = reinterpret_cast<Cell*>(node);
    cell->next = free_;
    free_ = cell;
    --live_;
  }

  // Makes the first chunk now, with the page of its first node written, when there is none: a
  // manager's pools are built ahead of its first reservation (Note [Pools made ahead] in
  // interpose/registry.cpp), which then finds its first nodes ready.
  void make_first_chunk() {
    if (!chunks_.empty()) return;
    grow();
    unused_->next = nullptr;
  }

  // Drops every node at once without running destructors (forget()).
  void reset() {
    chunks_.clear();
    free_ = nullptr;
    unused_ = unused_end_ = nullptr;
    live_ = 0;
  }

  std::size_t live() const { return live_; }
  std::size_t chunks() const { return chunks_.size(); }

 private:
  union Cell {
    Cell* next;
    alignas(T) unsigned char bytes[sizeof(T)];
  };

  void grow() {
    // Bytes, not nodes, reach the huge-page size: a chunk of exactly kHugeTableBytes fills its
    // page (the last few bytes may hold no whole node).
    const std::size_t last = chunks_.empty() ? 0 : chunks_.back().get_deleter().bytes;
    const std::size_t bytes =
        last == 0 ? kChunk * sizeof(Cell) : std::max(std::min(2 * last, kHugeTableBytes), last);
    const std::size_t count = bytes / sizeof(Cell);
    chunks_.reserve(chunks_.size() + 1);  // so that push_back cannot throw and leak the chunk
    Chunk chunk(static_cast<Cell*>(allocate_table(bytes)), TableDeleter{bytes});
    unused_ = chunk.get();
    unused_end_ = unused_ + count;
    chunks_.push_back(std::move(chunk));
  }

  using Chunk = std::unique_ptr<Cell, TableDeleter>;
  std::vector<Chunk> chunks_;
  Cell* free_ = nullptr;  // nodes destroyed, to be reused first
  // The newest chunk's nodes never handed out: [unused_, unused_end_).
  Cell* unused_ = nullptr;
  Cell* unused_end_ = nullptr;
  std::size_t live_ = 0;
};

}  // namespace poolcuda
