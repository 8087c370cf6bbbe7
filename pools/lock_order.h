// The library's lock order, written in one place, and a mutex that checks it in debug builds
// and spins a moment before it sleeps where that pays (Note [Spinning before parking]).
//
// Note [Lock order]
// ~~~~~~~~~~~~~~~~~
// A thread may take a lock only while every lock it already holds has a lower rank:
//     report -> registry -> stream order -> capture -> shards -> growth -> manager -> managed
//     -> stream table -> device -> foreign free
// report:       the reporter's serialisation of whole reports (interpose/reporter.cpp)
// registry:     creation of a device's manager (interpose/registry.cpp)
// stream order: the free_fence:auto state of every device (interpose/stream_order.cpp)
// capture:      a device's capture policy: open captures, touched sets, pins (capture/)
// shards:       a MemoryManager's device-wide state and the making of its shards (pools/)
// growth:       a MemoryManager's growths under a held bound, across its shards (Note [Held
//               memory bound] in pools/memory_manager.cpp): taken before a shard's lock, or
//               tried under it
// manager:      one shard of a MemoryManager (pools/); the hot path takes this one only
// managed:      a managed-memory slab chain's slow path
// stream table: the streams the program created (interpose/stream_table.cpp)
// device:       a CudaDevice's event and release caches (interpose/cuda_device.cpp)
// foreign free: the frees in flight that the pools do not own (interpose/foreign_frees.cpp)
// A thread cache's spin lock (pools/thread_cache.h) is outside the ranks: a leaf, taken alone by
// its owner thread or under `manager`, and nothing is taken while it is held.
// Nothing that can wait for the device (a synchronizing cudaFree, an event synchronize, a fence
// wait) runs while a lock at or below `manager` is held (Note [Outside the lock] in
// memory_manager.cpp), except that an allocation inside a capture window holds the capture
// lock across the manager's allocation, whose out-of-memory recovery may wait, bounded.
// In debug builds RankedMutex asserts the order on every acquisition, so a violation fails the
// first test that takes the locks in the wrong order instead of deadlocking once in production.
#pragma once

#include <cassert>
#include <cstdint>
#include <mutex>

namespace poolcuda {

// Note [Spinning before parking]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A shard's lock (rank `manager`) is held for a hundred nanoseconds or so per call; a thread that
// finds it held and sleeps in the kernel at once pays a futex sleep and wake, about 25 us on the
// 2-core build machine, for a wait of a fraction of a microsecond. So a thread tries it
// kManagerSpinTries times, a few pauses apart (a few microseconds in all), before it sleeps.
// Measured in docs/benchmark-results.md: two threads of a ring of mixed sizes, which share the
// first shard for the requests of its 8 MiB pages (Note [Shards]), made 5.3M pairs per second
// instead of 3.2M. Spinning alone cost memory: threads that really run at once found each other's
// shard busy when they came to borrow an idle page (Shards::borrow_page tries, it cannot wait) and
// grew new pages instead, 1.68 times the ring's live bytes instead of 1.49; trying the other
// shard's lock as long, a few pauses apart (kBorrowTries), keeps it at 1.49. A shard that is itself
// borrowing holds its own lock meanwhile, so it is passed over at once (Impl::borrowing): two
// shards that borrow from each other do not spin against each other. The lock has a cache line of
// its own, so a spinner does not take the holder's state away from it. Other ranks do not spin:
// nothing measured needs it.
inline constexpr int kManagerSpinTries = 32;
inline constexpr int kSpinPauses = 4;  // pauses between two tries

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

enum class LockRank : std::uint8_t {
  report = 0,
  registry = 1,
  stream_order = 2,
  capture = 3,
  shards = 4,
  growth = 5,
  manager = 6,
  managed = 7,
  stream_table = 8,
  device = 9,
  foreign_free = 10,
};

class RankedMutex {
 public:
  explicit RankedMutex(LockRank rank) : rank_(rank) {}
  RankedMutex(const RankedMutex&) = delete;
  RankedMutex& operator=(const RankedMutex&) = delete;

  void lock() {
    check_order();
    if (rank_ == LockRank::manager) {  // Note [Spinning before parking]
      for (int tries = 0; tries < kManagerSpinTries; ++tries) {
        if (mutex_.try_lock()) {
          mark(true);
          return;
        }
        for (int i = 0; i < kSpinPauses; ++i) cpu_relax();
      }
    }
    mutex_.lock();
    mark(true);
  }
  bool try_lock() {
    // A try-lock cannot deadlock, so it may break the order (the exit report uses one).
    if (!mutex_.try_lock()) return false;
    mark(true);
    return true;
  }
  void unlock() {
    mark(false);
    mutex_.unlock();
  }
  // A try-lock of a second lock of a rank this thread already holds (one shard's lock beside
  // another's: Note [Shards] in pools/manager_shards.cpp); released by unlock_beside(), so the
  // rank stays marked as held for the first.
  bool try_lock_beside() { return mutex_.try_lock(); }
  void unlock_beside() { mutex_.unlock(); }

 private:
#ifndef NDEBUG
  // Ranks held by this thread, one bit per rank; several locks of one rank (two managers) are
  // never held at once, so a bit is enough.
  static std::uint32_t& held() {
    static thread_local std::uint32_t bits = 0;
    return bits;
  }
  void check_order() const {
    const std::uint32_t at_or_above = ~((std::uint32_t{1} << static_cast<unsigned>(rank_)) - 1);
    assert((held() & at_or_above) == 0 && "lock order violated: see Note [Lock order]");
    (void)at_or_above;
  }
  void mark(bool locked) {
    const std::uint32_t bit = std::uint32_t{1} << static_cast<unsigned>(rank_);
    held() = locked ? held() | bit : held() & ~bit;
  }
#else
  void check_order() const {}
  void mark(bool) {}
#endif

  std::mutex mutex_;
  LockRank rank_;
};

}  // namespace poolcuda
