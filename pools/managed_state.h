// Internal to the managed slabs (managed_slabs.cpp, managed_chain.cpp): one slab's record and
// the encoding of its state word and marks (Note [Managed slabs] in managed_slabs.cpp). Not part
// of the API; include pools/managed_slabs.h instead.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "pools/managed_slabs.h"

namespace poolcuda::managed {

// The state word: bump offset in granules (low 32 bits) and live allocations (high 32 bits).
inline constexpr std::uint64_t kBumpMask = 0xffffffffu;
inline constexpr std::uint64_t kLiveOne = std::uint64_t{1} << 32;
// Bump all ones: no request fits, so the fast path moves to the slow path. A slot without a
// slab, one being rewound and one being given back all read this.
inline constexpr std::uint64_t kSealed = kBumpMask;

constexpr std::uint64_t bump_of(std::uint64_t state) { return state & kBumpMask; }
constexpr std::uint64_t live_of(std::uint64_t state) { return state >> 32; }
constexpr bool sealed(std::uint64_t state) { return bump_of(state) == kBumpMask; }
constexpr std::uint64_t pack(std::uint64_t bump, std::uint64_t live) {
  return (live << 32) | bump;
}

// Marks: two bits per granule, 32 granules per word. "live": an allocation starts here and has
// not been freed; "started": an allocation started here since the last rewind.
inline constexpr std::uint64_t kGranulesPerWord = 32;
inline constexpr std::uint64_t kLiveBits = 0x5555555555555555u;  // every granule's live bit
constexpr std::uint64_t live_bit(std::uint64_t granule) {
  return std::uint64_t{1} << (2 * (granule % kGranulesPerWord));
}
constexpr std::uint64_t started_bit(std::uint64_t granule) { return live_bit(granule) << 1; }
constexpr std::uint64_t mark_words(std::uint64_t granules) {
  return (granules + kGranulesPerWord - 1) / kGranulesPerWord;
}

}  // namespace poolcuda::managed

namespace poolcuda {

struct alignas(64) ManagedSlabs::Slab {
  // Written by every allocation and free of this slab: kept apart from other slabs' lines.
  std::atomic<std::uint64_t> state{managed::kSealed};
  std::atomic<std::uint64_t> dirty{0};   // granules below which bytes may be non-zero
  // The fast path bumps below this only (Note [Managed windows]); raised under the chain's
  // mutex, set back by a rewind while the slab is sealed.
  std::atomic<std::uint64_t> window_end{0};
  // The slab's base address (0: the slot holds no slab), in the chain's array of bases, which
  // every free scans: read-mostly lines, apart from the state words other threads swap.
  std::atomic<DevicePtr>* base = nullptr;

  // Allocated when the slot is first used, kept (and reused) for the chain's life: a lookup
  // that raced a release may still read them.
  std::unique_ptr<std::atomic<std::uint64_t>[]> marks;
  std::unique_ptr<std::atomic<std::uint32_t>[]> sizes;  // size - 1 of the allocation at a granule

  // Slow-path fields, under the chain's mutex.
  FenceHandle fence = kNoFence;  // recorded while the state read fence_state
  std::uint64_t fence_state = 0;
  std::uint64_t fence_tick = 0;  // the chain's tick when the fence was recorded
  std::uint64_t last_used = 0;   // the chain's tick when it last served (or was current)
  std::uint64_t resets = 0;
  // Requested bytes handed out before the last rewind; those since are counted from the marks
  // and sizes when asked (Note [Managed slabs]: an allocation makes no third atomic write).
  std::uint64_t issued_before = 0;
  // The lane it last served as current slab (kManagedLanes: none yet); a lane takes back the
  // spares it left before it takes another lane's (Note [Managed windows]).
  std::uint32_t lane = kManagedLanes;
  // The granules of its live allocations, counted when the state word read live_state
  // (managed::kSealed: not counted since the slab was last made, rewound or given back).
  std::uint64_t live_state = managed::kSealed;
  std::uint64_t live_granules = 0;
};

// One slow path's use of the held bound (Note [Managed held bound] in managed_bound.cpp): a slab
// not in use may be taken only if the bound allows one more, which is worked out once, when
// first asked, for the request of `size` bytes (`granules`) from `lane`.
struct ManagedSlabs::Admission {
  Admission(ManagedSlabs& chain, std::uint64_t size, std::uint64_t granules, std::uint32_t lane)
      : chain(chain), size(size), granules(granules), lane(lane) {}

  ManagedSlabs& chain;
  std::uint64_t size;
  std::uint64_t granules;
  std::uint32_t lane;
  int verdict = -1;    // -1: not asked yet; else whether one more slab may come into use
  ManagedError error;  // pinned, when the verdict is no

  // Whether the request may go to `slot` (a new slab: any slot not in use).
  bool operator()(std::uint32_t slot);
  // Whether a slab not in use may be taken.
  bool another();
};

}  // namespace poolcuda
