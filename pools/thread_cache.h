// ThreadCache: one thread's small cache of slices of one MemoryManager, so that a thread that
// frees and allocates the same size again does both without the manager's lock (Note [Thread
// caches] in pools/manager_caches.cpp). Also the thread-local table that finds the calling
// thread's cache of a manager. The cache's own lock is a leaf: its owner takes it on every
// call, the manager (holding its own lock) takes it to flush, evict or check a slice; nothing
// else is taken while it is held. Depends on types.h only (a Slice is an opaque pointer here).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "pools/types.h"

namespace poolcuda {

struct Slice;

// Slots per cache, and the most bytes its parked (freed, not yet reused) slices may hold: a
// 64th of the device's memory, at least kThreadCacheParkedFloor (Note [Thread caches]).
inline constexpr std::size_t kThreadCacheSlots = 16;
inline constexpr std::uint64_t kThreadCacheParkedFloor = 4 * MiB;
inline constexpr std::uint64_t kThreadCacheParkedShare = 64;
inline constexpr std::uint64_t thread_cache_parked_max(std::uint64_t device_memory) {
  return device_memory / kThreadCacheParkedShare > kThreadCacheParkedFloor
             ? device_memory / kThreadCacheParkedShare
             : kThreadCacheParkedFloor;
}
inline constexpr std::uint64_t kThreadCacheExpiry = 32;
inline constexpr std::uint64_t kThreadCacheSweepEvery = 1024;
inline constexpr std::uint64_t kThreadCacheClockBatch = 64;

// A test-and-test-and-set lock: the owner takes it uncontended on every call, so it must cost
// one atomic exchange; the rare waiter is the manager flushing, and yields while it waits.
class SpinLock {
 public:
  void lock();
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

// Cache-line aligned: two threads' caches side by side must not share a line.
class alignas(64) ThreadCache {
 public:
  // `parked_flag`, when given, is set whenever a slice is parked (the manager clears it).
  explicit ThreadCache(std::uint64_t parked_max = kThreadCacheParkedFloor,
                       std::atomic<bool>* parked_flag = nullptr)
      : parked_max_(parked_max), parked_flag_(parked_flag) {}

  // One slice the cache holds: handed out to the program (live), or parked (freed by the
  // program, reusable by the owner for the same request size). The slice stays live in its pool
  // and in the manager's index either way.
  struct Entry {
    DevicePtr ptr = 0;
    Slice* slice = nullptr;  // dereferenced only by the manager, under its lock
    std::uint64_t requested = 0;
    std::uint64_t size = 0;  // the slice's size: what parking it keeps from the pools
    bool parked = false;
    bool stale = false;  // parked, and not reused since the last expiry pass
    bool freed_in_order = false;  // parked by a stream-ordered free
  };

  enum class Give : std::uint8_t { parked, double_free, not_here };

  // --- The owner thread, without the manager's lock ------------------------------------------
  // `open` is the manager's gate, read under this cache's lock: a manager that closes the gate
  // and then takes every cache's lock knows no call that saw it open is still running.

  // A parked slice of exactly `size` requested bytes, handed out again; 0 when there is none.
  // Every kThreadCacheClockBatch hits, *clock_due is set: the caller adds them to the manager's
  // reservation clock, which drives dealloc periods and periodic cleanups.
  DevicePtr take(std::uint64_t size, const std::atomic<bool>& open, bool* clock_due) {
    if ((size_hint_.load(std::memory_order_relaxed) & bit(size)) == 0) return 0;
    return take_locked(size, open, clock_due);
  }

  // Parks a slice this cache handed out. not_here: the pointer is not in this cache, or parking
  // it would pass the cache's parked_max (the manager's free path takes it then).
  // `in_order`: the free is stream-ordered (Entry::freed_in_order).
  Give give(DevicePtr ptr, const std::atomic<bool>& open, bool in_order = false) {
    if ((ptr_hint_.load(std::memory_order_relaxed) & bit(ptr)) == 0) return Give::not_here;
    return give_locked(ptr, open, in_order);
  }

  // --- The manager, holding its own lock and this cache's --------------------------------------
  SpinLock lock;
  Entry* find(DevicePtr ptr);
  // Adds a live slice; when every slot is taken, the slot at the eviction cursor is emptied
  // first and its entry is returned (slice == nullptr when none was).
  Entry add(DevicePtr ptr, Slice* slice, std::uint64_t requested, std::uint64_t size);
  void remove(Entry* entry);
  std::size_t count() const { return count_; }
  Entry& at(std::size_t i) { return entries_[i]; }
  std::uint64_t parked_bytes() const { return parked_bytes_; }
  void clear();
  // Whether `requested` went through the manager recently (it is remembered now if not): only
  // a size seen twice joins the cache, so sizes that never repeat cost no parking. The owner's
  // alone: called without the lock.
  bool seen_before(std::uint64_t requested) {
    std::uint64_t& slot = seen_[(requested * kGolden) >> (64 - kSeenBits)];
    if (slot == requested) return true;
    slot = requested;
    return false;
  }

  // The owner's allocations that took the manager's path: every kThreadCacheExpiry of them,
  // parked slices not reused since the previous pass go back (MemoryManager::Impl, under both
  // locks), so a size that stopped recurring stops holding memory and slowing lookups.
  std::uint64_t manager_allocations = 0;
  // Set by the owner's calls, cleared by the manager's sweeps: a cache no call used between two
  // sweeps gives its parked slices back.
  bool used = false;
  // The owner thread has exited; another thread may adopt the cache.
  bool orphaned = false;
  // Counters for reports, and frees parked (the manager's frees() adds them).
  std::uint64_t hits = 0;
  std::uint64_t hits_unclocked = 0;  // not yet added to the manager's clock
  std::atomic<std::uint64_t> parked_frees{0};
  // Set when the manager is destroyed: the thread-local table may reuse the slot.
  std::atomic<bool> manager_gone{false};

 private:
  static constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15u;  // a multiplicative hash
  static std::uint64_t bit(std::uint64_t key) {
    return std::uint64_t{1} << ((key * kGolden) >> 58);
  }
  // take() and give() once the hint says the cache may hold it.
  DevicePtr take_locked(std::uint64_t size, const std::atomic<bool>& open, bool* clock_due);
  Give give_locked(DevicePtr ptr, const std::atomic<bool>& open, bool in_order);
  static void add_bit(std::atomic<std::uint64_t>& hint, std::uint64_t key) {
    hint.store(hint.load(std::memory_order_relaxed) | bit(key), std::memory_order_relaxed);
  }
  void recompute_hints();

  std::array<Entry, kThreadCacheSlots> entries_{};
  std::size_t count_ = 0;
  // One bit per hashed pointer of every entry, and per hashed requested size of every parked
  // one, read by the owner without the lock: a call whose bit is clear cannot match and skips
  // the lock and the scan. Bits are set under the lock as entries come, and cleared only when
  // a scan under the lock recomputes them, so a hint holds every bit it needs (a stale extra
  // bit only costs a scan). A hint that missed one would only send the call the manager's way,
  // which handles cached slices too.
  std::atomic<std::uint64_t> ptr_hint_{0};
  std::atomic<std::uint64_t> size_hint_{0};
  std::size_t cursor_ = 0;
  std::uint64_t parked_bytes_ = 0;
  const std::uint64_t parked_max_;
  std::atomic<bool>* const parked_flag_;
  // Sizes that went through the manager, by hash: a size is remembered until another with the
  // same hash comes (one load and one compare per call; sizes that never repeat never match).
  static constexpr unsigned kSeenBits = 6;
  std::array<std::uint64_t, std::size_t{1} << kSeenBits> seen_{};
};

// The last lookup's answer, in a plain initial-exec thread-local: every manager call asks, and
// a thread almost always asks about the same manager, so the answer costs one load instead of
// a call into the dynamic loader's thread-local lookup and a scan of the table. Manager ids are
// never reused (next_manager_id), so an answer about a gone manager is never asked for again;
// bind_thread_cache() updates it, and the table's destruction clears it (id 0 is no manager's).
struct LastCacheLookup {
  std::uint64_t manager_id = 0;
  ThreadCache* cache = nullptr;
};
extern constinit __attribute__((tls_model("initial-exec"))) thread_local LastCacheLookup
    t_last_cache_lookup;
ThreadCache* find_thread_cache_slow(std::uint64_t manager_id);

// The calling thread's cache of the manager with this id, or nullptr.
inline ThreadCache* find_thread_cache(std::uint64_t manager_id) {
  if (t_last_cache_lookup.manager_id == manager_id) return t_last_cache_lookup.cache;
  return find_thread_cache_slow(manager_id);
}

// Makes `cache` the calling thread's cache of the manager with this id. False when the thread's
// table is full of live managers' caches, or the thread is exiting.
bool bind_thread_cache(std::uint64_t manager_id, std::shared_ptr<ThreadCache> cache);

// A process-wide unique id for a new manager (never reused, unlike its address).
std::uint64_t next_manager_id();

}  // namespace poolcuda
