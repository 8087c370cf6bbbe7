// ManagedSlabs, the lock-free part: allocation on the current slab, up to its window's end,
// free, and pointer lookup. The slow path (window ends, new slabs, rewinds, giving slabs back)
// is in managed_chain.cpp.
//
// Note [Managed slabs]
// ~~~~~~~~~~~~~~~~~~~~
// A chain is a fixed array of slab records; a record with a slab publishes its base address
// (0: none), so a pointer is recognised by a range test over the records in use, without a
// lock. Each record's state is one 64-bit atomic word: the bump offset in granules (low half)
// and the number of live allocations (high half). Allocating is one compare-and-swap of
// (bump, live) -> (bump + n, live + 1); freeing is one compare-and-swap of live -> live - 1;
// rewinding is one compare-and-swap of (bump, 0) -> sealed -> (0, 0). All three change the same
// word, so a rewind can never race an allocation: the rewind's swap succeeds only if the word
// still holds the value it checked (nothing live, the free fence recorded for exactly that
// value has passed), and any allocation since then changed the bump, which only a rewind can
// lower. While a record is sealed (bump all ones) no request fits, so allocations go to the
// slow path, which waits on the chain's mutex; a rewind, a new slab and giving a slab back all
// happen sealed and under that mutex.
//
// A slab's base is read only after a successful swap: the allocation then holds the slab live,
// and the swap's acquire sees what the last unsealing published (base, cleared marks, dirty
// mark), even if the record was given back and refilled since the fast path chose it.
//
// Marks, two bits per granule: "live" (an allocation starts here and is live) and "started"
// (an allocation started here since the last rewind). An allocation sets both with one atomic
// OR after its bytes are zero; a free clears "live" with one atomic AND, and only the thread
// that saw the bit set decrements the live count, so the count never underflows and a free
// races nothing. A pointer whose bit is clear is a double free when "started" is set and an
// interior (or never issued) pointer otherwise; neither changes anything. Each allocation also
// records its size (at its first granule), for lookups of "its allocation"; the bytes a slab
// issued since its last rewind are the sizes at its started bits, summed by the slow path when
// it rewinds, gives back or reports the slab, so the fast path keeps no counter of its own.
//
// Note [Managed lanes]
// Threads that allocate on one slab all swap the same state word: its cache line moves between
// cores on every allocation and free, and two threads get less done than one. So each chain
// has kManagedLanes current slabs, and each thread allocates through one lane (its own number,
// given round-robin when it first allocates). The slow path gives a lane a slab no other lane
// is on (the next one that fits, an empty one rewound, a new one) and shares another lane's
// current slab only when nothing else is left (the chain is full, or Note [Managed held bound]
// takes no other). A single-threaded program uses one lane and two slabs (Note [Managed
// windows]). Frees go to whichever slab holds the pointer, as before.
//
// Zero on hand-out. A fresh slab reads as zero. A slab's dirty mark is the highest bump it
// reached before any rewind; bytes above it have never been handed out since the slab was
// allocated. So an allocation [start, start + size) zeroes only the part below the dirty mark,
// through the backing, before it is published; the rewind that moved the mark happened after
// the free fence of every earlier user passed, so nothing else touches those bytes.
#include "pools/managed_slabs.h"

#include <algorithm>
#include <bit>

#include "pools/managed_state.h"

namespace poolcuda {

using namespace managed;

std::string describe(const ManagedError& error) {
  const std::string requested = std::to_string(error.requested) + " B";
  const std::string limit = std::to_string(error.limit) + " B";
  switch (error.kind) {
    case ManagedErrorKind::none:
      return "no error";
    case ManagedErrorKind::bad_request:
      return "bad request: size " + requested + " or its alignment is not allowed";
    case ManagedErrorKind::too_large:
      // The two limits: a slab (the request never fits one) or every slab the chain may have.
      return error.requested > error.limit
                 ? "larger than a slab: requested " + requested + ", slab " + limit
                 : "every slab in use: requested " + requested + ", the slabs hold " + limit +
                       " in all";
    case ManagedErrorKind::pinned:
      return "slabs pinned: requested " + requested + "; one more slab would make those in use " +
             limit + ", more than twice their live bytes and " +
             std::to_string(kManagedSlackSlabsPerLane) + " slabs per lane";
    case ManagedErrorKind::large:
      return "too large to take a slab: requested " + requested + ", limit " + limit;
    case ManagedErrorKind::out_of_memory:
      return "out of memory for a new slab of " + limit + " (requested " + requested + ")";
    case ManagedErrorKind::device_error:
      return "device error while serving " + requested;
  }
  return "unknown error";
}

namespace {

std::uint64_t power_of_two_floor(std::uint64_t value) {
  return value == 0 ? 1 : std::bit_floor(value);
}

// Note [Managed lanes]: each thread allocates through one lane, assigned round-robin at its
// first allocation.
std::atomic<std::uint32_t> g_next_lane{0};
thread_local std::uint32_t t_lane = kManagedLanes;  // constant-initialised: no guard

ManagedOptions clamp(ManagedOptions options) {
  options.granule = std::max<std::uint64_t>(power_of_two_floor(options.granule), 256);
  options.slab_size = std::clamp<std::uint64_t>(options.slab_size, options.granule,
                                                kMaxManagedSlabSize);
  options.max_slabs = std::clamp<std::uint32_t>(options.max_slabs, 1, kMaxManagedSlabs);
  return options;
}

}  // namespace

ManagedSlabs::ManagedSlabs(ManagedBacking& backing, const ManagedOptions& options)
    : backing_(backing),
      options_(clamp(options)),
      granule_(options_.granule),
      slab_bytes_(align_up(options_.slab_size, options_.granule)),
      slab_granules_(slab_bytes_ / options_.granule),
      window_granules_(std::min(slab_granules_, kManagedWindow / options_.granule)),
      slabs_(new Slab[options_.max_slabs + 1]),  // the last record stays sealed
      bases_(new std::atomic<DevicePtr>[options_.max_slabs + 1]) {
  for (std::uint32_t i = 0; i <= options_.max_slabs; ++i) {
    bases_[i].store(0, std::memory_order_relaxed);
    slabs_[i].base = &bases_[i];
  }
  for (auto& lane : current_) lane.store(options_.max_slabs, std::memory_order_relaxed);
}

ManagedSlabs::~ManagedSlabs() = default;

std::uint32_t ManagedSlabs::lane_of_thread() {
  if (t_lane == kManagedLanes) {
    t_lane = g_next_lane.fetch_add(1, std::memory_order_relaxed) % kManagedLanes;
  }
  return t_lane;
}

ManagedAllocation ManagedSlabs::allocate(std::uint64_t size, std::uint64_t alignment) {
  if (size == 0 || alignment == 0 || !std::has_single_bit(alignment) || alignment > granule_) {
    return {0, {ManagedErrorKind::bad_request, size, granule_}};
  }
  if (size > slab_bytes_) return {0, {ManagedErrorKind::too_large, size, slab_bytes_}};
  const std::uint64_t granules = (size + granule_ - 1) / granule_;
  const std::uint32_t lane = lane_of_thread();
  // Note [Managed reset]: seen by forget() from here until the bytes are handed over.
  struct InFlight {
    std::atomic<std::uint32_t>* count;
    InFlight(LaneGate& gate, const std::atomic<std::uint32_t>& epoch) {
      for (;;) {
        const std::uint32_t entered = epoch.load(std::memory_order_seq_cst);
        count = &gate.in_flight[entered & 1];
        count->fetch_add(1, std::memory_order_seq_cst);
        if (epoch.load(std::memory_order_seq_cst) == entered) return;
        count->fetch_sub(1, std::memory_order_release);  // a forget began: count under its epoch
      }
    }
    ~InFlight() { count->fetch_sub(1, std::memory_order_release); }
  } in_flight(gates_[lane], forget_epoch_);
  Slab& slab = slabs_[current_[lane].load(std::memory_order_acquire)];
  std::uint64_t start = 0;
  switch (try_bump(slab, granules, &start, /*within_window=*/true)) {
    case Fit::ok:
      return finish(slab, start, size);
    case Fit::window:
      return next_window(size, granules, lane);
    default:
      return allocate_slow(size, granules, lane);
  }
}

ManagedSlabs::Fit ManagedSlabs::try_bump(Slab& slab, std::uint64_t granules,
                                         std::uint64_t* start, bool within_window) const {
  std::uint64_t state = slab.state.load(std::memory_order_relaxed);
  for (;;) {
    if (sealed(state)) return Fit::sealed;
    const std::uint64_t bump = bump_of(state);
    if (granules > slab_granules_ - bump) return Fit::full;
    // A stale window end only lets a request bump further into the slab: the window decides
    // where a lane allocates, never whether two allocations overlap (the state word does).
    if (within_window && bump + granules > slab.window_end.load(std::memory_order_relaxed)) {
      return Fit::window;
    }
    if (slab.state.compare_exchange_weak(state, pack(bump + granules, live_of(state) + 1),
                                         std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
      *start = bump;
      return Fit::ok;
    }
  }
}

// The swap succeeded: [start, start + size) is this caller's, and the slab is held live.
ManagedAllocation ManagedSlabs::finish(Slab& slab, std::uint64_t start, std::uint64_t size) {
  const DevicePtr ptr = slab.base->load(std::memory_order_relaxed) + start * granule_;
  slab.sizes[start].store(static_cast<std::uint32_t>(size - 1), std::memory_order_relaxed);
  const std::uint64_t dirty = slab.dirty.load(std::memory_order_relaxed);
  if (start < dirty) {
    const std::uint64_t recycled = std::min(size, (dirty - start) * granule_);
    if (!backing_.zero(ptr, recycled)) {
      drop_live(slab);  // the granules stay used until the next rewind; nothing is published
      return {0, {ManagedErrorKind::device_error, size, slab_bytes_}};
    }
  }
  slab.marks[start / kGranulesPerWord].fetch_or(live_bit(start) | started_bit(start),
                                               std::memory_order_release);
  return {ptr, {}};
}

// One live allocation fewer; never below zero (a record dropped by forget() reads sealed).
void ManagedSlabs::drop_live(Slab& slab) {
  std::uint64_t state = slab.state.load(std::memory_order_relaxed);
  while (!sealed(state) && live_of(state) != 0 &&
         !slab.state.compare_exchange_weak(state, state - kLiveOne, std::memory_order_acq_rel,
                                           std::memory_order_relaxed)) {
  }
}

ManagedSlabs::Slab* ManagedSlabs::slab_of(DevicePtr ptr, std::uint64_t* offset) const {
  const std::uint32_t used = used_slots_.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < used; ++i) {
    const DevicePtr base = bases_[i].load(std::memory_order_acquire);
    if (base != 0 && ptr - base < slab_bytes_) {
      *offset = ptr - base;
      return &slabs_[i];
    }
  }
  return nullptr;
}

FreeOutcome ManagedSlabs::free(DevicePtr ptr) {
  std::uint64_t offset = 0;
  Slab* slab = slab_of(ptr, &offset);
  if (slab == nullptr) return FreeOutcome::not_mine;
  if (offset % granule_ != 0) return FreeOutcome::interior_pointer;
  const std::uint64_t granule = offset / granule_;
  const std::uint64_t before = slab->marks[granule / kGranulesPerWord].fetch_and(
      ~live_bit(granule), std::memory_order_acq_rel);
  if ((before & live_bit(granule)) == 0) {
    return (before & started_bit(granule)) != 0 ? FreeOutcome::double_free
                                                : FreeOutcome::interior_pointer;
  }
  drop_live(*slab);
  return FreeOutcome::freed;
}

ManagedLookup ManagedSlabs::find(DevicePtr ptr) const {
  ManagedLookup out;
  std::uint64_t offset = 0;
  const Slab* slab = slab_of(ptr, &offset);
  if (slab == nullptr) return out;
  out.kind = ManagedLookup::Kind::free_space;
  out.slab = ptr - offset;
  out.slab_size = slab_bytes_;
  // The nearest live start at or before the pointer: allocations since the last rewind are
  // disjoint, so only that one can contain it.
  const std::uint64_t granule = offset / granule_;
  std::uint64_t word = granule / kGranulesPerWord;
  std::uint64_t mask = kLiveBits & (live_bit(granule) | (live_bit(granule) - 1));
  for (;;) {
    const std::uint64_t live = slab->marks[word].load(std::memory_order_acquire) & mask;
    if (live != 0) {
      const std::uint64_t start =
          word * kGranulesPerWord + static_cast<std::uint64_t>(std::bit_width(live) - 1) / 2;
      const std::uint64_t size =
          std::uint64_t{slab->sizes[start].load(std::memory_order_relaxed)} + 1;
      if (offset - start * granule_ < size) {
        out.kind = ManagedLookup::Kind::live;
        out.start = out.slab + start * granule_;
        out.size = size;
      }
      return out;
    }
    if (word == 0) return out;
    --word;
    mask = kLiveBits;
  }
}

}  // namespace poolcuda
