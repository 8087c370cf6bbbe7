// The manager's side of the thread caches: the gate that says when caches may serve, how a
// slice joins and leaves a cache, and the flushes that give parked slices back.
//
// Note [Thread caches]
// ~~~~~~~~~~~~~~~~~~~~
// Every manager call takes the manager's one lock. When two threads allocate at once, the lock
// and the pools' state move between their cores and each sleeps on the other: two threads
// together made fewer allocations per second than one. Even alone, the lock's two atomic
// operations per call were a third of a pooled pair's cost. So each thread keeps, per manager, a
// small cache of slices it was given (at most kThreadCacheSlots, of any size). When the thread
// frees one, the slice is parked in the cache, without the manager's lock; when the same thread
// next asks for exactly the same size, the parked slice is handed out again, also without it. A
// parked slice stays live in its pool and in the pointer index: the pools count it in use, and
// reports show it under "thread caches" (the program's totals, program_usage(), leave it out).
// Only an exact size is reused, so the pools' byte counters (requested, padding, the live-size
// histogram) stay exact; a request a cache serves is counted by its cache, not by the pool's
// `served`, and moves the reservation clock in batches of kThreadCacheClockBatch, so dealloc
// periods and periodic cleanups still run.
// The gate. Parking is a free whose slice is reusable at once, so caches serve only while the
// manager's own free would return a slice at once: free_fence:none, or free_fence:auto while
// the device's work is one ordered queue (Note [Stream-ordered reuse]). They also stay shut
// while a capture or persistent window is open, under persistent:enforced and size_match (those
// route every request by its size), while the manager is frozen, and under log:full (which
// traces every call). Closing the gate stores false, then takes every cache's lock and empties
// it: parked slices go back to their pools at once, as the frees that parked them would have
// done when they were made (a device that leaves ordered reuse protects such memory by its
// event F, Note [Stream-ordered reuse]), and live ones become ordinary live slices. An owner
// reads the gate under its cache's lock, so once the close returns, no owner call that saw it
// open is still running: set_stream_ordered(false) stays a barrier.
// Bad frees. A pointer parked in a cache was freed: its second free is a double free, whether
// the owner makes it (its cache finds the parked entry) or another thread does (the manager
// finds the slice, marked cached, and asks its cache). A free from another thread of a cached
// live slice takes the slice out of the cache first, then frees it as usual; live_size and
// retain see a parked slice as freed.
// Bounds. A cache parks at most thread_cache_parked_max() bytes, a 64th of the device (a free
// past that takes the manager's path; a larger slice never joins). Parked memory must never make
// the device run out or look fuller than it is, and grows it only by what busy caches keep:
// before a pool grows, the slices caches park from it go back to it, but for those the growing
// thread's own cache parked or reused since its last expiry pass (not stale): its working set,
// and taking one for a request of another size (an exclusive page serves up to twice its class)
// only made its next request of that size miss and take another, a cycle that kept a
// two-thread burst from its caches. Those go back too when the growth finds the device full,
// and for a direct pool (its reclaim bound counts them). Before a capped pool refuses or spills,
// every cache's go back; a shard that borrows another's idle pages first empties that shard's
// caches no call used since the last sweep (a busy one's pages lent away would only be
// borrowed back), and out-of-memory recovery empties every shard's, before it counts what they
// hold unused (Note [Shards]). cudaMemGetInfo counts pages that only parked slices keep as free
// (freed_page_bytes). Parked slices also go back at every explicit cleanup, in give_back_all,
// before a layout change, when the slot is needed for a newer slice, and when not reused over
// one to two expiry passes (one every kThreadCacheExpiry of the owner's requests that reach the
// manager, and one every kThreadCacheClockBatch of those its cache serves). A sweep every
// kThreadCacheSweepEvery reservations empties the caches no call used since the sweep before
// and clears the others' marks of use; implicit cleanups empty the unused ones without
// clearing marks (they come at every reservation under short periods, and clearing there made
// a busy cache look quiet), so a page a quiet thread parked still reaches its pool's period.
// When a thread exits its cache is orphaned, parked slices and all, and the next thread that
// needs a cache adopts it, so caches number at most the threads alive at once. A forked child
// never touches the pools (interpose/lifecycle.cpp), and its exiting thread leaves the caches
// alone (another thread of the parent may have held a cache's lock at the fork).
#include <algorithm>
#include <new>
#include <vector>

#include "pools/manager_impl.h"

namespace poolcuda {

void MemoryManager::Impl::update_cache_gate() {
  FreeFence mode = options.free_fence;
  if (mode == FreeFence::automatic) mode = stream_ordered ? FreeFence::none : FreeFence::events;
  const bool open = options.thread_cache && mode == FreeFence::none && capture_windows == 0 &&
                    windows == 0 && frozen == 0 &&
                    options.persistent != PersistentMode::enforced &&
                    options.persistent != PersistentMode::size_match &&
                    options.log != LogLevel::full;
  if (caches_open.exchange(open, std::memory_order_acq_rel) && !open) flush_caches(true);
}

void MemoryManager::Impl::cache_new_slice(Slice* slice, Placement placement) {
  if (!caches_open.load(std::memory_order_relaxed)) return;
  ThreadCache* cache = find_thread_cache(id);
  if (cache != nullptr && ++cache->manager_allocations % kThreadCacheExpiry == 0)
    expire_parked(*cache);
  // A slice larger than a cache may park would only take a slot from others.
  if (placement != Placement::automatic || slice->pins != 0 ||
      slice->page->pool == persistent.get() || slice->size > thread_cache_parked_max(total_memory))
    return;
  if (cache == nullptr) {
    try {
      std::shared_ptr<ThreadCache> mine;
      for (const auto& c : caches) {
        std::lock_guard hold(c->lock);
        if (!c->orphaned) continue;
        c->orphaned = false;
        mine = c;
        break;
      }
      const bool adopted = mine != nullptr;
      if (!adopted) {
        caches.reserve(caches.size() + 1);
        mine = std::make_shared<ThreadCache>(thread_cache_parked_max(total_memory),
                                             &may_have_parked);
      }
      if (!bind_thread_cache(id, mine)) {  // the thread's table is full, or it is exiting
        if (adopted) {
          std::lock_guard hold(mine->lock);
          mine->orphaned = true;
        }
        return;
      }
      if (!adopted) caches.push_back(mine);
      cache = mine.get();
    } catch (const std::bad_alloc&) {
      return;  // no cache: the manager's path serves this thread
    }
  }
  // A size seen for the first time is only remembered: random sizes cost no cache lock.
  if (!cache->seen_before(slice->requested)) return;
  ThreadCache::Entry evicted;
  {
    std::lock_guard hold(cache->lock);
    cache->used = true;
    evicted = cache->add(slice->ptr, slice, slice->requested, slice->size);
  }
  slice->cache = cache;
  if (evicted.slice == nullptr) return;
  evicted.slice->cache = nullptr;
  if (evicted.parked) retire_parked(evicted.slice, evicted.freed_in_order);
}

void MemoryManager::Impl::expire_parked(ThreadCache& cache) {
  boost::container::small_vector<std::pair<Slice*, bool>, kThreadCacheSlots> to_retire;
  {
    std::lock_guard hold(cache.lock);
    for (std::size_t i = 0; i < cache.count();) {
      ThreadCache::Entry& entry = cache.at(i);
      if (entry.parked && entry.stale) {
        to_retire.emplace_back(entry.slice, entry.freed_in_order);
        entry.slice->cache = nullptr;
        cache.remove(&entry);  // moves the last entry here
        continue;
      }
      entry.stale = entry.parked;
      ++i;
    }
  }
  for (const auto& [slice, in_order] : to_retire) retire_parked(slice, in_order);
}

void MemoryManager::Impl::sweep_caches() {
  next_cache_sweep = ctx.clock + kThreadCacheSweepEvery;
  flush_caches(false, CacheFlush::sweep);
}

std::uint64_t MemoryManager::Impl::advance_clock(std::uint64_t reservations,
                                                 ThreadCache& cache) {
  Scope scope(*this);
  tick(reservations);
  // Requests the cache serves count towards expiry too: a thread whose every request hits its
  // cache still gives back a size it stopped asking for.
  expire_parked(cache);
  return ctx.clock;
}

bool MemoryManager::Impl::uncache(Slice* slice) {
  ThreadCache* cache = slice->cache;
  std::lock_guard hold(cache->lock);
  ThreadCache::Entry* entry = cache->find(slice->ptr);
  if (entry != nullptr && entry->parked) return false;
  if (entry != nullptr) cache->remove(entry);
  slice->cache = nullptr;
  return true;
}

bool MemoryManager::Impl::parked(Slice* slice) {
  ThreadCache* cache = slice->cache;
  std::lock_guard hold(cache->lock);
  const ThreadCache::Entry* entry = cache->find(slice->ptr);
  return entry != nullptr && entry->parked;
}

std::size_t MemoryManager::Impl::flush_caches(bool unbind, CacheFlush which, const Pool* only,
                                              const ThreadCache* keep_fresh) {
  if (caches.empty()) return 0;
  boost::container::small_vector<std::pair<Slice*, bool>, kThreadCacheSlots> to_retire;
  std::size_t retired = 0;
  // Cleared first and set again at the end if anything stays parked, so an owner that parks
  // meanwhile leaves it set.
  may_have_parked.store(false, std::memory_order_relaxed);
  bool parked_left = false;
  for (const auto& cache : caches) {
    {
      std::lock_guard hold(cache->lock);
      const bool in_use = which == CacheFlush::sweep   ? std::exchange(cache->used, false)
                          : which == CacheFlush::unused ? cache->used
                                                        : false;
      for (std::size_t i = 0; !in_use && i < cache->count();) {
        ThreadCache::Entry& entry = cache->at(i);
        const bool kept = (!entry.parked && !unbind) ||
                          (only != nullptr && entry.slice->page->pool != only) ||
                          (cache.get() == keep_fresh && entry.parked && !entry.stale && !unbind);
        if (kept) {
          ++i;
          continue;
        }
        if (entry.parked) to_retire.emplace_back(entry.slice, entry.freed_in_order);
        entry.slice->cache = nullptr;
        cache->remove(&entry);  // moves the last entry here
      }
      parked_left = parked_left || cache->parked_bytes() != 0;
    }
    for (const auto& [slice, in_order] : to_retire) retire_parked(slice, in_order);
    retired += to_retire.size();
    to_retire.clear();
  }
  if (parked_left) may_have_parked.store(true, std::memory_order_relaxed);
  return retired;
}

void MemoryManager::Impl::retire_parked(Slice* slice, bool freed_in_order) {
  index.erase(slice->ptr);
  recent_frees[recent_next] = slice->ptr;
  recent_next = (recent_next + 1) % kRecentFrees;
  Pool* pool = slice->page->pool;
  pool->to_pending(slice);
  slice->freed_in_order = freed_in_order;
  pool->give_back(slice);
}

void MemoryManager::Impl::fill_cache_report(ManagerReport& r) const {
  // The program's figures and the parked bytes in one pass, each cache under its lock: its owner
  // parks and reuses without the manager's lock, and figures read in two passes counted a slice
  // parked in between both in use and parked.
  const MemoryUsage usage = program_usage(&r.thread_parked_bytes);
  r.bytes_in_use = usage.bytes_in_use;
  r.slices = usage.number_allocs;
  r.bytes_padding = usage.bytes_padding;
  r.bytes_reserved = usage.bytes_reserved;
  for (const auto& cache : caches) {
    std::lock_guard hold(cache->lock);
    ++r.thread_caches;  // an exited thread's too: it waits for the next thread
    r.thread_cache_hits += cache->hits;
  }
}

std::uint64_t MemoryManager::Impl::freed_page_bytes(bool batch_pending) const {
  std::vector<const Page*> pages;
  try {
    for (const auto& cache : caches) {
      std::lock_guard hold(cache->lock);
      for (std::size_t i = 0; i < cache->count(); ++i)
        if (cache->at(i).parked) pages.push_back(cache->at(i).slice->page);
    }
    if (batch_pending) {
      fences.for_each_batch_pending_behind_earlier_work(
          [&](const Slice* s) { pages.push_back(s->page); });
    }
  } catch (const std::bad_alloc&) {
    return 0;  // too little host memory to count them: report them used, as before the free
  }
  std::sort(pages.begin(), pages.end());
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < pages.size();) {
    std::size_t j = i;
    while (j < pages.size() && pages[j] == pages[i]) ++j;
    if (pages[i]->busy == j - i) bytes += pages[i]->size;
    i = j;
  }
  return bytes;
}

MemoryUsage MemoryManager::Impl::program_usage(std::uint64_t* parked_bytes) const {
  MemoryUsage u = usage();
  for (const auto& cache : caches) {
    std::lock_guard hold(cache->lock);
    for (std::size_t i = 0; i < cache->count(); ++i) {
      const ThreadCache::Entry& e = cache->at(i);
      if (!e.parked) continue;
      u.number_allocs -= 1;
      u.bytes_in_use -= e.requested;
      u.bytes_padding -= e.size - e.requested;
      if (parked_bytes != nullptr) *parked_bytes += e.size;
    }
  }
  return u;
}

std::uint64_t MemoryManager::Impl::parked_frees() const {
  std::uint64_t n = 0;
  for (const auto& cache : caches) n += cache->parked_frees.load(std::memory_order_relaxed);
  return n;
}

}  // namespace poolcuda
