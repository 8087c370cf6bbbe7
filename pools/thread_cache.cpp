// ThreadCache and the thread-local table of caches (see thread_cache.h).
#include "pools/thread_cache.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <mutex>
#include <new>
#include <utility>

namespace poolcuda {

void SpinLock::lock() {
  for (;;) {
    if (!held_.exchange(true, std::memory_order_acquire)) return;
    for (int spins = 0; held_.load(std::memory_order_relaxed); ++spins) {
      if (spins >= 64) sched_yield();  // the holder may be preempted on this very core
    }
  }
}

void ThreadCache::recompute_hints() {
  std::uint64_t ptrs = 0;
  std::uint64_t sizes = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    ptrs |= bit(entries_[i].ptr);
    if (entries_[i].parked) sizes |= bit(entries_[i].requested);
  }
  ptr_hint_.store(ptrs, std::memory_order_relaxed);
  size_hint_.store(sizes, std::memory_order_relaxed);
}

DevicePtr ThreadCache::take_locked(std::uint64_t size, const std::atomic<bool>& open,
                                   bool* clock_due) {
  std::lock_guard hold(lock);
  if (!open.load(std::memory_order_relaxed)) return 0;
  used = true;
  for (std::size_t i = 0; i < count_; ++i) {
    Entry& e = entries_[i];
    if (!e.parked || e.requested != size) continue;
    e.parked = false;
    parked_bytes_ -= e.size;
    ++hits;
    if (++hits_unclocked == kThreadCacheClockBatch) {
      hits_unclocked = 0;
      *clock_due = true;
    }
    return e.ptr;
  }
  recompute_hints();
  return 0;
}

ThreadCache::Give ThreadCache::give_locked(DevicePtr ptr, const std::atomic<bool>& open,
                                           bool in_order) {
  std::lock_guard hold(lock);
  if (!open.load(std::memory_order_relaxed)) return Give::not_here;
  used = true;
  Entry* e = find(ptr);
  if (e == nullptr) {
    recompute_hints();
    return Give::not_here;
  }
  if (e->parked) return Give::double_free;
  if (parked_bytes_ + e->size > parked_max_) return Give::not_here;
  e->parked = true;
  e->stale = false;
  e->freed_in_order = in_order;
  parked_bytes_ += e->size;
  add_bit(size_hint_, e->requested);
  if (parked_flag_ != nullptr && !parked_flag_->load(std::memory_order_relaxed))
    parked_flag_->store(true, std::memory_order_relaxed);
  // Written only here, under the lock: a plain increment, not a locked one, on the hit path.
  parked_frees.store(parked_frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return Give::parked;
}

ThreadCache::Entry* ThreadCache::find(DevicePtr ptr) {
  for (std::size_t i = 0; i < count_; ++i)
    if (entries_[i].ptr == ptr) return &entries_[i];
  return nullptr;
}

ThreadCache::Entry ThreadCache::add(DevicePtr ptr, Slice* slice, std::uint64_t requested,
                                    std::uint64_t size) {
  Entry evicted;
  Entry* slot = nullptr;
  if (count_ < entries_.size()) {
    slot = &entries_[count_++];
  } else {
    // Round robin: an old entry goes, whether parked or live; a live one simply stops being
    // cached, and its free takes the manager's path.
    slot = &entries_[cursor_];
    cursor_ = (cursor_ + 1) % entries_.size();
    evicted = *slot;
    if (evicted.parked) parked_bytes_ -= evicted.size;
  }
  *slot = Entry{ptr, slice, requested, size, false};
  add_bit(ptr_hint_, ptr);
  return evicted;
}

void ThreadCache::remove(Entry* entry) {
  if (entry->parked) parked_bytes_ -= entry->size;
  *entry = entries_[--count_];  // order does not matter
  entries_[count_] = Entry{};
  if (cursor_ >= count_) cursor_ = 0;
}

void ThreadCache::clear() {
  entries_.fill(Entry{});
  count_ = 0;
  ptr_hint_.store(0, std::memory_order_relaxed);
  size_hint_.store(0, std::memory_order_relaxed);
  cursor_ = 0;
  parked_bytes_ = 0;
}

constinit __attribute__((tls_model("initial-exec"))) thread_local LastCacheLookup
    t_last_cache_lookup;

namespace {

// A thread's caches, one per manager it used (few: one manager per device). A slot whose
// manager is gone is reused. At thread exit every cache is marked orphaned, for adoption.
struct CacheTable {
  struct Slot {
    std::uint64_t manager_id = 0;
    std::shared_ptr<ThreadCache> cache;
  };
  std::array<Slot, 16> slots;  // a manager per device, and per shard of it
  pid_t process = ::getpid();  // a forked child's copy keeps its parent's

  ~CacheTable() {
    // In a child forked while another thread of the parent held a cache's lock, nobody will
    // ever release it, and the child never uses the pools: its exit leaves the caches alone.
    if (::getpid() == process) {
      for (Slot& slot : slots) {
        if (!slot.cache) continue;
        std::lock_guard hold(slot.cache->lock);
        slot.cache->orphaned = true;
      }
    }
    exiting() = true;
    t_last_cache_lookup = LastCacheLookup{};
  }
  // Trivially destructible, so still readable after the table is gone (a free from a later
  // thread-exit destructor of the program must not bind a new cache that nothing would orphan).
  static bool& exiting() {
    static thread_local bool flag __attribute__((tls_model("initial-exec"))) = false;
    return flag;
  }
};

// Note [Table without the loader]
// A thread's table is made on the heap and destroyed at thread exit by a pthread key's
// destructor, not as a thread_local object: registering such an object's destructor
// (__cxa_thread_atexit) takes the dynamic loader's lock, and a thread's first reservation may
// make its table while it holds a shard's lock. Meanwhile a dlopen holds the loader's lock while
// the new library's constructors run, and one that allocates waits for that shard's lock: both
// threads hung. A key's destructor also runs after every thread_local destructor of the
// program, so frees those make still find the thread's caches.
CacheTable*& this_thread_table() {
  static thread_local CacheTable* table __attribute__((tls_model("initial-exec"))) = nullptr;
  return table;
}

void destroy_table(void* table) {
  delete static_cast<CacheTable*>(table);
  this_thread_table() = nullptr;
}

// The calling thread's table, made on first use; nullptr when it cannot be (no memory, no key),
// and after the thread's exit began.
CacheTable* table() {
  CacheTable*& table = this_thread_table();
  if (table != nullptr || CacheTable::exiting()) return table;
  static pthread_key_t key;
  static const bool keyed = ::pthread_key_create(&key, &destroy_table) == 0;
  if (!keyed) return nullptr;
  auto* made = new (std::nothrow) CacheTable;
  if (made == nullptr) return nullptr;
  if (::pthread_setspecific(key, made) != 0) {
    delete made;
    return nullptr;
  }
  table = made;
  return table;
}

}  // namespace

ThreadCache* find_thread_cache_slow(std::uint64_t manager_id) {
  if (CacheTable::exiting()) return nullptr;
  CacheTable* const t = table();
  if (t == nullptr) return nullptr;
  ThreadCache* found = nullptr;
  for (CacheTable::Slot& slot : t->slots) {
    if (slot.manager_id != manager_id) continue;
    found = slot.cache.get();
    break;
  }
  t_last_cache_lookup = LastCacheLookup{manager_id, found};
  return found;
}

bool bind_thread_cache(std::uint64_t manager_id, std::shared_ptr<ThreadCache> cache) {
  if (CacheTable::exiting()) return false;
  CacheTable* const t = table();
  if (t == nullptr) return false;
  for (CacheTable::Slot& slot : t->slots) {
    if (slot.cache && !slot.cache->manager_gone.load(std::memory_order_acquire)) continue;
    slot.manager_id = manager_id;
    slot.cache = std::move(cache);
    t_last_cache_lookup = LastCacheLookup{manager_id, slot.cache.get()};
    return true;
  }
  return false;
}

std::uint64_t next_manager_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace poolcuda
