// FreeBins<Node>: a pool's free slices, binned by size, with a bitmap of the bins that hold any.
// Inserting, removing and resizing a slice touch its list neighbours only; finding one that fits
// looks at a few slices of one bin and searches the bitmap. Only an exact-size lookup, and a fit
// that finds nothing above its own bin, read a whole bin. A Node has `size` (bytes, > 0) and the
// links `free_prev` and `free_next`, which only this set writes. Not thread-safe: the owning
// manager's lock covers it. Depends on nothing in poolcuda.
//
// Note [Free bins]
// ~~~~~~~~~~~~~~~~
// The free set used to be a tree ordered by (size, address): best fit was one lower_bound, but
// every reserve and free walked 2·log2(n) nodes scattered over the node slab, and with many free
// fragments those walks were most of a pair's cost (a third of the pools' time on the 100k-buffer
// random trace of sizes up to 1 MiB; half at a million live slices). Here a size falls in one of
// 32 bins per power of two (sizes below 64 have a bin each), and each bin is a list, newest
// first. A request looks at the first kOwnBinScan slices of its own bin, whose sizes lie within
// 1/32 of its own but may be smaller, and takes the first that fits. Otherwise the first slice of
// the next bin up that holds any serves: everything there fits, and is at most 1/32 above the
// smallest slice there. With nothing above, the rest of the own bin is searched, so a slice that
// fits is never missed. Among equal sizes the most recently freed slice serves, not the lowest
// address. Measured on the bundled traces with the pools called directly (release build, 2-core
// Xeon), median ns per pair with the tree → with the bins: 100k buffers up to 1 MiB 530 → 261,
// a million live slices 2,500 → 1,004, 10k buffers up to 64 MiB 199 → 122, up to 1 GiB 183 → 111,
// 8 × 16 MiB then 4 × 32 MiB 89 → 77; peak reserved ÷ peak live moved by at most 0.02 on each of
// the fifteen one-thread traces of scripts/bench.
//
// Note [Unwritten bin heads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The heads of the 2,048 bins fill 16 KiB, and a pool uses a few dozen bins of them. Zeroed when
// the set was made, they were four page faults per pool, five pools per shard: on the 2-core
// virtual build machine, where a fault costs about 10 us, making a shard's pools took 170 to
// 200 us, paid by the first allocation of a process and by the thread whose reservation makes a
// new shard (Note [Shards] in manager_shards.cpp). So a head is written when its bin first gets
// a node and read only while the bitmap marks the bin (head_of()); the array sits last in the
// set, so the pages no bin has used are never touched (but the last, which the pool's members
// after the set share). Making a shard's pools then took 40 to 60 us. clear() leaves the heads
// as they are: the bitmap says none is valid.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace poolcuda {

template <typename Node>
class FreeBins {
 public:
  static constexpr int kSubBins = 32;  // bins per power of two
  static constexpr int kBins = 64 * kSubBins;
  static constexpr int kOwnBinScan = 8;

  FreeBins() = default;
  FreeBins(const FreeBins&) = delete;
  FreeBins& operator=(const FreeBins&) = delete;

  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

  void insert(Node& node) {
    const int b = bin(node.size);
    Node* head = head_of(b);
    node.free_prev = nullptr;
    node.free_next = head;
    if (head != nullptr) head->free_prev = &node;
    heads_[b] = &node;
    words_[b >> 6] |= std::uint64_t{1} << (b & 63);
    summary_ |= std::uint32_t{1} << (b >> 6);
    ++count_;
  }

  void erase(Node& node) {
    const int b = bin(node.size);
    if (node.free_prev != nullptr) {
      node.free_prev->free_next = node.free_next;
    } else {
      heads_[b] = node.free_next;
      if (node.free_next == nullptr) mark_empty(b);
    }
    if (node.free_next != nullptr) node.free_next->free_prev = node.free_prev;
    node.free_prev = node.free_next = nullptr;
    --count_;
  }

  // Gives a free node a new size (and whatever else `update` changes), moving it only when
  // its bin changes.
  template <typename Update>
  void resize(Node& node, std::uint64_t new_size, Update&& update) {
    if (bin(new_size) == bin(node.size)) {
      update(node);
      node.size = new_size;
      return;
    }
    erase(node);
    update(node);
    node.size = new_size;
    insert(node);
  }

  // A free node of `size` to `max_size` bytes, close to the smallest that fits (Note [Free
  // bins]); nullptr only when there is none.
  Node* fit(std::uint64_t size, std::uint64_t max_size = ~std::uint64_t{0}) const {
    const auto fits = [&](const Node* n) { return n->size >= size && n->size <= max_size; };
    const int own = bin(size);
    Node* n = head_of(own);
    for (int scanned = 0; n != nullptr && scanned < kOwnBinScan; n = n->free_next, ++scanned)
      if (fits(n)) return n;
    const int above = next_nonempty(own + 1);
    if (above >= 0) {
      if (heads_[above]->size <= max_size) return heads_[above];
      // The first node above is too large; a smaller one of its bin may not be (every bin
      // further up is larger still).
      for (Node* m = heads_[above]->free_next; m != nullptr; m = m->free_next)
        if (m->size <= max_size) return m;
    }
    // The rest of the own bin is the last chance: a node that fits must never be missed (the
    // pool would grow, or fail, beside it).
    for (; n != nullptr; n = n->free_next)
      if (fits(n)) return n;
    return nullptr;
  }

  // A free node of exactly `size` bytes, or nullptr.
  Node* exact(std::uint64_t size) const {
    for (Node* n = head_of(bin(size)); n != nullptr; n = n->free_next)
      if (n->size == size) return n;
    return nullptr;
  }

  // Free nodes of exactly `size` bytes.
  std::size_t count_exact(std::uint64_t size) const {
    std::size_t count = 0;
    for (Node* n = head_of(bin(size)); n != nullptr; n = n->free_next) count += n->size == size;
    return count;
  }

  // The size of the largest free node, 0 when there is none (a scan of the top bin).
  std::uint64_t largest() const {
    if (summary_ == 0) return 0;
    const int w = 31 - __builtin_clz(summary_);
    const int b = w * 64 + 63 - __builtin_clzll(words_[w]);
    std::uint64_t largest = 0;
    for (Node* n = heads_[b]; n != nullptr; n = n->free_next)
      if (n->size > largest) largest = n->size;
    return largest;
  }

  // Whether every node sits in the bin of its size with consistent links, the bitmap marks
  // exactly the bins that hold any, and the count is right (consistency checks; O(n)).
  bool consistent() const {
    std::size_t seen = 0;
    std::uint32_t summary = 0;
    for (int b = 0; b < kBins; ++b) {
      const bool marked = (words_[b >> 6] >> (b & 63)) & 1;
      if (marked && heads_[b] == nullptr) return false;
      if (words_[b >> 6] != 0) summary |= std::uint32_t{1} << (b >> 6);
      const Node* prev = nullptr;
      for (const Node* n = head_of(b); n != nullptr; prev = n, n = n->free_next) {
        if (bin(n->size) != b || n->free_prev != prev) return false;
        if (++seen > count_) return false;
      }
    }
    return seen == count_ && summary == summary_;
  }

  // Forgets every node (their nodes are dropped by their owner).
  void clear() {
    words_.fill(0);
    summary_ = 0;
    count_ = 0;
  }

  // The bin of `size`: below 64, the size itself (sizes are multiples of the alignment, so
  // these are rare); above, 32 per power of two.
  static int bin(std::uint64_t size) {
    if (size < 2 * kSubBins) return static_cast<int>(size);
    const int top = 63 - __builtin_clzll(size);  // >= 6
    const int sub = static_cast<int>((size >> (top - 5)) & (kSubBins - 1));
    return (top - 4) * kSubBins + sub;  // top 6 -> 64.., top 63 -> 1888..1919
  }

 private:
  // The first node of bin b: heads_[b] holds it only while b is marked in the bitmap, and is
  // never read otherwise (Note [Unwritten bin heads]).
  Node* head_of(int b) const {
    return (words_[b >> 6] >> (b & 63)) & 1 ? heads_[b] : nullptr;
  }

  void mark_empty(int b) {
    words_[b >> 6] &= ~(std::uint64_t{1} << (b & 63));
    if (words_[b >> 6] == 0) summary_ &= ~(std::uint32_t{1} << (b >> 6));
  }

  // The first non-empty bin at or after `from`, or -1.
  int next_nonempty(int from) const {
    if (from >= kBins) return -1;
    int w = from >> 6;
    const std::uint64_t here = words_[w] & (~std::uint64_t{0} << (from & 63));
    if (here != 0) return w * 64 + __builtin_ctzll(here);
    if (w == 31) return -1;
    const std::uint32_t later = summary_ & (~std::uint32_t{0} << (w + 1));
    if (later == 0) return -1;
    w = __builtin_ctz(later);
    return w * 64 + __builtin_ctzll(words_[w]);
  }

  std::array<std::uint64_t, kBins / 64> words_{};
  std::uint32_t summary_ = 0;
  std::size_t count_ = 0;
  // Last: the pages of a new set that no bin has used yet are never written.
  std::array<Node*, kBins> heads_;  // unwritten until used (Note [Unwritten bin heads])
};

}  // namespace poolcuda
