// NodeSlab<T>: a host-side slab of fixed-size nodes with an intrusive free list. Slices and pages
// come from here, so the hot path never calls `new`: a node is recycled in O(1) and the slab only
// grows by whole chunks (amortised over kChunk nodes). Not thread-safe; the owning
// MemoryManager's lock protects it. Depends on nothing in poolcuda.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace poolcuda {

template <typename T, std::size_t kChunk = 1024>
class NodeSlab {
 public:
  NodeSlab() = default;
  NodeSlab(const NodeSlab&) = delete;
  NodeSlab& operator=(const NodeSlab&) = delete;
  ~NodeSlab() = default;  // nodes must be trivially destructible or already destroyed

  template <typename... Args>
  T* create(Args&&... args) {
    if (free_ == nullptr) grow();
    Cell* cell = free_;
    free_ = cell->next;
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

  // Drops every node at once without running destructors (forget()).
  void reset() {
    chunks_.clear();
    free_ = nullptr;
    live_ = 0;
  }

  std::size_t live() const { return live_; }

 private:
  union Cell {
    Cell* next;
    alignas(T) unsigned char bytes[sizeof(T)];
  };

  void grow() {
    auto chunk = std::make_unique<Cell[]>(kChunk);
    for (std::size_t i = kChunk; i-- > 0;) {
      chunk[i].next = free_;
      free_ = &chunk[i];
    }
    chunks_.push_back(std::move(chunk));
  }

  std::vector<std::unique_ptr<Cell[]>> chunks_;
  Cell* free_ = nullptr;
  std::size_t live_ = 0;
};

}  // namespace poolcuda
