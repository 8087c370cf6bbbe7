// ManagedSlabs: the managed-memory engine of one device (DESIGN.md decision 6). A chain of
// slabs, each one large allocation from a ManagedBacking, serves small managed allocations with a
// bump pointer: allocating is one compare-and-swap on the current slab's state, freeing is one
// bit cleared and one compare-and-swap, and recognising a pointer (free, lookups) takes no lock.
// A slab rewinds only when nothing in it is live and the free fence recorded after its last free
// has passed; every byte handed out reads as zero. Note [Managed slabs] in managed_slabs.cpp
// explains the state word, the marks and why a rewind can never race an allocation; Note
// [Managed windows] in managed_chain.cpp why a lane's allocations stay within a few MiB
// while they are freed as fast as they are made; Note [Managed held bound] in managed_bound.cpp
// why slabs that small live allocations keep are never more than about twice what is live.
//
// Also the snapshot of a chain for reports (ManagedReport) and its two renderings.
//
// Depends on pools/ only (types.h, managed_backing.h); names no CUDA symbol.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pools/managed_backing.h"
#include "pools/options.h"
#include "pools/report_tree.h"
#include "pools/types.h"
#include "pools/wait_bound.h"

namespace poolcuda {

// Every allocation starts on a granule: the pools' device alignment.
inline constexpr std::uint64_t kManagedGranule = kDeviceAlignment;
// The most slabs a chain can hold; ManagedOptions::max_slabs is at most this.
inline constexpr std::uint32_t kMaxManagedSlabs = 64;
// Current slabs per chain: threads allocate through them round-robin (Note [Managed lanes]).
inline constexpr std::uint32_t kManagedLanes = 4;
// The longest an allocation waits for an empty slab's free fence before the chain grows
// instead (Note [Managed free fences] in managed_chain.cpp); the pools' bound too.
inline constexpr std::uint32_t kManagedFenceWaitMicros = 2000;
// A lane's window (Note [Managed windows]): the bytes it bumps through before it looks for a
// slab to rewind, and the least number of its requests a window holds.
inline constexpr std::uint64_t kManagedWindow = 1 * MiB;
inline constexpr std::uint64_t kManagedWindowRequests = 64;
// Note [Managed held bound]: the slabs in use may hold twice their live bytes and this many
// slabs more per lane.
inline constexpr std::uint32_t kManagedSlackSlabsPerLane = 3;
// Note [Large managed requests]: a request above this share of a slab brings a slab into use only
// when requests of its size fill a slab to within that share; else it takes room in the slabs in
// use, or goes to the real call.
inline constexpr std::uint64_t kManagedOpeningShare = 8;

struct ManagedOptions {
  std::uint64_t slab_size = 64 * MiB;  // bytes per slab, rounded up to the granule
  std::uint64_t granule = kManagedGranule;  // every allocation starts on one; a power of two
  std::uint32_t max_slabs = kMaxManagedSlabs;  // the chain cap, 1..kMaxManagedSlabs
  // False (free_fence:none): an empty slab rewinds at once, with no free fence.
  bool fences = true;
  // Slow paths an empty slab other than a current one may stay unused before it goes back.
  std::uint32_t disuse_period = 16;
  // The share of a slab above which a request brings one into use only when its size fills
  // one to within that share (Note [Large managed requests]); 1: any request may.
  std::uint64_t opening_share = kManagedOpeningShare;
};

enum class ManagedErrorKind : std::uint8_t {
  none,
  bad_request,    // size 0, or an alignment that is 0, not a power of two or above the slab
  too_large,      // the request does not fit: `limit` is the slab size or the chain's capacity
  pinned,         // only a slab not in use would do, and the slabs in use hold too little that
                  // is live to take one more (Note [Managed held bound])
  large,          // only a slab not in use would do, and the request is too large to bring one
                  // into use (Note [Large managed requests])
  out_of_memory,  // the backing refused a new slab (out of memory)
  device_error,   // the backing failed otherwise (a slab or the zeroing)
};

// Why an allocation failed; `requested` is the size asked for. For too_large, `limit` is the
// slab size (the request can never fit a slab) or max_slabs x slab size (the chain is full); for
// pinned, the bytes the slabs in use would hold with one more, which the held bound refuses; for
// large, the largest request that may bring a slab into use.
struct ManagedError {
  ManagedErrorKind kind = ManagedErrorKind::none;
  std::uint64_t requested = 0;
  std::uint64_t limit = 0;

  explicit operator bool() const { return kind != ManagedErrorKind::none; }
  friend bool operator==(const ManagedError&, const ManagedError&) = default;
};

// "chain full: requested 4096 B, limit 128 MiB (2 slabs of 64 MiB)"-style one-liner.
std::string describe(const ManagedError& error);

struct ManagedAllocation {
  DevicePtr ptr = 0;
  ManagedError error;  // set when ptr == 0
};

// What a pointer is to a chain.
struct ManagedLookup {
  enum class Kind : std::uint8_t {
    not_mine,    // in no slab
    free_space,  // in a slab, but in no live allocation
    live,        // inside (or at the start of) a live allocation
  };
  Kind kind = Kind::not_mine;
  DevicePtr start = 0;     // live: the allocation's first byte
  std::uint64_t size = 0;  // live: its requested size
  DevicePtr slab = 0;      // not not_mine: the slab's base and size
  std::uint64_t slab_size = 0;
};

// Snapshot of a chain, taken under its lock, rendered outside it. Sizes are bytes.
// One slab: X(member, label, unit, detail).
#define POOLCUDA_MANAGED_SLAB_NUMBERS(X)      \
  X(base, "base", address, normal)            \
  X(capacity, "capacity", bytes, normal)      \
  X(bump, "handed out", bytes, normal)        \
  X(dirty, "dirty", bytes, wide)              \
  X(live, "live", count, normal)              \
  X(issued, "issued", bytes, wide)            \
  X(resets, "rewinds", count, normal)

// bump: handed out since the last rewind (granule-rounded); dirty: below this, recycled bytes
// are zeroed on hand-out; live: live allocations; issued: requested bytes handed out since the
// slab was allocated; resets: rewinds of this slab.
struct ManagedSlabReport {
#define POOLCUDA_MANAGED_MEMBER(member, label, unit, detail) std::uint64_t member = 0;
  POOLCUDA_MANAGED_SLAB_NUMBERS(POOLCUDA_MANAGED_MEMBER)
};

// The chain: X(member, label, unit, detail). issued_total never decreases; resets counts the
// rewinds of every slab; slabs_allocated and slabs_released count the backing's calls.
#define POOLCUDA_MANAGED_NUMBERS(X)                       \
  X(slab_size, "slab", bytes, normal)                     \
  X(max_slabs, "at most", count, wide)                    \
  X(live_allocations, "live", count, normal)              \
  X(issued_total, "issued", bytes, normal)                \
  X(resets, "rewinds", count, normal)                     \
  X(slabs_allocated, "slabs allocated", count, wide)      \
  X(slabs_released, "slabs released", count, wide)

struct ManagedReport {
  POOLCUDA_MANAGED_NUMBERS(POOLCUDA_MANAGED_MEMBER)
#undef POOLCUDA_MANAGED_MEMBER
  std::vector<ManagedSlabReport> slabs;  // the slabs held now, in slot order
};

// The managed section of a device's report (managed_report.cpp): the chain's numbers and a
// table of its slabs.
ReportSection describe(const ManagedReport& report);

class ManagedSlabs {
 public:
  // `backing` must outlive the chain. Options out of range are clamped (see ManagedOptions).
  ManagedSlabs(ManagedBacking& backing, const ManagedOptions& options);
  ~ManagedSlabs();  // releases no slab (Note [Exit] in memory_manager.cpp)
  ManagedSlabs(const ManagedSlabs&) = delete;
  ManagedSlabs& operator=(const ManagedSlabs&) = delete;

  // Hands out `size` bytes, every one zero, at an address aligned to `alignment`: a power of two
  // up to the granule (every allocation starts on a granule; larger alignments, 0 and size 0
  // are bad requests and change nothing). Lock-free unless the current slab cannot fit the
  // request. Thread-safe.
  ManagedAllocation allocate(std::uint64_t size, std::uint64_t alignment);

  // Frees by pointer. Anything but `freed` changes nothing: not_mine (in no slab), double_free
  // (an allocation that started here was freed already), interior_pointer (any other address
  // in a slab). Lock-free. Thread-safe.
  FreeOutcome free(DevicePtr ptr);

  // What `ptr` is to this chain. Lock-free; a concurrent allocation or free of the same memory
  // may or may not be seen.
  ManagedLookup find(DevicePtr ptr) const;

  // Rewinds every slab with nothing live whose free fence has passed (recording the fence
  // first when needed); the allocation path does this on its own when it needs room. Returns
  // how many slabs rewound.
  std::uint32_t rewind_empty();

  // Gives every slab with nothing live back to the backing, the lanes' current ones included,
  // once its free fence has passed (waiting for it, where the real cudaFree would have waited,
  // within `bound`, Note [Stopped processes]): for the device's out-of-memory recovery, before
  // a host function, and explicit trims. Returns how many went back.
  std::uint32_t trim(WaitBound& bound);
  std::uint32_t trim(std::uint32_t max_wait_micros) {
    WaitBound bound{std::chrono::microseconds(max_wait_micros)};
    return trim(bound);
  }

  // Bytes of the slabs that hold nothing live (their fences may not have passed yet): what a
  // trim could give back. A snapshot without the lock.
  std::uint64_t empty_bytes() const;

  // A reset begins (freeze) or is over, with every free that may have seen the memory from
  // before it (thaw): while any freeze is not thawed, the chain makes no new slab (its requests
  // fail with a device error, which the interposer passes to the driver). Counted: the thaw of
  // one reset may come after the next reset froze the chain again.
  void freeze();
  void thaw();
  // The memory is going (cudaDeviceReset): drop every slab without releasing it, destroy the
  // fences, and wait until no allocation that started before is still at work (Note [Managed
  // reset] in managed_chain.cpp). Called while frozen; issued_total and resets are kept.
  void forget();
  // Returns once no slab is being made: memory the driver has just handed to a new slab is then
  // in the chain, where free() finds it (Note [Foreign frees] in interpose/foreign_frees.cpp).
  // Never takes the chain's lock, which trims hold while they wait for fences.
  void await_new_slab() const;

  ManagedReport report() const;

  std::uint64_t slab_size() const { return slab_bytes_; }
  std::uint64_t granule() const { return granule_; }

 private:
  struct Slab;
  // window: the request fits the slab but not its window (only when asked to stay within it).
  enum class Fit : std::uint8_t { ok, window, full, sealed };

  Fit try_bump(Slab& slab, std::uint64_t granules, std::uint64_t* start,
               bool within_window = false) const;
  ManagedAllocation finish(Slab& slab, std::uint64_t start, std::uint64_t size);
  ManagedAllocation allocate_slow(std::uint64_t size, std::uint64_t granules,
                                  std::uint32_t lane);
  ManagedAllocation next_window(std::uint64_t size, std::uint64_t granules, std::uint32_t lane);
  static std::uint32_t lane_of_thread();
  // True when `slot` is the current slab of a lane other than `lane` (kManagedLanes: any lane).
  bool current_of_other_lane(std::uint32_t slot, std::uint32_t lane) const;
  Slab* slab_of(DevicePtr ptr, std::uint64_t* offset) const;
  static void drop_live(Slab& slab);
  // Requested bytes of the allocations started in the slab's first `bump` granules since its
  // last rewind: the sizes at its started bits (Note [Managed slabs]).
  static std::uint64_t issued_since_rewind(const Slab& slab, std::uint64_t bump);

  // Slow path (managed_chain.cpp); the caller holds mutex_.
  bool quiet(Slab& slab, std::uint64_t* state);
  bool rewind(Slab& slab, std::uint64_t state);
  bool reuse(Slab& slab, std::uint64_t granules, std::uint64_t* start);
  void open_window(Slab& slab, std::uint64_t bump, std::uint64_t granules);
  // Waits for the oldest fence of the empty slabs; only the lane's current one's when `others`
  // is false (the held bound refuses another slab).
  int wait_oldest_fence(std::uint32_t lane, bool others);
  bool retire(Slab& slab, std::uint64_t state, std::vector<DevicePtr>* retired);
  int populate(std::uint64_t size, ManagedError* error);
  std::uint32_t collect_empty(bool disused_only, std::vector<DevicePtr>* retired,
                              WaitBound* bound = nullptr);
  void release_all(const std::vector<DevicePtr>& retired);  // without mutex_

  // The held bound (managed_bound.cpp, Note [Managed held bound]); the caller holds mutex_.
  struct Admission;
  // True when the slot's slab is in use: it holds a live allocation or is a lane's current.
  bool in_use(std::uint32_t slot) const;
  // Whether one more slab may come into use for a request of `size` bytes (`granules`) from
  // `lane`; *error is set when not.
  bool may_take_slab(std::uint64_t size, std::uint64_t granules, std::uint32_t lane,
                     ManagedError* error);
  // Granules of the live allocations in the slab, whose state word read `state`.
  std::uint64_t live_granules(Slab& slab, std::uint64_t state);

  ManagedBacking& backing_;
  const ManagedOptions options_;
  const std::uint64_t granule_;
  const std::uint64_t slab_bytes_;
  const std::uint64_t slab_granules_;
  const std::uint64_t window_granules_;  // kManagedWindow in granules (the slab's, if smaller)
  std::unique_ptr<Slab[]> slabs_;
  std::unique_ptr<std::atomic<DevicePtr>[]> bases_;  // each slab's base (Slab::base)
  // Each lane's current slab: the one its fast path tries. A lane with none points at the extra
  // record past the last slot, which is never filled (always sealed).
  alignas(64) std::atomic<std::uint32_t> current_[kManagedLanes] = {};
  std::atomic<std::uint32_t> used_slots_{0};  // slots ever populated: the lookup scan bound
  // Allocations of each lane between their first step and their last, counted under the parity
  // of the forget epoch they entered in (Note [Managed reset]).
  struct alignas(64) LaneGate {
    std::atomic<std::uint32_t> in_flight[2] = {};
  };
  LaneGate gates_[kManagedLanes];
  alignas(64) std::atomic<std::uint32_t> forget_epoch_{0};

  mutable std::mutex mutex_;  // the slow path; guards the fields below
  // The clock of disuse: slow paths, and a slab's worth of window ends (next_window).
  std::uint64_t tick_ = 0;
  std::uint64_t windows_ = 0;  // window ends so far
  // A new slab for a window was refused, or a trim ran, at spare_refused_tick_: none is asked
  // for until the disuse period has passed or a slab was made for a full one (Note [Managed
  // windows]).
  bool spare_refused_ = false;
  std::uint64_t spare_refused_tick_ = 0;
  std::uint64_t retired_issued_ = 0;
  std::uint64_t retired_resets_ = 0;
  std::uint64_t slabs_allocated_ = 0;
  std::uint64_t slabs_released_ = 0;
  // populate() calls between asking the driver for a slab and publishing its base.
  std::atomic<std::uint32_t> slabs_being_made_{0};
  std::uint32_t freezes_ = 0;  // freeze() calls not thawed yet: no new slab while any
};

}  // namespace poolcuda
