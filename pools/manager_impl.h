// The MemoryManager's private state, shared by memory_manager.cpp (routing, free path, fences),
// manager_recovery.cpp (out of memory), manager_scope.cpp (the lock scope and the work done
// after it) and manager_inspect.cpp (reports and consistency checks). Not a public header: only
// those files include it.
#pragma once

#include <time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <boost/container/small_vector.hpp>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "pools/free_fences.h"
#include "pools/lock_order.h"
#include "pools/memory_manager.h"
#include "pools/page_pools.h"
#include "pools/pool.h"
#include "pools/slice_index.h"
#include "pools/thread_cache.h"
#include "pools/wait_bound.h"

namespace poolcuda {

// The most a reservation waits, in total, for fences when fence-pending bytes exceed their bound
// (Note [Free fences]), unless the device is seen passing them (kFenceProgressWaitMicros below).
// Long enough for a device that merely lags the host a little to reach the oldest fence; short
// enough that a fence which cannot pass while the allocating thread waits (its stream parked by a
// host function only that thread releases) never deadlocks it. At worst, when fences never pass,
// the bound throttles growth to one page (or one allocation) per kFenceWaitBoundMicros.
inline constexpr std::uint32_t kFenceWaitBoundMicros = 2000;
// While the device is seen passing fences (one passed in the last kFenceProgressNanos), a
// reservation waits up to kFenceProgressWaitMicros for the oldest one, and again after each that
// passes, kFenceProgressTotalMicros in all (Note [A host far ahead] in memory_manager.cpp).
inline constexpr std::uint64_t kFenceProgressNanos = 20'000'000;
inline constexpr std::uint32_t kFenceProgressWaitMicros = 10000;
inline constexpr std::uint32_t kFenceProgressTotalMicros = 20000;

// The longest one wait for a fence lasts while stream-ordered frees wait in lanes: fences then
// need not pass in the order recorded, so the waits take back what passed meanwhile and route
// again between slices (Note [Stream-ordered frees]).
inline constexpr std::uint32_t kLaneWaitSliceMicros = 1000;
// How long a memory query waits for the fences of memory freed before it (Note [Memory info
// after a free] in manager_api.cpp).
inline constexpr std::uint32_t kMemInfoFenceWaitMicros = 2000;

// The most stream-ordered frees that wait in lanes, each on a fence of its own; later ones wait
// in epochs (Note [Stream-ordered frees]).
inline constexpr std::uint64_t kMaxLaneFrees = 256;

// The most a reservation waits, in total, for pages given back for the held bound to reach the
// driver (Note [Held memory bound]). Longer than kFenceWaitBoundMicros: those pages are the
// growth's own room, and with 2 ms a release thread that lost its core for a moment let one
// growth in a few thousand pass the bound on random sizes up to 1 GiB (1.64 times the live
// bytes instead of 1.50 in one run of five; none in eight with 20 ms). A free stuck behind a
// parked stream stops these waits as it stops the others (Note [Releases before growth]).
inline constexpr std::uint32_t kHeldWaitBoundMicros = 20000;
// How many times a reservation over the held bound has other shards release idle pages: another
// thread may grow into the room between the release and this reservation's next look.
inline constexpr int kHeldTrimsElsewhere = 4;

// One reservation's dealings with the held bound (Note [Held memory bound]).
struct HeldReservation {
  std::uint32_t budget_us = 0;  // what is left of its wait for released pages to arrive
  int trims_elsewhere = 0;      // times it had other shards release idle pages
  // Bytes of room it claimed from the device-wide bound while other shards released pages for
  // it (Shards::held_claims), until it grows or ends.
  std::uint64_t claim = 0;
  bool gate_held = false;  // the caller holds Shards::growth_gate for this route
};

// The most priming waits for the fences of persistent slices released just before a capture.
inline constexpr std::uint32_t kPrimeWaitMicros = 20000;

// The most extra rounds out-of-memory recovery makes for pages other threads gave up meanwhile
// (Note [Out of memory among threads] in manager_recovery.cpp).
inline constexpr int kOomExtraRounds = 16;
// The bytes out-of-memory recovery's first step frees beyond what the request lacks (Note
// [Recovery in two steps] in manager_recovery.cpp): the driver's own granularity.
inline constexpr std::uint64_t kRecoverySlack = 2 * MiB;
// The longest a growth waits for another thread's out-of-memory recovery (Note [Growth during
// a recovery] in manager_recovery.cpp).
inline constexpr std::uint32_t kRecoveryGrowthWaitMicros = 20000;
// A pending slice whose fence has passed returns to its pool (which coalesces it).
inline constexpr auto kGiveBack = [](Slice* s) { s->page->pool->give_back(s); };

// How long one release must stay inside the driver's free, seen by growths' waits that ran out,
// before they stop waiting for it (Note [Releases before growth] in memory_manager.cpp).
inline constexpr std::uint32_t kStuckReleaseMicros = 50000;

// A cheap monotonic clock for the prompt-fence rule: the coarse clock costs a few nanoseconds
// (its resolution, a few milliseconds, is all the rule needs).
inline std::uint64_t coarse_nanos() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1000000000u +
         static_cast<std::uint64_t>(now.tv_nsec);
}

// A thread's place among a manager's shards (manager_shards.h).
struct ShardHome;

// How many recently freed addresses are remembered to tell a double free from a pointer that
// was never handed out (the error path only scans them).
inline constexpr std::size_t kRecentFrees = 1024;

// A log line to write once the lock is released (Note [Outside the lock]). Per-allocation traces
// carry numbers only and are formatted after the lock; rare messages come preformatted.
struct LogEvent {
  enum class Kind : std::uint8_t { text, allocate, free };
  LogLevel level = LogLevel::basic;
  Kind kind = Kind::text;
  std::uint64_t size = 0;
  DevicePtr ptr = 0;
  const char* pool = "";
  std::string text;
};

// Work gathered under the manager's lock, done after it.
struct Outbox {
  ReleaseList releases;
  boost::container::small_vector<LogEvent, 2> logs;
};

// What routing decided (memory_manager.cpp).
struct Route {
  Slice* slice = nullptr;
  Error error;
  AllocStatus status = AllocStatus::ok;
  bool grew = false;
  bool wait_for_fence = false;  // over the fence bound: wait for the oldest fence, then route again
  // Over the bound on pages on their way to the driver: wait for them to arrive, then route
  // again (Note [Releases before growth] in memory_manager.cpp).
  bool flush_releases = false;
  bool for_held_bound = false;  // that wait is for the held bound's pages (kHeldWaitBoundMicros)
  // Another shard's growth holds the growth gate: take it with the shard's lock released, then
  // route again (Note [Held memory bound] in memory_manager.cpp).
  bool wait_for_gate = false;
  // A capped pool is full of memory that only waits for its fence: wait as the real cudaFree
  // would have, without a time bound (Note [Free fences]).
  bool patient = false;
  // Another thread is recovering from out of memory: let it finish before growing (Note
  // [Growth during a recovery] in manager_recovery.cpp), then route again.
  bool wait_for_recovery = false;
  // Over the held bound with idle pages only other shards hold: they release this many bytes
  // while the reservation claims `claim_bytes` of room, then it routes again (Note [Held memory
  // bound] in memory_manager.cpp).
  std::uint64_t trim_elsewhere_bytes = 0;
  std::uint64_t claim_bytes = 0;
  static Route served(Slice* slice) {
    Route r;
    r.slice = slice;
    return r;
  }
  static Route flush() {
    Route r;
    r.flush_releases = true;
    return r;
  }
  static Route gate() {
    Route r;
    r.wait_for_gate = true;
    return r;
  }
  static Route flush_for_held_bound() {
    Route r;
    r.flush_releases = true;
    r.for_held_bound = true;
    return r;
  }
  static Route trim_elsewhere(std::uint64_t bytes, std::uint64_t claim) {
    Route r;
    r.trim_elsewhere_bytes = bytes;
    r.claim_bytes = claim;
    return r;
  }
  static Route after_recovery() {
    Route r;
    r.wait_for_recovery = true;
    return r;
  }
  static Route wait(bool patient = false) {
    Route r;
    r.wait_for_fence = true;
    r.patient = patient;
    return r;
  }
};

// Which thread caches flush_caches() empties.
enum class CacheFlush : std::uint8_t {
  every,   // all of them
  unused,  // those no call used since the last sweep (Note [Thread caches])
  sweep,   // the same, and the sweep itself: the others' marks of use are cleared
};

// Waits for the pages released so far to reach the driver within `bound`, again after a stop
// (Note [Stopped processes]); true when every one did. Called without the manager's lock.
bool flush_within(Device& device, WaitBound& bound);

struct MemoryManager::Impl {
  Impl(Device& d, const ManagerOptions& o);
  ~Impl();

  // Holds the manager's lock and collects, in an Outbox, what must happen after it; the work
  // runs at unlock() and when the scope ends (manager_scope.cpp).
  class Scope {
   public:
    explicit Scope(Impl& m);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    void unlock();  // does the collected work outside the lock
    void relock();
    bool has_releases() const { return !box_.releases.empty(); }

   private:
    void attach();
    void detach();
    Impl& m_;
    Outbox box_;
    bool locked_ = false;
  };

  // --- manager_api.cpp: one shard's part of allocate and free (Note [Shards]) ----------------
  // What a shard's reservation tells the caller besides the Reservation itself; `quick` is the
  // caller's: route only, without waits or out-of-memory recovery.
  struct ReserveNotes {
    bool quick = false;
    bool cached = false;       // the thread's cache served it, without the shard's lock
    bool gate_closed = false;  // `gate` was closed under the lock: reserve in the first shard
    bool shared = false;       // another thread reserved from this shard last
    bool clock_crossed = false;  // the clock crossed a multiple of kShardClockSync
    bool plan_due = false;       // ... or of kShardPlanEvery
    std::uint64_t clock = 0;     // the reservation clock after this reservation
  };
  // `gate`: for a shard other than the first, the shards' gate, read under this shard's lock.
  // `thread`: the calling thread's ShardHome, or nullptr with one shard; `home`: the shard is
  // that thread's home, chosen for it (sharing is tracked). `last_try`: no other shard will be
  // tried, so an out-of-memory failure is counted and logged here.
  Reservation reserve(std::uint64_t size, Placement placement, const std::atomic<bool>* gate,
                      const ShardHome* thread, bool home, bool last_try, ReserveNotes& notes);
  // Frees `ptr` when it lies in this shard's pages; not_mine (nothing changed) otherwise.
  FreeOutcome free_pointer(DevicePtr ptr, StreamToken stream);
  // give_back_all() for this shard: `bound` is the caller's, shared by every shard,
  // `asked_microseconds` its length (what an earlier timeout is compared with).
  // `waited_behind`: the release this thread's recovery just ran out waiting for, or 0 (Note
  // [One wait per refused request] in manager_api.cpp).
  GiveBack give_back(WaitBound& bound, std::uint32_t asked_microseconds, GiveBackWait wait,
                     std::uint64_t waited_behind);

  // --- memory_manager.cpp --------------------------------------------------------------------
  void build_pools(const PoolLayout& layout);
  void drop_everything();  // forget(): no device call but fence_destroy
  // `may_flush`: a growth may first wait for released pages (once per reservation);
  // `may_wait_recovery`: for another thread's out-of-memory recovery (once per reservation).
  // `held`: the reservation's dealings with the held bound (none: no waits, no trims elsewhere,
  // no wait for the growth gate).
  Route route(std::uint64_t size, Placement placement, std::uint32_t wait_budget_us,
              bool may_flush = false, bool may_wait_recovery = false,
              HeldReservation* held = nullptr);
  // Waits (unlocked, within the recovery bound) until no out-of-memory recovery of this device
  // is under way (Note [Growth during a recovery]).
  void wait_for_recoveries(Scope& scope);
  // Bytes released and not yet with the driver: those the device still holds, and those this
  // scope will hand it at unlock.
  std::uint64_t releases_on_the_way() const;
  // This shard's bytes reserved for other shards to read before its scope ends: its pages given
  // up in the scope still count, since the device gets them only at the scope's end (Note [Held
  // memory bound], (6)).
  std::uint64_t reserved_to_publish() const;
  // Whether growth waits ran out while one release stayed inside the driver's free for
  // kStuckReleaseMicros, and it still is (Note [Releases before growth]).
  bool releases_stuck();
  // Waits (unlocked) at most *budget_us for released pages to reach the driver; takes the time
  // spent from it.
  void flush_before_growth(Scope& scope, std::uint32_t* budget_us);
  bool reclaim_on_miss(bool* refused);  // *refused: the open epoch could not be closed
  bool over_fence_bound() const;
  std::uint64_t fence_limit() const;     // the bound on fence-pending bytes
  // Bytes after which the open epoch closes even below fence_batch frees: a quarter of
  // fence_slack, so several epochs fit under the bound, but at least 1 MiB, so that a tiny
  // slack does not record a fence per free.
  std::uint64_t epoch_bytes() const {
    return std::max<std::uint64_t>(options.fence_slack / 4, MiB);
  }
  // Waits (unlocked) at most *budget_us for the oldest fence recorded (a slice at a time while
  // stream-ordered frees wait) and takes the time spent from it. `progress_us`, a reservation's
  // own: while the device is seen passing fences, the wait may last longer and the budget comes
  // back after a fence passed, out of *progress_us (Note [A host far ahead]).
  void wait_for_oldest_fence(Scope& scope, std::uint32_t* budget_us,
                             std::uint32_t* progress_us = nullptr);
  // Waits (unlocked) for the oldest fence recorded; false when none is. `until_passed`: without
  // a time bound; otherwise, while stream-ordered frees wait, a slice at a time (Note
  // [Stream-ordered frees]), and the caller routes again before it waits again.
  bool wait_for_oldest_fence(Scope& scope, bool until_passed);
  // Waits (unlocked) for the oldest fence recorded within `bound`, a slice at a time while
  // stream-ordered frees wait: `passed` when a fence passed meanwhile (its memory is back);
  // `slice` when a slice ran out with the bound not over (route again, then wait again);
  // `none` when no fence is recorded or the bound is over (Note [Stopped processes]).
  enum class FenceWait : std::uint8_t { none, passed, slice };
  // `with_lanes` false: the oldest closed epoch's fence only, never a stream-ordered free's.
  FenceWait wait_for_oldest_fence(Scope& scope, WaitBound& bound, bool with_lanes = true);
  // Whether `size` bytes exceed what the device could give even once every page the pools hold
  // for no live slice were back with the driver: then no recovery step can help.
  // `elsewhere`: bytes the other shards hold for no request.
  bool beyond_reach(std::uint64_t size, std::uint64_t elsewhere = 0);
  // Pages ever handed to Device::release by every shard (Note [Out of memory among threads]).
  std::uint64_t pages_handed_everywhere() const;
  Route recover_from_oom(Scope& scope, std::uint64_t size, Placement placement);
  // Who frees: the program, or the release of the last pin of a slice it freed while pinned
  // (never synchronized: Note [Frees a graph's release makes] in manager_api.cpp).
  enum class FreeBy : std::uint8_t { program, release };
  // live/held -> pending or free, by the fence mode; `stream`: freed in that stream's order.
  void retire(Slice* slice, StreamToken stream = kNoStream, FreeBy by = FreeBy::program);
  // A stream-ordered free's pending slice waits for a fence recorded on `stream` (Note
  // [Stream-ordered frees]); false, with the slice in no list, when none could be recorded.
  bool fence_on_stream(Slice* slice, StreamToken stream);
  // A stream-ordered free of `slice`, which is pinned: its fence on `stream`, for when the pins
  // go (Note [Stream-ordered frees of pinned slices] in manager_api.cpp).
  void fence_held_free(Slice* slice, StreamToken stream);
  // Closes the open epoch when it holds enough frees or bytes, or is old enough (a fence that
  // cannot be recorded now is recorded later).
  void close_epoch_when_due();
  void close_epoch();
  // Closes the open epoch, or an empty one, with a fence the next window's releases wait for
  // (Note [Releases inside a window] in manager_api.cpp), and reaps.
  void record_window_fence();
  // close_epoch(), then takes back what fences passed earlier (cleanups, recovery).
  std::uint64_t close_and_reap();  // slices given back
  // Closes the open epoch and waits for every fence: without a time bound, or within `bound`
  // (then false also when a fence still waits at its end). False when the epoch could not close.
  bool drain(Scope& scope, WaitBound* bound = nullptr);
  void finish_sync_frees(Scope& scope);
  // `keep_ordered_frees`: an explicit cleanup that keeps the pages whose last slice came back
  // from a stream-ordered free (Note [Idle memory before a park] in memory_manager.cpp).
  std::uint64_t cleanup_all(bool explicit_cleanup, bool keep_ordered_frees = false);
  // Releases the oldest of the dynamic pools' idle pages that holds `bytes` alone, or else
  // their idle pages oldest first until `bytes` are on their way to the device or none is left
  // (Note [Recovery in two steps]). Returns bytes released.
  std::uint64_t release_oldest_idle(std::uint64_t bytes);
  // Releases the smallest of the dynamic pools' idle pages that holds `bytes` alone, or else their
  // largest idle pages until `bytes` are released or none is left (Note [Held memory bound]).
  std::uint64_t release_fitting_idle(std::uint64_t bytes);
  // Before `pool` grows for `size`: this shard's idle pages go back (release_fitting_idle) while
  // the growth would take the device's bytes reserved over the held bound (Note [Held memory
  // bound]). Says by how much it still would, and whether it would with the pages on their way.
  struct HeldCheck {
    std::uint64_t over_by = 0;
    bool overrun = false;  // over it with the request's bytes alone, not its page's
    bool releases_count = false;
    bool may_release = false;  // no release on its way was stuck: it could release
    std::uint64_t peak_in_use = 0;  // the device's most bytes in use, this request included
    std::uint64_t room = Device::kNoGrowthLimit;  // what a growth may take under the bound
  };
  HeldCheck trim_to_held_bound(const Pool& pool, std::uint64_t size, std::uint64_t own_claim);
  // The device's bytes reserved (this reservation's claim left out) and in use at their most,
  // this request included, and the held bound they give.
  struct HeldFigures {
    std::uint64_t reserved = 0;
    std::uint64_t peak_in_use = 0;
    std::uint64_t bound = 0;
  };
  HeldFigures held_figures(std::uint64_t size, std::uint64_t own_claim) const;
  // Whether growing `pool` for `size` would pass the held bound before any page goes back.
  bool over_held_bound(const Pool& pool, std::uint64_t size, std::uint64_t own_claim) const;
  void implicit_cleanup();
  // The reservation clock moves by `reservations`; an implicit cleanup runs when one is due.
  // No idle page goes back during a capture: the release would have to wait for it anyway.
  void tick(std::uint64_t reservations) {
    ctx.clock += reservations;
    if (ctx.clock >= ctx.next_deadline && capture_windows == 0) implicit_cleanup();
    if (ctx.clock >= next_cache_sweep) sweep_caches();
  }
  // tick() for requests `cache` served, under the manager's lock, then an expiry pass over
  // the cache (manager_caches.cpp). Returns the clock.
  std::uint64_t advance_clock(std::uint64_t reservations, ThreadCache& cache);
  FreeOutcome classify(DevicePtr ptr) const;
  bool recently_freed(DevicePtr ptr) const;
  void log(LogLevel level, std::string message);
  // Whether `pool` can never grow on this device (Note [Pages larger than the device]).
  bool never_grows(const Pool& pool) const {
    return total_memory != 0 && pool.pages_larger_than(total_memory);
  }
  // The one line of Note [Pages larger than the device] for pools[pool_index], once per layout.
  void warn_page_past_device(std::size_t pool_index);
  // A log:full event; `pool` (the allocation's, or nullptr) is named only then.
  void trace(LogEvent::Kind kind, std::uint64_t size, DevicePtr ptr, const Pool* pool);
  // --- manager_caches.cpp: the thread caches (Note [Thread caches]) ---------------------------
  // Opens or closes the gate from the settings and state it depends on; closing flushes and
  // unbinds every cache, and is a barrier for the owners' calls.
  void update_cache_gate();
  // A slice just reserved for the calling thread joins its cache, when it qualifies.
  void cache_new_slice(Slice* slice, Placement placement);
  // The slice of `ptr`, when it is in a cache: false if parked there (freed already); else it
  // leaves the cache and is an ordinary live slice again.
  bool uncache(Slice* slice);
  // Whether a cached slice is parked (freed by the program).
  bool parked(Slice* slice);
  // Parked slices go back to their pools; `unbind`: live ones stop being cached too. `which`:
  // every cache, or only those no call used since the last sweep; `only`: only that pool's
  // slices; `keep_fresh`: that cache keeps the slices parked or reused since its last expiry
  // pass.
  // Returns how many parked slices went back.
  std::size_t flush_caches(bool unbind, CacheFlush which = CacheFlush::every,
                           const Pool* only = nullptr, const ThreadCache* keep_fresh = nullptr);
  // Parked slices of `cache` not reused since the previous pass retire.
  void expire_parked(ThreadCache& cache);
  // Every kThreadCacheSweepEvery reservations: caches no call used since the last sweep give
  // their parked slices back, so a quiet thread's freed pages still reach their pool's period;
  // the others start a new period of use.
  void sweep_caches();
  std::uint64_t next_cache_sweep = kThreadCacheSweepEvery;
  // A parked slice leaves the index and goes back to its pool at once, as the free that parked
  // it would have done when it was made (the gate was open then); frees() counted it then.
  // `freed_in_order`: the program's free that parked it was stream-ordered.
  void retire_parked(Slice* slice, bool freed_in_order);
  // The report's figures in use (the program's, without parked slices) and its thread caches'.
  void fill_cache_report(ManagerReport& r) const;
  // Bytes of the pages whose every busy slice is parked, or, with `batch_pending`, parked or
  // waiting for the fence of a batch no later work holds back: pages the program freed whole
  // (Note [Memory info after a free] in manager_api.cpp).
  std::uint64_t freed_page_bytes(bool batch_pending) const;
  // manager_inspect.cpp: this shard's report and consistency check (the first under its lock,
  // held by the caller; the second takes it).
  ManagerReport snapshot() const;
  std::string check_consistency() const;
  std::uint64_t parked_frees() const;

  // manager_scope.cpp: the log lines of a scope, written outside the lock.
  void write_logs(boost::container::small_vector<LogEvent, 2>& logs);
  MemoryUsage usage() const;  // the pools' counters: parked slices are in use there
  // usage() without the parked slices, whose bytes are added to *parked_bytes when given
  // (manager_caches.cpp).
  MemoryUsage program_usage(std::uint64_t* parked_bytes = nullptr) const;
  std::uint64_t pending() const;
  std::uint64_t idle() const;        // bytes of whole idle pages
  std::uint64_t free_bytes() const;  // every free byte, idle pages and holes in used pages

  Device& device;
  ManagerOptions options;
  // The shards this one belongs to and its place among them (Note [Shards]): out-of-memory
  // recovery asks the others for their idle memory. Set by Shards as it makes the shard.
  Shards* shards = nullptr;
  std::uint32_t shard_index = 0;
  // The thread that reserved last (its ShardHome's address), or nullptr (Note [Shards]).
  const void* last_reserver = nullptr;
  // The bytes in use, for the shards' plan (Note [Shards]): as the last scope left them once
  // there are other shards, and as of one of the last kShardPublishEvery reservations before.
  std::atomic<std::uint64_t> in_use_published{0};
  // Bytes of whole idle pages of the dynamic pools (those a shard lends), and bytes reserved for
  // no request, as the last scope left them: a shard that needs a page tries only the shards
  // that have some, and out-of-memory recovery counts them before it asks for them.
  std::atomic<std::uint64_t> idle_published{0};
  std::atomic<std::uint64_t> unused_published{0};
  std::atomic<std::uint64_t> reserved_published{0};
  // Set by a cache's owner when it parks a slice, cleared when flush_caches empties every cache:
  // another shard that needs a page tries this one then (Note [Shards]).
  std::atomic<bool> may_have_parked{false};
  // Set while this shard, under its lock, tries other shards' locks (Shards::borrow_page).
  std::atomic<bool> borrowing{false};
  void publish_figures();  // the figures above, under the lock
  // With other shards: this shard's exact bytes in use and reserved, with the others' as they
  // last published them, raise the device's peaks (Note [Device peaks] in manager_shards.cpp).
  void sample_device_peaks();
  std::uint64_t peaks_sampled_in_use = 0;  // this shard's bytes in use at its last sample
  std::uint64_t total_memory = 0;
  // A line of its own: threads that spin on it (Note [Spinning before parking]) would otherwise
  // take the holder's state away from it on every try.
  alignas(64) mutable RankedMutex mutex{LockRank::manager};
  alignas(64) Outbox* outbox = nullptr;  // set while a Scope holds the lock
  PoolContext ctx;
  std::unique_ptr<PersistentPool> persistent;
  std::vector<std::unique_ptr<Pool>> pools;
  std::vector<bool> capacity_warned;  // per pool: its capacity or page-size line was logged
  SliceIndex index;
  FenceQueue fences;
  std::uint64_t last_fence_nanos = 0;  // when the last epoch was closed (prompt fences)
  std::uint64_t last_passed_nanos = 0;  // when a reservation last saw a fence pass
  std::array<DevicePtr, kRecentFrees> recent_frees{};  // a ring of freed addresses
  std::size_t recent_next = 0;
  // free_fence:sync: slices freed and waiting for the synchronize that follows the free, in
  // free order (a chain through next_pending), and how many were ever added and given back.
  Slice* sync_head = nullptr;
  Slice* sync_tail = nullptr;
  std::uint64_t sync_added = 0;
  std::uint64_t sync_returned = 0;
  std::uint64_t windows = 0;          // open persistent windows
  std::uint64_t capture_windows = 0;  // open stream captures on the device
  // Note [Releases inside a window] in manager_api.cpp: advanced each time a capture begin
  // records a window's fence (record_window_fence()), the closed epoch of that fence (0: none
  // yet).
  std::uint8_t held_era = 0;
  std::uint64_t window_epoch = 0;
  bool held_since_window = false;  // a pinned slice was freed since that fence
  // Note [Stream-ordered frees of pinned slices] in manager_api.cpp: the fence each such free
  // recorded on its stream, by pointer, until its pins go.
  struct HeldFence {
    FenceHandle fence = kNoFence;
    StreamToken lane = kNoStream;
    std::uint64_t thread = 0;  // thread_serial() of the freeing thread
  };
  std::unordered_map<DevicePtr, HeldFence> held_fences;
  std::uint32_t frozen = 0;           // set_frozen() nesting: no page is taken from the device
  bool stream_ordered = false;        // free_fence:auto: frees return at once
  // Thread caches (Note [Thread caches]): this manager's id in the threads' tables, whether
  // their calls may serve and park slices now, and every cache ever made (owners hold shared
  // references too, so a cache outlives whichever goes first).
  const std::uint64_t id = next_manager_id();
  std::atomic<bool> caches_open{false};
  std::vector<std::shared_ptr<ThreadCache>> caches;
  std::uint64_t generation = 1;  // bumped by forget(): invalidates RetainedSlice handles
  // Pages ever handed to Device::release (counted under the lock as they go; read without it by
  // out-of-memory recovery: Note [Out of memory among threads]).
  std::atomic<std::uint64_t> pages_handed{0};
  std::atomic<std::uint64_t> frees{0};  // slices retired ever (counted under the lock)
  std::uint64_t oom_recoveries = 0;
  std::uint64_t oom_growth_waits = 0;  // growths that waited for a recovery (wait_for_recoveries)
  std::uint64_t oom_failures = 0;
  std::uint64_t cap_refusals = 0;  // requests a full capped pool refused
  // The first full capped pool that the last route() passed, or nullptr: the request spilled
  // past it when another pool served it, and it refused the request when its cap is the answer
  // (counted by reserve()).
  Pool* route_capped = nullptr;
  std::uint64_t fence_waits = 0;  // waits for the bound on fence-pending bytes
  std::uint64_t fence_wait_timeouts = 0;  // of those, the ones whose bound expired first
  double fence_wait_seconds = 0;          // time spent in those waits
  // Bytes of idle pages given back for the held bound, growths that went past it for want of
  // idle pages, and growths that passed it only because pages given back had not reached the
  // driver yet (their wait ran out or could not help: Note [Held memory bound]).
  std::uint64_t held_released_bytes = 0;
  std::uint64_t held_overruns = 0;
  std::uint64_t held_early_growths = 0;
  std::uint64_t give_backs = 0;          // give_back_all() calls that gave memory back
  std::uint64_t give_back_timeouts = 0;  // of those, the ones that ran out of time
  // What the last of those timeouts left behind, while nothing moved since (Note [Idle memory
  // before a park]): the bytes still pending and on their way to the driver, the slices retired
  // so far, and the bound the caller asked for. The caller's, not what was left of it when this
  // shard's turn came: that shrinks with every microsecond the call is delayed before it, and a
  // delay of one in the first call made the next, with the same bound, wait it all again.
  struct GiveBackState {
    std::uint64_t pending = 0;
    std::uint64_t releasing = 0;
    std::uint64_t frees = 0;
    std::uint32_t bound_us = 0;
    // `now` finds the same memory in the same place, with a bound no longer than this one's.
    bool same_as(const GiveBackState& now) const {
      return now.pending == pending && now.releasing == releasing && now.frees == frees &&
             now.bound_us <= bound_us;
    }
  };
  std::optional<GiveBackState> give_back_stuck;
  // The page inside the driver's free when a give-back's flush last ran out, or 0 (Note
  // [Give-backs behind a stuck release] in memory_manager.cpp).
  std::uint64_t give_back_stuck_release = 0;
  // `frees` when a memory query's wait for fences last ran out (Note [Memory info after a free]
  // in manager_api.cpp); ~0: none did.
  std::uint64_t mem_info_wait_ran_out = ~std::uint64_t{0};
  // The bytes on their way to the driver when a recovery's flush last ran out are the device's:
  // Shards::flush_stuck_releasing. Kept apart from it, for the short waits before a growth
  // (Note [Releases before growth]), whose 2 ms must not stop recovery, whose bound is seconds,
  // from waiting: the release inside the driver's free when the last wait that ran out began,
  // when the first such wait with it inside began, and whether that is long enough ago to call
  // it stuck.
  struct StuckRelease {
    std::uint64_t release = 0;
    std::chrono::steady_clock::time_point since;
    bool stuck = false;
  };
  std::optional<StuckRelease> growth_wait_stuck;
};

// The release inside the driver's free when this thread's last recovery ran out of its bound
// waiting for it, or 0: the give-back of the request's retry through CUDA does not wait for it
// a second time (Note [One wait per refused request] in manager_api.cpp).
inline thread_local std::uint64_t t_recovery_ran_out_behind
    __attribute__((tls_model("initial-exec"))) = 0;

}  // namespace poolcuda
