// ManagedSlabs, the slow path: what happens under the chain's mutex when a request reaches the
// end of its slab's window (Note [Managed windows]: a spare rewound, a new spare, a wider
// window) or the current slab cannot fit it (another slab that can, an empty slab whose free
// fence passed, a new slab), and the chain's upkeep (rewinds, giving slabs back after disuse and
// on trims, forgetting them on a device reset, reports). The lock-free part and Note [Managed
// slabs] are in managed_slabs.cpp; which slabs the slow path may take (Note [Managed held
// bound]) in managed_bound.cpp.
//
// Note [Managed free fences]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A slab may rewind only once the device is done with everything freed in it. No fence is
// recorded on the free path (a fence is a driver call, and alloc/free pairs would each pay
// one). Instead, when the slow path finds a slab with nothing live and wants it back, it records
// a fence then, remembering the state word it read: that fence comes after every free the word
// counts, so once it has passed, and as long as the word is unchanged (no allocation since),
// the slab may rewind. A stale fence (the word changed) is replaced. If the fence has not passed
// yet, the slow path moves on: to another slab, else it waits for the oldest such fence at most
// kManagedFenceWaitMicros (the pools' bound: long enough for a device that merely lags, short
// enough that a stream parked by the program costs a little time and a new slab, never a
// deadlock), else to a new slab, and checks the others again next time. With
// fences off (free_fence:none) an empty slab rewinds at once. A slab is given back to the
// backing under the same condition (nothing live, fence passed), sealed first so that no
// allocation can start in it, and released after the mutex is dropped.
//
// Note [Managed windows]
// ~~~~~~~~~~~~~~~~~~~~~~
// Recycled bytes are zeroed on hand-out (Note [Managed slabs]). When a slab rewound only once
// full, a program that frees what it allocates came back to the same bytes 64 MiB later, long
// gone from the cache, and zeroing them cost more than everything else: 1 KiB pairs took 200 to
// 260 ns on the build machine, bound by its memory bandwidth. So the fast path bumps only below
// its slab's window end, and a request that crosses it takes next_window(), under the chain's
// mutex. A window is kManagedWindow, or kManagedWindowRequests of the request that opens it if
// that is more: a window's end may record a fence, which a few large requests would not repay
// (a request of 1 MiB opens a window of a whole 64 MiB slab). At a window's end:
// - with fences off, the current slab, if empty, rewinds at once;
// - else a spare of the lane's (a slab it allocated from, now no lane's current) that is empty
//   and whose free fence has passed is rewound and becomes the lane's current; the slab left
//   behind records its fence if it is empty (quiet()), to be rewound in turn a window later;
// - else, if the lane has no spare at all, a new slab becomes its current (where the held bound
//   allows one more in use, Note [Managed held bound]), and the old one is left behind as above
//   (its last live allocations may be freed meanwhile), or, if no new slab can be had, another
//   lane's spare as above;
// - else the current slab's window widens: nothing waits for a fence at a window's end.
// So a lane that frees what it allocates takes turns between two slabs, each bumping through
// one window while the other's fence passes, and rewrites the same two MiB or so while they
// are cached: 80 to 110 ns a pair on the same machine, from 200 to 260. A lane takes back its
// own spare, not another lane's: bytes another core wrote cost a transfer between caches to
// zero, and two threads made a pair cost 150 ns of CPU time instead of 90. A fence passes a
// window later as long as the device keeps up with the host; while it lags, windows widen,
// and the slab fills as before. A second spare per lane, for a fence that lags a little,
// measured no faster (it widens the span rewritten). A spare that keeps a live allocation
// keeps its lane's windows widening until it is freed: a new spare for every such window
// would let a program that leaves one long-lived allocation per MiB fill the chain.
// What a spare costs: one more real allocation per lane (address space; on a GPU, physical
// pages only where touched), charged to the budget. After a refusal (the device or the budget
// is full) or a trim (out of memory), no new spare is asked for until the disuse period has
// passed or a slab made for a full one shows the device has room: each refusal is a driver
// call, and a spare trimmed and made again at every out-of-memory would cost a synchronizing
// free each time. A lane that only cycles through windows makes no slow path, so window ends
// (all lanes') move the clock of disuse too, once per slab's worth; the slab a lane leaves
// counts as used then. A slab not larger than a window has no windows.
#include <algorithm>
#include <bit>
#include <chrono>
#include <thread>
#include <utility>

#include "pools/managed_slabs.h"
#include "pools/managed_state.h"

namespace poolcuda {

using namespace managed;

ManagedAllocation ManagedSlabs::allocate_slow(std::uint64_t size, std::uint64_t granules,
                                             std::uint32_t lane) {
  std::vector<DevicePtr> retired;
  ManagedError error;
  Admission admits(*this, size, granules, lane);  // Note [Managed held bound]
  int chosen = -1;
  std::uint64_t start = 0;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    ++tick_;
    const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
    const std::uint32_t current = current_[lane].load(std::memory_order_relaxed);
    for (const auto& other : current_) {
      const std::uint32_t i = other.load(std::memory_order_relaxed);
      if (i < used) slabs_[i].last_used = tick_;
    }
    // Another lane's current slab is used only when nothing else is left (Note [Managed lanes]).
    for (int share = 0; chosen < 0 && share < 2; ++share) {
      auto skip = [&](std::uint32_t i) { return share == 0 && current_of_other_lane(i, lane); };
      // 1. The next slab, round the chain from the lane's current one, that fits now.
      for (std::uint32_t k = 0; chosen < 0 && k < used; ++k) {
        const std::uint32_t i = (current + k) % used;
        if (!skip(i) && slabs_[i].base->load(std::memory_order_relaxed) != 0 && admits(i) &&
            try_bump(slabs_[i], granules, &start) == Fit::ok) {
          chosen = static_cast<int>(i);
        }
      }
      // 2. A slab with nothing live whose free fence has passed, rewound: the current one
      // first, so that the others can age into disuse.
      for (std::uint32_t k = 0; chosen < 0 && k < used; ++k) {
        const std::uint32_t i = (current + k) % used;
        if (skip(i) || slabs_[i].base->load(std::memory_order_relaxed) == 0 || !admits(i)) {
          continue;
        }
        if (reuse(slabs_[i], granules, &start)) chosen = static_cast<int>(i);
      }
      if (share == 1) break;
      // 3. The empty slab whose fence is the oldest, once it passes within a bounded wait (only
      // the lane's current one where the held bound takes no other).
      if (chosen < 0) {
        const int i = wait_oldest_fence(lane, admits.another());
        if (i >= 0 && try_bump(slabs_[i], granules, &start) == Fit::ok) chosen = i;
      }
      // 4. A new slab, if the held bound allows one more in use.
      if (chosen < 0 && !admits.another()) {
        error = admits.error;
      } else if (chosen < 0) {
        chosen = populate(size, &error);
        // The device has room again; but a slab made because a trim took the lane's current
        // one (sealed) says nothing against the trim's shortage.
        if (chosen >= 0 && !sealed(slabs_[current].state.load(std::memory_order_relaxed))) {
          spare_refused_ = false;
        }
        if (chosen >= 0 && try_bump(slabs_[chosen], granules, &start) != Fit::ok) chosen = -1;
      }
    }
    if (chosen >= 0) {
      open_window(slabs_[chosen], start, granules);
      slabs_[chosen].lane = lane;
      slabs_[chosen].last_used = tick_;
      current_[lane].store(static_cast<std::uint32_t>(chosen), std::memory_order_release);
    }
    collect_empty(/*disused_only=*/true, &retired);
  }
  release_all(retired);
  if (chosen < 0) return {0, error};
  return finish(slabs_[chosen], start, size);
}

bool ManagedSlabs::current_of_other_lane(std::uint32_t slot, std::uint32_t lane) const {
  for (std::uint32_t other = 0; other < kManagedLanes; ++other) {
    if (other != lane && current_[other].load(std::memory_order_relaxed) == slot) return true;
  }
  return false;
}

// Nothing live in the slab and the device is done with what was freed in it (Note [Managed free
// fences]); *state is the word that held. Records the fence when there is none for that word.
bool ManagedSlabs::quiet(Slab& slab, std::uint64_t* state) {
  const std::uint64_t now = slab.state.load(std::memory_order_acquire);
  *state = now;
  if (sealed(now) || live_of(now) != 0) return false;
  if (bump_of(now) == 0 || !options_.fences) return true;  // untouched since its last rewind
  if (slab.fence != kNoFence && slab.fence_state == now) return backing_.fence_passed(slab.fence);
  if (slab.fence != kNoFence) backing_.fence_destroy(slab.fence);
  slab.fence = backing_.fence_record();
  slab.fence_state = now;
  slab.fence_tick = tick_;
  return slab.fence != kNoFence && backing_.fence_passed(slab.fence);
}

// The bytes of the allocations started below `bump`: the recorded size at each started bit.
std::uint64_t ManagedSlabs::issued_since_rewind(const Slab& slab, std::uint64_t bump) {
  std::uint64_t bytes = 0;
  for (std::uint64_t w = 0; w < mark_words(bump); ++w) {
    // Acquire: an allocation sets its marks after its size, with release.
    std::uint64_t started = slab.marks[w].load(std::memory_order_acquire) & (kLiveBits << 1);
    for (; started != 0; started &= started - 1) {
      const std::uint64_t granule = w * kGranulesPerWord + std::countr_zero(started) / 2;
      bytes += std::uint64_t{slab.sizes[granule].load(std::memory_order_relaxed)} + 1;
    }
  }
  return bytes;
}

// Bump back to 0 if the word still reads `state` (nothing allocated since quiet() checked it).
bool ManagedSlabs::rewind(Slab& slab, std::uint64_t state) {
  if (bump_of(state) == 0) return true;
  if (!slab.state.compare_exchange_strong(state, kSealed, std::memory_order_acq_rel)) {
    return false;
  }
  // Nothing is live, so every live bit is clear already; the started bits go, counted first.
  slab.issued_before += issued_since_rewind(slab, bump_of(state));
  const std::uint64_t words = mark_words(bump_of(state));
  for (std::uint64_t w = 0; w < words; ++w) slab.marks[w].store(0, std::memory_order_relaxed);
  if (bump_of(state) > slab.dirty.load(std::memory_order_relaxed)) {
    slab.dirty.store(bump_of(state), std::memory_order_relaxed);
  }
  if (slab.fence != kNoFence) backing_.fence_destroy(slab.fence);
  slab.fence = kNoFence;
  slab.live_state = kSealed;  // its next words may repeat old ones (Note [Managed held bound])
  ++slab.resets;
  slab.window_end.store(window_granules_, std::memory_order_relaxed);
  slab.state.store(pack(0, 0), std::memory_order_release);
  return true;
}

// A slab with nothing live whose free fence has passed, rewound, takes the request: true with
// *start set.
bool ManagedSlabs::reuse(Slab& slab, std::uint64_t granules, std::uint64_t* start) {
  std::uint64_t state = 0;
  return quiet(slab, &state) && rewind(slab, state) && try_bump(slab, granules, start) == Fit::ok;
}

// Lets the fast path bump through the next window of the slab, which holds at least `granules`.
void ManagedSlabs::open_window(Slab& slab, std::uint64_t bump, std::uint64_t granules) {
  const std::uint64_t width = std::max(window_granules_, granules * kManagedWindowRequests);
  const std::uint64_t end = bump + std::min(width, slab_granules_ - bump);
  if (end > slab.window_end.load(std::memory_order_relaxed)) {
    slab.window_end.store(end, std::memory_order_relaxed);
  }
}

// The lane's current slab has no room left in its window (Note [Managed windows]).
ManagedAllocation ManagedSlabs::next_window(std::uint64_t size, std::uint64_t granules,
                                           std::uint32_t lane) {
  std::vector<DevicePtr> retired;
  Admission admits(*this, size, granules, lane);  // Note [Managed held bound]
  int chosen = -1;
  std::uint64_t start = 0;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    // The clock of disuse moves once per slab's worth of windows.
    const std::uint64_t per_tick = std::max<std::uint64_t>(1, slab_granules_ / window_granules_);
    const bool tick = ++windows_ % per_tick == 0;
    if (tick) ++tick_;
    const std::uint32_t current = current_[lane].load(std::memory_order_relaxed);
    const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
    if (current < used) {
      Slab& slab = slabs_[current];
      std::uint64_t state = 0;
      // Another thread of the lane may have moved the window on meanwhile.
      if (try_bump(slab, granules, &start, /*within_window=*/true) == Fit::ok) {
        chosen = static_cast<int>(current);
      } else if (!options_.fences && reuse(slab, granules, &start)) {
        chosen = static_cast<int>(current);
      }
      // A spare this lane left behind, then a new one, then another lane's.
      bool own_spare = false;
      auto take_spare = [&](bool own) {
        for (std::uint32_t i = 0; chosen < 0 && i < used; ++i) {
          Slab& spare = slabs_[i];
          if (i == current || (spare.lane == lane) != own || current_of_other_lane(i, lane) ||
              spare.base->load(std::memory_order_relaxed) == 0) {
            continue;
          }
          own_spare = own_spare || own;
          if (admits(i) && reuse(spare, granules, &start)) chosen = static_cast<int>(i);
        }
      };
      if (chosen < 0) take_spare(/*own=*/true);
      if (chosen < 0 && !own_spare) {
        if (!spare_refused_ || tick_ - spare_refused_tick_ > options_.disuse_period) {
          ManagedError ignored;  // without a new slab the window widens instead
          if (admits.another()) chosen = populate(size, &ignored);
          if (chosen >= 0 && try_bump(slabs_[chosen], granules, &start) != Fit::ok) chosen = -1;
          spare_refused_ = chosen < 0;
          spare_refused_tick_ = tick_;
        }
        if (chosen < 0) take_spare(/*own=*/false);
      }
      if (chosen >= 0) {
        open_window(slabs_[chosen], start, granules);
        if (chosen != static_cast<int>(current)) {
          quiet(slab, &state);  // the slab left behind records its fence, if it is empty
          slab.last_used = tick_;
          slabs_[chosen].lane = lane;
          slabs_[chosen].last_used = tick_;
          current_[lane].store(static_cast<std::uint32_t>(chosen), std::memory_order_release);
        }
      } else {
        state = slab.state.load(std::memory_order_acquire);
        if (!sealed(state)) open_window(slab, bump_of(state), granules);
        if (try_bump(slab, granules, &start) == Fit::ok) chosen = static_cast<int>(current);
      }
    }
    if (tick) collect_empty(/*disused_only=*/true, &retired);
  }
  release_all(retired);
  if (chosen < 0) return allocate_slow(size, granules, lane);
  return finish(slabs_[chosen], start, size);
}

// Waits a bounded time for the oldest fence among the empty slabs (each had quiet() record one
// for its current word) and rewinds that slab when it passed. Its index, or -1. Without
// `others`, only the lane's current slab is waited for (Note [Managed held bound]: no fence is
// waited for where no slab may be taken).
int ManagedSlabs::wait_oldest_fence(std::uint32_t lane, bool others) {
  const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
  const std::uint32_t current = current_[lane].load(std::memory_order_relaxed);
  int oldest = -1;
  for (std::uint32_t i = 0; i < used; ++i) {
    const Slab& slab = slabs_[i];
    if ((!others && i != current) || current_of_other_lane(i, lane) ||
        slab.base->load(std::memory_order_relaxed) == 0 ||
        slab.fence == kNoFence ||
        slab.fence_state != slab.state.load(std::memory_order_acquire)) {
      continue;
    }
    if (oldest < 0 || slab.fence_tick < slabs_[oldest].fence_tick) oldest = static_cast<int>(i);
  }
  if (oldest < 0 || !backing_.fence_wait_for(slabs_[oldest].fence, kManagedFenceWaitMicros)) {
    return -1;
  }
  std::uint64_t state = 0;
  return quiet(slabs_[oldest], &state) && rewind(slabs_[oldest], state) ? oldest : -1;
}

// Seals the slab for good if the word still reads `state` and queues its memory for release.
bool ManagedSlabs::retire(Slab& slab, std::uint64_t state, std::vector<DevicePtr>* retired) {
  if (!slab.state.compare_exchange_strong(state, kSealed, std::memory_order_acq_rel)) {
    return false;
  }
  if (slab.fence != kNoFence) backing_.fence_destroy(slab.fence);
  slab.fence = kNoFence;
  slab.live_state = kSealed;
  retired_issued_ += slab.issued_before + issued_since_rewind(slab, bump_of(state));
  slab.issued_before = 0;
  retired_resets_ += slab.resets;
  slab.resets = 0;
  retired->push_back(slab.base->exchange(0, std::memory_order_acq_rel));
  ++slabs_released_;
  return true;
}

void ManagedSlabs::release_all(const std::vector<DevicePtr>& retired) {
  for (DevicePtr base : retired) backing_.release_slab(base, slab_bytes_);
}

// A free record gets a new slab. -1 (and *error) when there is none. (Trimming would not help
// an out-of-memory here: a slab it could give back, step 2 of the slow path rewinds instead.)
int ManagedSlabs::populate(std::uint64_t size, ManagedError* error) {
  if (freezes_ != 0) {  // a reset is under way (Note [Managed reset])
    *error = {ManagedErrorKind::device_error, size, slab_bytes_};
    return -1;
  }
  int slot = -1;
  for (std::uint32_t i = 0; slot < 0 && i < options_.max_slabs; ++i) {
    if (slabs_[i].base->load(std::memory_order_relaxed) == 0) slot = static_cast<int>(i);
  }
  if (slot < 0) {
    *error = {ManagedErrorKind::too_large, size, options_.max_slabs * slab_bytes_};
    return -1;
  }
  // The slot's tables before the memory, each on its own: when the host has no memory for them
  // (new throws), no slab is left that nothing knows of, nor a slot with marks and no sizes.
  Slab& slab = slabs_[slot];
  const std::uint64_t words = mark_words(slab_granules_);
  if (!slab.marks) slab.marks.reset(new std::atomic<std::uint64_t>[words]);
  if (!slab.sizes) slab.sizes.reset(new std::atomic<std::uint32_t>[slab_granules_]);
  DevicePtr base = 0;
  struct BeingMade {  // seen by await_new_slab() until the base is published, or not made
    std::atomic<std::uint32_t>& count;
    explicit BeingMade(std::atomic<std::uint32_t>& c) : count(c) {
      count.fetch_add(1, std::memory_order_seq_cst);
    }
    ~BeingMade() { count.fetch_sub(1, std::memory_order_release); }
  } being_made(slabs_being_made_);
  const AllocStatus status = backing_.allocate_slab(slab_bytes_, &base);
  if (status != AllocStatus::ok) {
    *error = {status == AllocStatus::out_of_memory ? ManagedErrorKind::out_of_memory
                                                   : ManagedErrorKind::device_error,
              size, slab_bytes_};
    return -1;
  }
  for (std::uint64_t w = 0; w < words; ++w) slab.marks[w].store(0, std::memory_order_relaxed);
  slab.dirty.store(0, std::memory_order_relaxed);  // a fresh slab reads as zero
  slab.window_end.store(window_granules_, std::memory_order_relaxed);
  slab.fence = kNoFence;
  slab.resets = 0;
  slab.live_state = kSealed;
  slab.base->store(base, std::memory_order_release);
  slab.state.store(pack(0, 0), std::memory_order_release);
  if (static_cast<std::uint32_t>(slot) >= used_slots_.load(std::memory_order_relaxed)) {
    used_slots_.store(static_cast<std::uint32_t>(slot) + 1, std::memory_order_release);
  }
  ++slabs_allocated_;
  return slot;
}

// Seals every slab that holds nothing live and whose fence has passed. With disused_only, only
// those unused for longer than the disuse period, and never a lane's current one; without it
// (a trim), a lane's current slab too, since a program that freed all its managed memory must
// get it back as plain CUDA would (the lane's next allocation finds it sealed and takes the
// slow path), and a lagging fence is waited for within `bound`.
std::uint32_t ManagedSlabs::collect_empty(bool disused_only, std::vector<DevicePtr>* retired,
                                          WaitBound* bound) {
  const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
  std::uint32_t count = 0;
  for (std::uint32_t i = 0; i < used; ++i) {
    Slab& slab = slabs_[i];
    if ((disused_only && current_of_other_lane(i, kManagedLanes)) ||
        slab.base->load(std::memory_order_relaxed) == 0) {
      continue;
    }
    if (disused_only && tick_ - slab.last_used <= options_.disuse_period) continue;
    std::uint64_t state = 0;
    bool ready = quiet(slab, &state);
    // A trim (the device is out of memory, or it was asked for) waits for a fence that lags,
    // as the real cudaFree would have waited for the device; bounded, since a stream parked on a
    // host function holds the fence back and only the waiting thread may be the one to lift it.
    if (!ready && !disused_only && bound != nullptr && slab.fence != kNoFence &&
        slab.fence_state == state) {
      // Again after a stop (Note [Stopped processes]).
      if (bound->retry([&] { return backing_.fence_wait_for(slab.fence, bound->left_micros()); }))
        ready = quiet(slab, &state);
    }
    if (ready && retire(slab, state, retired)) ++count;
  }
  return count;
}

std::uint32_t ManagedSlabs::rewind_empty() {
  std::lock_guard<std::mutex> hold(mutex_);
  std::uint32_t count = 0;
  const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < used; ++i) {
    std::uint64_t state = 0;
    if (slabs_[i].base->load(std::memory_order_relaxed) == 0 || !quiet(slabs_[i], &state)) {
      continue;
    }
    if (bump_of(state) != 0 && rewind(slabs_[i], state)) ++count;
  }
  return count;
}

std::uint64_t ManagedSlabs::empty_bytes() const {
  const std::uint32_t used = used_slots_.load(std::memory_order_acquire);
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < used; ++i) {
    const std::uint64_t state = slabs_[i].state.load(std::memory_order_acquire);
    if (slabs_[i].base->load(std::memory_order_relaxed) != 0 && !sealed(state) &&
        live_of(state) == 0) {
      bytes += slab_bytes_;
    }
  }
  return bytes;
}

std::uint32_t ManagedSlabs::trim(WaitBound& bound) {
  std::vector<DevicePtr> retired;
  std::uint32_t count = 0;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    // The device is short of memory: no new spare for a while (Note [Managed windows]).
    spare_refused_ = true;
    spare_refused_tick_ = tick_;
    count = collect_empty(/*disused_only=*/false, &retired, &bound);
  }
  release_all(retired);
  return count;
}

// Note [Managed reset]
// A reset frees every slab's memory at once, while other threads may be inside an allocation
// (plain programs survive that: Note [Device reset] in interpose/pooling.cpp). An allocation
// whose swap succeeded before the seal still reads the slab's base and zeroes recycled bytes
// (finish()); had the reset unmapped them meanwhile, that write would fault. So forget() seals
// every slab and points every lane at none, then, without the lock (a sealed lane takes the slow
// path, which needs it), waits until every allocation that had started is done. Each counts
// itself in its lane's gate from its first load to its return, under the parity of the forget
// epoch it read (and read again after counting itself, so that it never counts under an epoch
// already over). forget() moves the epoch on and waits for the old parity only: waiting for
// every allocation would never end while threads keep allocating. One that entered under the
// new epoch did so after the seal and the move (all sequentially consistent), so its swap sees
// the seal and it writes nothing; one whose swap won before the seal counted itself first, and
// the seal's exchange, reading its swap, makes that count visible to the wait. Only then are
// the bases cleared and the memory left to the reset. While frozen (from before the first
// forget() to the last thaw()), no slab is made: a slab made just before the reset would be gone
// after it, and one made after it while a free from before it is still on its way to the driver
// could be at that free's stale address (Note [Foreign frees] in interpose/foreign_frees.cpp).
void ManagedSlabs::forget() {
  std::vector<std::pair<std::uint32_t, std::uint64_t>> sealed_now;
  {
    std::lock_guard<std::mutex> hold(mutex_);
    spare_refused_ = false;
    const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < used; ++i) {
      if (slabs_[i].base->load(std::memory_order_relaxed) == 0) continue;
      sealed_now.emplace_back(i, slabs_[i].state.exchange(kSealed, std::memory_order_seq_cst));
    }
    for (auto& lane : current_) lane.store(options_.max_slabs, std::memory_order_seq_cst);
  }
  const std::uint32_t old_parity = forget_epoch_.fetch_add(1, std::memory_order_seq_cst) & 1;
  for (const LaneGate& gate : gates_) {
    while (gate.in_flight[old_parity].load(std::memory_order_seq_cst) != 0) {
      std::this_thread::yield();
    }
  }
  std::lock_guard<std::mutex> hold(mutex_);
  for (const auto& [i, state] : sealed_now) {
    Slab& slab = slabs_[i];
    if (slab.fence != kNoFence) backing_.fence_destroy(slab.fence);
    slab.fence = kNoFence;
    slab.live_state = kSealed;
    retired_issued_ +=
        slab.issued_before + (sealed(state) ? 0 : issued_since_rewind(slab, bump_of(state)));
    slab.issued_before = 0;
    retired_resets_ += slab.resets;
    slab.resets = 0;
    slab.base->store(0, std::memory_order_release);
  }
}

void ManagedSlabs::freeze() {
  std::lock_guard<std::mutex> hold(mutex_);
  ++freezes_;
}

void ManagedSlabs::thaw() {
  std::lock_guard<std::mutex> hold(mutex_);
  if (freezes_ > 0) --freezes_;
}

void ManagedSlabs::await_new_slab() const {
  while (slabs_being_made_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

ManagedReport ManagedSlabs::report() const {
  std::lock_guard<std::mutex> hold(mutex_);
  ManagedReport out;
  out.slab_size = slab_bytes_;
  out.max_slabs = options_.max_slabs;
  out.issued_total = retired_issued_;
  out.resets = retired_resets_;
  out.slabs_allocated = slabs_allocated_;
  out.slabs_released = slabs_released_;
  const std::uint32_t used = used_slots_.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < used; ++i) {
    const Slab& slab = slabs_[i];
    ManagedSlabReport row;
    row.base = slab.base->load(std::memory_order_acquire);
    if (row.base == 0) continue;
    const std::uint64_t state = slab.state.load(std::memory_order_acquire);
    row.capacity = slab_bytes_;
    row.bump = sealed(state) ? 0 : bump_of(state) * granule_;
    row.live = sealed(state) ? 0 : live_of(state);
    row.dirty = slab.dirty.load(std::memory_order_relaxed) * granule_;
    row.issued =
        slab.issued_before + (sealed(state) ? 0 : issued_since_rewind(slab, bump_of(state)));
    row.resets = slab.resets;
    out.live_allocations += row.live;
    out.issued_total += row.issued;
    out.resets += row.resets;
    out.slabs.push_back(row);
  }
  return out;
}

}  // namespace poolcuda
