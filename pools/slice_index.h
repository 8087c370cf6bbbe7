// SliceIndex: DevicePtr -> live Slice*, an open-addressing hash table (linear probing,
// backward-shift deletion, no tombstones, load factor <= 1/2). No node allocation: the table is
// one array that doubles when half full, so insert/find/erase are O(1) on average and a
// reservation allocates only when the table grows. Key 0 marks an empty cell (the device never
// hands out address 0). A large table lives on huge pages where the kernel has them (Note
// [Tables on huge pages] in host_tables.h). The newest entries wait in a short queue before they
// enter the table (Note [Late inserts]). Not thread-safe. Depends on pool.h for Slice and on
// host_tables.h.
//
// Note [Late inserts]
// ~~~~~~~~~~~~~~~~~~~
// With many live slices the table is far larger than the caches, and the cell a new pointer
// hashes to is a cache miss that the reservation waited for: after the slice's record, the most
// of a reservation's time (69% of its samples at a million live slices). So an insert starts
// loading the pointer's cell and puts the entry in a queue of kLate; the oldest entry enters the
// table when the queue is full, kLate reservations later, when its cell has arrived. A lookup or
// an erase reads the queue first (kLate compares in three cache lines that every reservation
// touches; a pointer freed soon after its allocation never reaches the table). The table keeps
// room for the queued entries, so that moving one in never grows it. A table that fits the
// caches (below kLateFrom cells) takes its entries at once: there the queue only cost its
// compares.
//
// Measured on the million-slice trace with the pools called directly (release build, 2-core
// Xeon, three interleaved runs each), median ns per allocation while growing to a million live
// slices 433 to 448 before, 265 to 277 after; to 100k, 204 to 252 and 197 to 208; the trace's
// median pair 682 to 684 and 601 to 615. A free+allocate step among a million live slices stayed
// where it was (672 to 688, 678 to 688): its insert's miss overlapped the next free's already,
// which waits for the index cell, the slice, its page neighbours and their free-list links in
// turn.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "pools/host_tables.h"
#include "pools/pool.h"

namespace poolcuda {

class SliceIndex {
 public:
  SliceIndex() { rehash(kInitial); }

  // Starts loading the cell where `ptr` is looked for or placed: with many live slices it is a
  // cache miss, which then overlaps the work between this call and the lookup (Note [Loads
  // started early] in pool.h). Safe without the owner's lock, while another thread may rehash:
  // it reads only the table's published address and shape, and a prefetch of an address that a
  // rehash made stale loads a useless line but never faults.
  void prefetch(DevicePtr ptr) const {
    // Integer arithmetic: the pair may be stale, and the address outside any live table.
    const Cell* cells = hint_cells_.load(std::memory_order_relaxed);
    const unsigned shift = hint_shift_.load(std::memory_order_relaxed);
    const std::uintptr_t cell = reinterpret_cast<std::uintptr_t>(cells) +
                                ((ptr * kHashMultiplier) >> shift) * sizeof(Cell);
    __builtin_prefetch(reinterpret_cast<const void*>(cell));
  }

  Slice* find(DevicePtr ptr) const {
    for (unsigned k = 0; k < late_count_; ++k) {
      const Cell& cell = late_[(late_oldest_ + k) % kLate];
      if (cell.key == ptr) return cell.slice;
    }
    for (std::size_t i = slot(ptr);; i = (i + 1) & mask_) {
      if (cells_[i].key == ptr) return cells_[i].slice;
      if (cells_[i].key == 0) return nullptr;
    }
  }

  void insert(DevicePtr ptr, Slice* slice) {
    reserve_one();
    if (capacity_ < kLateFrom) {  // the table fits the caches
      place(ptr, slice);
      ++size_;
      return;
    }
    if (late_count_ == kLate) {
      // The oldest entry: its cell was asked for kLate inserts ago (Note [Late inserts]).
      place(late_[late_oldest_].key, late_[late_oldest_].slice);
      late_[late_oldest_] = Cell{ptr, slice};
      late_oldest_ = (late_oldest_ + 1) % kLate;
    } else {
      late_[(late_oldest_ + late_count_) % kLate] = Cell{ptr, slice};
      ++late_count_;
    }
    __builtin_prefetch(&cells_[slot(ptr)]);
    ++size_;
  }

  // Makes room for one more entry now, so that the next insert() cannot throw: a reservation
  // grows the table before it takes a slice, never after (an exception then would leave a live
  // slice that no pointer finds).
  void reserve_one() {
    if ((size_ + 1) * 2 > capacity_) rehash(capacity_ * 2);
  }

  // Removes `ptr` and returns its slice, or nullptr when it is absent.
  Slice* erase(DevicePtr ptr) {
    for (unsigned k = 0; k < late_count_; ++k) {
      const unsigned at = (late_oldest_ + k) % kLate;
      if (late_[at].key != ptr) continue;
      Slice* found = late_[at].slice;
      // The newest entry takes the hole.
      const unsigned newest = (late_oldest_ + late_count_ - 1) % kLate;
      late_[at] = late_[newest];
      --late_count_;
      --size_;
      return found;
    }
    std::size_t i = slot(ptr);
    for (;; i = (i + 1) & mask_) {
      if (cells_[i].key == ptr) break;
      if (cells_[i].key == 0) return nullptr;
    }
    Slice* found = cells_[i].slice;
    // Backward shift: pull later members of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; cells_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t home = slot(cells_[j].key);
      // Move j into the hole when its home is not in (hole, j] cyclically.
      const bool between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!between) {
        cells_[hole] = cells_[j];
        hole = j;
      }
    }
    cells_[hole] = Cell{};
    --size_;
    return found;
  }

  std::size_t size() const { return size_; }

  void clear() {
    cells_ = make_cells(kInitial);  // the old table stays if this throws
    set_capacity(kInitial);
    size_ = 0;
    late_count_ = 0;
  }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (std::size_t i = 0; i < capacity_; ++i)
      if (cells_[i].key != 0) fn(cells_[i].key, cells_[i].slice);
    for (unsigned k = 0; k < late_count_; ++k) {
      const Cell& cell = late_[(late_oldest_ + k) % kLate];
      fn(cell.key, cell.slice);
    }
  }

 private:
  struct Cell {
    DevicePtr key = 0;
    Slice* slice = nullptr;
  };
  static constexpr std::size_t kInitial = 1024;
  // Note [Late inserts]: the queue's length, and the smallest table that uses it (4 MiB).
  static constexpr unsigned kLate = 8;
  static constexpr std::size_t kLateFrom = std::size_t{1} << 18;
  static constexpr std::uint64_t kHashMultiplier = 0x9E3779B97F4A7C15ull;

  std::size_t slot(DevicePtr ptr) const {
    // Fibonacci hashing: addresses are multiples of the alignment, so the high bits of the
    // product spread them; shift_ keeps exactly log2(capacity) bits.
    return static_cast<std::size_t>((ptr * kHashMultiplier) >> shift_);
  }

  void place(DevicePtr ptr, Slice* slice) {
    std::size_t i = slot(ptr);
    while (cells_[i].key != 0) i = (i + 1) & mask_;
    cells_[i] = Cell{ptr, slice};
  }

  using Cells = std::unique_ptr<Cell[], TableDeleter>;

  static Cells make_cells(std::size_t capacity) {
    Cell* cells = static_cast<Cell*>(allocate_table(capacity * sizeof(Cell)));
    std::uninitialized_value_construct_n(cells, capacity);
    return Cells(cells, TableDeleter{capacity * sizeof(Cell)});
  }

  void rehash(std::size_t capacity) {
    // The new table first: if there is no memory for it, the old one stays whole.
    Cells fresh = make_cells(capacity);
    Cells old = std::exchange(cells_, std::move(fresh));
    const std::size_t old_capacity = capacity_;
    set_capacity(capacity);
    for (std::size_t i = 0; i < old_capacity; ++i)
      if (old[i].key != 0) place(old[i].key, old[i].slice);
  }

  // Called whenever cells_ changes.
  void set_capacity(std::size_t capacity) {
    capacity_ = capacity;
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
    hint_cells_.store(cells_.get(), std::memory_order_relaxed);
    hint_shift_.store(shift_, std::memory_order_relaxed);
  }

  Cells cells_;
  std::size_t capacity_ = 0;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;  // the table's entries and the queue's
  // The newest entries, not in the table yet (Note [Late inserts]): a ring of late_count_ from
  // late_oldest_.
  Cell late_[kLate];
  unsigned late_oldest_ = 0;
  unsigned late_count_ = 0;
  // cells_ and shift_ for prefetch(), which may run without the lock. A reader may pair one
  // table's address with another's shape: that only aims a prefetch wrong.
  std::atomic<const Cell*> hint_cells_{nullptr};
  std::atomic<unsigned> hint_shift_{64 - static_cast<unsigned>(__builtin_ctzll(kInitial))};
};

// Starts loading the cell of `index` for `ptr`; nothing when `index` is null.
inline void prefetch_index_cell(const SliceIndex* index, DevicePtr ptr) {
  if (index != nullptr) index->prefetch(ptr);
}

}  // namespace poolcuda
