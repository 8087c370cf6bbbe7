// The MemoryManager's shards: the array of per-shard states (MemoryManager::Impl), the gate
// that says when a reservation may use a shard other than the first, the device-wide state a
// shard made later must start from, and which shard the calling thread calls home (Note
// [Shards] in manager_shards.cpp). Not a public header: only the manager's own files include
// it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <vector>

#include "pools/manager_impl.h"

namespace poolcuda {

// A shard's reservation clock is shared with the others each time it crosses a multiple of
// this many reservations (Note [Shards]: dealloc periods of a shard no thread uses any more).
inline constexpr std::uint64_t kShardClockSync = 4096;

// Each shard publishes its bytes in use every kShardPublishEvery reservations (and at every
// unlock once there are other shards), and the shards' plan (which requests a thread's own
// shard may serve) is redone every kShardPlanEvery.
inline constexpr std::uint64_t kShardPublishEvery = 64;
inline constexpr std::uint64_t kShardPlanEvery = 256;

// A sliced pool's request may come from the calling thread's own shard only when the pool's
// pages are at most the most bytes the device has had in use divided by kShardPageShare, or at
// most the device's memory divided by kShardDeviceShare: every shard holds a partly used page of
// each sliced pool it serves, and that cost stays a small share of the peak, or of the device
// (Note [Shards]).
inline constexpr std::uint64_t kShardPageShare = 32;
inline constexpr std::uint64_t kShardDeviceShare = 1024;

// How many times a shard that needs a page tries another shard's lock for an idle one, a few
// pauses apart (Note [Spinning before parking] in pools/lock_order.h).
inline constexpr int kBorrowTries = kManagerSpinTries;

// A reservation is shared when another thread reserved from the shard since the calling
// thread's previous reservation there. A thread moves to another shard at a shared reservation
// that comes within kShardWindow of its own reservations after another shared one. Threads that
// share a lock run in turns of a few calls each, so two busy threads part within a few turns;
// a thread that reserves now and then beside a busy one moves itself after two calls past its
// settling (kShardSettle), and the busy one, which sees it rarely, stays.
inline constexpr std::uint32_t kShardWindow = 16;

// A thread's first reservations in its home neither move it nor count as sharing for the
// others (Note [Shards]).
inline constexpr std::uint32_t kShardSettle = 8;

// Whether a layout has a capped pool.
bool layout_capped(const PoolLayout& layout);

// The calling thread's home shard (the same index for every manager), and how many of its
// reservations since the last one that found another thread's before it (kShardWindow: none
// lately). Its address tells the thread from the others.
struct ShardHome {
  std::uint32_t index = 0;
  std::uint32_t since_shared = kShardWindow;
  std::uint32_t settling = 0;  // its reservations in its home so far, up to kShardSettle
  std::uint64_t serial = 0;  // thread_serial(), 0 until asked
};

// A number no other thread of the process had or will have (a thread-local's address may be a
// later thread's: glibc reuses exited threads' stacks).
inline std::uint64_t thread_serial(ShardHome& home) {
  static std::atomic<std::uint64_t> next{1};
  if (home.serial == 0) home.serial = next.fetch_add(1, std::memory_order_relaxed);
  return home.serial;
}

// Marks the thread of the fence lanes where stream-ordered frees of pinned slices wait once their
// pins go, one per freeing thread and stream (Note [Stream-ordered frees of pinned slices] in
// manager_api.cpp): no thread's serial has it.
inline constexpr std::uint64_t kReleasedHolds = std::uint64_t{1} << 63;

// The calling thread's ShardHome: one thread-local lookup, done once per call. Initial-exec:
// the library is loaded with the program (LD_PRELOAD), so these few bytes sit in the static
// thread-local block and cost no __tls_get_addr call.
inline ShardHome& this_thread_home() {
  static thread_local ShardHome home __attribute__((tls_model("initial-exec")));
  return home;
}

struct MemoryManager::Shards {
  Shards(Device& d, const ManagerOptions& o);

  // The shards made so far; never fewer than one, never destroyed before the manager.
  std::uint32_t count() const { return made.load(std::memory_order_acquire); }
  Impl& at(std::uint32_t k) const { return *shard[k]; }
  template <class F>
  void each(F&& f) const {
    const std::uint32_t n = count();
    for (std::uint32_t k = 0; k < n; ++k) f(*shard[k]);
  }
  // f for every shard made but the k-th.
  template <class F>
  void others(std::uint32_t k, F&& f) const {
    const std::uint32_t n = count();
    for (std::uint32_t j = 0; j < n; ++j)
      if (j != k) f(*shard[j]);
  }
  // The nesting count of a kind of window (persistent windows, captures) opens (`open`) or
  // closes one; the gate is held while any is open. False when closing with none open.
  bool nest(std::uint32_t& windows_open, bool open) {
    if (open) {
      if (windows_open++ == 0) hold_gate(+1);
    } else if (windows_open > 0) {
      if (--windows_open == 0) hold_gate(-1);
    } else {
      return false;
    }
    return true;
  }

  // Whether the line of Note [Pages larger than the device] for pool `index` of the layout is
  // still to be written for the device: true once per layout.
  bool first_page_warning(std::size_t index) {
    const std::uint64_t bit = index < 64 ? std::uint64_t{1} << index : 0;
    return bit == 0 || (page_warnings.fetch_or(bit, std::memory_order_relaxed) & bit) == 0;
  }
  std::atomic<std::uint64_t> page_warnings{0};  // per pool of the layout, its line was written

  // MemoryManager::allocate with more than one shard possible (manager_api.cpp).
  Reservation allocate(std::uint64_t size, Placement placement);
  // The shard a reservation of thread `t` tries first.
  std::uint32_t home(const ShardHome& t) const {
    const std::uint32_t n = count();
    return t.index < n ? t.index : t.index % n;
  }
  // Records whether another thread reserved from shard k since thread t's previous reservation
  // there; at the second such reservation within kShardWindow, t moves to a later shard, made
  // here if it is new.
  void note_sharing(ShardHome& t, std::uint32_t k, bool shared);
  // Makes shards until there are n; false when none may be made now (the gate is closed, or
  // another thread holds `control`) or memory ran out.
  bool make_shards(std::uint32_t n);
  // Closes (delta > 0) or reopens (delta < 0) the gate for one more or one fewer reason; a
  // close returns only once no reservation that saw the gate open still holds a later shard's
  // lock (one waiting with the lock released checks again before it keeps its slice).
  void hold_gate(int delta);
  // Redoes the plan: sharded_max, from the layout's pools and the most bytes the shards' last
  // published figures have added up to.
  void plan();
  // sharded_max from planned_peak and the device's memory (kShardPageShare, kShardDeviceShare);
  // under `control`, or before the manager is shared.
  void set_sharded_max();
  // Shards other than `k` whose reservation clock is behind `clock` catch up with it, and run
  // the implicit cleanups that come due.
  void sync_clocks(std::uint32_t k, std::uint64_t clock);
  // The shard a pin was taken in, or nullptr for an empty pin.
  Impl* pinned(const RetainedSlice& pin) const {
    return pin && pin.shard < count() ? shard[pin.shard].get() : nullptr;
  }
  // PoolContext::borrow_page of every shard (`owner` is the shard): another shard's idle page
  // of `min_size` to `max_size` bytes, taken without a device call, when one is not busy and
  // has one.
  static bool borrow_page(void* owner, std::uint64_t min_size, std::uint64_t max_size,
                          DevicePtr* base, std::uint64_t* size);
  // Bytes the shards other than k last published as reserved for no request.
  std::uint64_t unused_elsewhere(std::uint32_t k) const;
  // The device's bytes reserved (room claimed by reservations under way included) and most
  // bytes in use, for shard k, which holds `reserved` and has `in_use` in use (Note [Held
  // memory bound]).
  struct Held {
    std::uint64_t reserved = 0;
    std::uint64_t peak_in_use = 0;
  };
  Held held(std::uint32_t k, std::uint64_t reserved, std::uint64_t in_use);
  // A growth for the held bound succeeded with `in_use` bytes in use on the device.
  void note_held_peak(std::uint64_t in_use);
  // Shard k has `in_use` bytes in use: with the other shards' published figures, the device's
  // peak in use goes up to their sum (Note [Device peaks]).
  void note_device_peaks(std::uint32_t k, std::uint64_t in_use);
  // Whether a shard other than k last published idle pages.
  bool idle_elsewhere(std::uint32_t k) const;
  // The shards other than k, each under its own lock (shard k's is not held), release idle
  // pages (Impl::release_fitting_idle) until `bytes` are released in all, skipping shards frozen
  // or in a capture window. Returns bytes released.
  std::uint64_t release_idle_elsewhere(std::uint32_t k, std::uint64_t bytes);
  // Out-of-memory in shard k: the other shards' thread caches give back their parked slices,
  // so that what those shards hold unused counts them. True when they gave some.
  bool unpark_others(std::uint32_t k);
  // Then the other shards take back their parked slices and what passed fences returned, so that
  // pages of it can be lent (borrow_page) before any goes to the driver. True when they took some.
  bool reap_others(std::uint32_t k);
  // Then they give back their idle pages and parked slices, without waiting for anything. True
  // when they gave some.
  bool trim_others(std::uint32_t k);
  // Then their memory waiting on fences: waits for their oldest fences within `bound` (a
  // slice each at most while stream-ordered frees wait); what came free stays in their pools,
  // to be lent. True when a fence passed or a slice ran out: route again, trim, call again.
  bool drain_others(std::uint32_t k, WaitBound& bound);

  Device& device;
  ManagerOptions options;  // its layout: the one installed last (under `control`)
  const std::uint32_t limit;  // the most shards this manager makes
  std::array<std::unique_ptr<Impl>, kMaxShards> shard;
  std::atomic<std::uint32_t> made{1};
  std::atomic<std::uint32_t> moves{0};  // threads moved so far: each move takes the next shard
  std::atomic<std::uint64_t> pages_moved{0};  // idle pages lent from one shard to another
  // Out-of-memory recoveries under way in any shard (Note [Growth during a recovery]).
  std::atomic<std::uint32_t> recovering{0};
  // The most bytes in use on the device at a growth for the held bound (note_held_peak); reset
  // with the layout and the device's memory.
  std::atomic<std::uint64_t> held_peak{0};
  // The device's peak in use sampled since a second shard was made (note_device_peaks), and its
  // pages' bytes now and at their peak, exact; the peaks start over with the layout and the
  // device's memory, as the shards' own do.
  std::atomic<std::uint64_t> device_in_use_peak{0};
  DeviceReserved device_reserved;
  // Room reservations under way claimed while other shards released pages for them.
  std::atomic<std::uint64_t> held_claims{0};
  // Held from a growth's check against the held bound to the growth's end, so that two shards
  // do not both grow into the same room (Note [Held memory bound]). Taken before a shard's lock,
  // or tried under it.
  RankedMutex growth_gate{LockRank::growth};
  // Bytes on their way to the driver when a recovery's flush last ran out, 0 when none (cleared
  // by a flush that completes): while that is still all there is on the way, no shard's
  // recovery flushes, so a parked stream costs the device's recoveries its bound once, not once
  // per shard.
  std::atomic<std::uint64_t> flush_stuck_releasing{0};
  // A thread's own shard serves requests up to sharded_max (pools whose pages are small next to
  // the most bytes in use or to the device) and above sharded_above (pools with a page per
  // request); the others come from the first shard (Note [Shards]).
  std::atomic<std::uint64_t> sharded_max{0};
  std::atomic<std::uint64_t> sharded_above{std::numeric_limits<std::uint64_t>::max()};
  // The layout's dynamic pools in routing order: the largest request each accepts and its page
  // size (0: each page is sized by its request). Under `control`.
  struct PlannedPool {
    std::uint64_t max_request = 0;
    std::uint64_t page = 0;
  };
  std::vector<PlannedPool> pools_plan;
  // The most bytes in use plan() saw since the layout was installed or forget(); under
  // `control`.
  std::uint64_t planned_peak = 0;
  // Lays out pools_plan and sharded_above for `layout`.
  void plan_layout(const PoolLayout& layout);
  // Reservations may use shards other than the first; read under the later shard's lock.
  std::atomic<bool> open{true};
  // Serialises changes of the device-wide state below, and the making of shards, so that a new
  // shard starts from that state and no change misses it.
  mutable RankedMutex control{LockRank::shards};
  std::uint32_t gate_holds = 0;  // reasons the gate is closed (each counted once)
  std::uint32_t windows = 0;     // open persistent windows
  std::uint32_t captures = 0;    // open stream captures
  bool capped = false;           // the layout has a capped pool
  bool stream_ordered = false;   // the last set_stream_ordered
  std::uint32_t frozen = 0;      // set_frozen nesting
};

}  // namespace poolcuda
