// ManagedSlabs, the held bound: whether the slow path may bring one more slab into use, from the
// slabs in use and what is live in them. Runs under the chain's mutex only; the lock-free part
// is in managed_slabs.cpp, the rest of the slow path in managed_chain.cpp.
//
// Note [Managed held bound]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A slab rewinds only when nothing in it is live, so one small allocation that stays keeps its
// whole slab. A program that churned managed memory and kept 64 KiB of every 16 MiB made the
// chain take a new slab of 16 MiB for every 64 KiB kept: on a 1 GiB device 40 such rounds held
// 640 MiB of slabs around 2.5 MiB of live bytes, and a cudaMalloc of half the device, which plain
// CUDA (holding only what is live) served, failed; 64 rounds filled the device with slabs and
// the program's own cudaMallocManaged failed. A slab must be earned by what is live in it.
//
// The slabs in use, U: those that hold a live allocation, and each lane's current slab (its fast
// path may put an allocation in it at any time without the lock). Every other slab is empty and
// goes back to the backing after its disuse, and at once (once its free fence has passed, waited
// for as the real cudaFree would have waited) in an out-of-memory recovery. Only the slow path
// adds to U: the fast path allocates in lanes' current slabs only, and the slow path makes the
// slab it chooses for a request the lane's current one, so a slab joins U exactly when the slow
// path chooses one outside U (a new slab, one rewound, one with room left).
//
// The rule. Let S be the slab size, L the bytes of the live allocations (in whole granules: what
// they take of a slab, never more than the pages the driver gives each real allocation), r the
// request's, and A the lanes that hold a current slab, the asking one counted (1 to
// kManagedLanes). The slow path chooses a slab outside U only when
//     (|U| + 1) x S <= 2 x (L + r) + kManagedSlackSlabsPerLane x A x S,
// and otherwise takes no slab: the request fails with ManagedErrorKind::pinned, and the
// interposer passes it to the real cudaMallocManaged, which serves it as it serves plain CUDA
// (Note [Managed routing] in interpose/managed_hooks.cpp); its cudaFree then goes to the driver,
// as for any pointer the chains do not know. It waits for no fence of a slab outside U either:
// the wait (up to kManagedFenceWaitMicros) would cost more than the real call it might save.
//
// The bound. Right after U grows, its slabs hold at most twice the live bytes (the request
// counted) plus 3A <= 12 slabs. Between two growths U only shrinks (a slab empties and is no
// lane's current one, or a lane leaves an empty slab for another), so at any time the slabs that
// hold live allocations hold at most 2 x L' + 3A x S, L' being the live bytes just after U last
// grew; every other slab goes back before an allocation fails for lack of memory. (A
// fast-path allocation that loaded its lane's current slab just before the slow path moved the
// lane on may still land in the slab left behind: at most one per allocating thread.)
//
// Why three slabs per lane. A lane whose program keeps its last W bytes live (a pipeline's
// buffers: the common pattern) has them in at most ceil(W / S) + 1 slabs, as W straddles slab
// ends, and needs one more to move on to: ceil(W / S) + 2 <= 3 + 2W / S for every W. Its windows
// need two (the current slab and the spare they take turns with, Note [Managed windows]). So a
// program whose allocations are freed in about the order they were made is not refused, nor is
// one whose live bytes fill its slabs even half way. (With two per lane, a thread keeping its
// last 8 allocations of up to 8 KiB live on slabs of 64 KiB was refused whenever they spanned
// three slabs.) What still meets the bound without long-lived allocations: requests the slow
// path puts in another slab's last bytes keep that slab in use a little longer; with slabs no
// larger than a window (1 MiB) a thread that kept its last 0.1 to 1.2 slabs' worth live had
// 0.1% to 1.7% of its requests refused in a test over host memory, with slabs of 16 MiB (a
// device of 1 GiB or more and the default managed_slab) none.
//
// What it costs. A program in that state gets its new allocations from the real call, at the
// price plain CUDA pays (plus about 0.6 us of slow path each on the build machine), until its
// slabs' live bytes grow or a slab empties; memory, errors and the fast path are as before. The
// rule is asked only where a slab outside U would be chosen, and at most once per slow path.
// Counting U is one pass over the slots; |U| + 1 <= 3A admits without more (so a lane's current
// slab and its spare never ask for the live bytes), and the handed-out bytes, which bound the
// live ones from above, refuse without more; only in between are the marks read (Note [Managed
// slabs]), and each slab's count is kept for its state word, which every allocation and free of
// the slab changes (a rewind, which can bring an old word back, drops the count), so that a
// program whose slabs stay pinned pays for a pass over a slab's marks only when they changed.
//
// Note [Large managed requests]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The bound above counts live bytes, and a request just over half a slab is mostly live bytes:
// each such request took a slab of its own and left the rest of it unused, within twice the live
// bytes. So a program of 9 MiB managed allocations on a 1 GiB device (slabs of 16 MiB) filled
// its 64 slabs with 576 MiB live, and the real cudaMallocManaged its next request went to had no
// device memory left: 64 allocations where plain CUDA made 113. The slab a request brings into
// use ends where the next request does not fit in what is left of it. So a request larger than
// a kManagedOpeningShare-th of a slab (ManagedOptions::opening_share; one granule for a slab of
// fewer granules) brings a slab into use only when requests of its size would fill the slab to
// within that share (16 MiB requests in 64 MiB slabs, 9 MiB ones too: 1 MiB is left); otherwise
// (the error `large`) it takes room left in the slabs in use, or goes to the real call as a
// refusal of the bound does. That program's 9 MiB requests would leave 7 MiB of each 16 MiB slab:
// the real call now serves them all, 113 of them, at the price plain CUDA pays for an allocation
// of a few MiB, which is small beside what filling it costs. (Requests of mixed sizes can still
// leave a slab's end unused below the largest request that opened it, within the bound above.)
#include <algorithm>
#include <bit>

#include "pools/managed_slabs.h"
#include "pools/managed_state.h"

namespace poolcuda {

using namespace managed;

bool ManagedSlabs::in_use(std::uint32_t slot) const {
  if (slot >= used_slots_.load(std::memory_order_relaxed) ||
      slabs_[slot].base->load(std::memory_order_relaxed) == 0) {
    return false;
  }
  const std::uint64_t state = slabs_[slot].state.load(std::memory_order_acquire);
  if (sealed(state)) return false;  // being given back, or dropped by forget()
  return live_of(state) != 0 || current_of_other_lane(slot, kManagedLanes);
}

std::uint64_t ManagedSlabs::live_granules(Slab& slab, std::uint64_t state) {
  if (slab.live_state == state) return slab.live_granules;
  std::uint64_t granules = 0;
  std::uint64_t count = 0;
  for (std::uint64_t w = 0; w < mark_words(bump_of(state)); ++w) {
    // Acquire: an allocation sets its marks after its size, with release.
    std::uint64_t live = slab.marks[w].load(std::memory_order_acquire) & kLiveBits;
    for (; live != 0; live &= live - 1, ++count) {
      const std::uint64_t granule = w * kGranulesPerWord + std::countr_zero(live) / 2;
      granules += std::uint64_t{slab.sizes[granule].load(std::memory_order_relaxed)} / granule_ + 1;
    }
  }
  // An allocation or free under way changes the word and its mark at different times: a count
  // that disagrees with the word is used this once, not kept.
  if (count == live_of(state)) {
    slab.live_state = state;
    slab.live_granules = granules;
  }
  return granules;
}

bool ManagedSlabs::may_take_slab(std::uint64_t size, std::uint64_t granules, std::uint32_t lane,
                                 ManagedError* error) {
  // Note [Large managed requests].
  const std::uint64_t share = std::max<std::uint64_t>(1, options_.opening_share);
  const std::uint64_t opening = std::max<std::uint64_t>(1, slab_granules_ / share);
  if (granules > opening && slab_granules_ % granules > opening) {
    *error = {ManagedErrorKind::large, size, opening * granule_};
    return false;
  }
  const std::uint32_t used = used_slots_.load(std::memory_order_relaxed);
  std::uint64_t lanes = 0;
  for (std::uint32_t other = 0; other < kManagedLanes; ++other) {
    const std::uint32_t slot = current_[other].load(std::memory_order_relaxed);
    if (other == lane || (slot < used && slabs_[slot].base->load(std::memory_order_relaxed) != 0)) {
      ++lanes;
    }
  }
  std::uint64_t in_use_count = 0;
  std::uint64_t handed_out = 0;  // granules handed out in the slabs in use: at least the live ones
  for (std::uint32_t i = 0; i < used; ++i) {
    if (!in_use(i)) continue;
    ++in_use_count;
    handed_out += bump_of(slabs_[i].state.load(std::memory_order_acquire));
  }
  // In granules: what the slabs in use would hold with one more, and what they may hold.
  const std::uint64_t needed = (in_use_count + 1) * slab_granules_;
  const auto allowed = [&](std::uint64_t live) {
    return 2 * (live + granules) + kManagedSlackSlabsPerLane * lanes * slab_granules_;
  };
  if (needed <= allowed(0)) return true;
  if (needed <= allowed(handed_out)) {
    std::uint64_t live = 0;
    for (std::uint32_t i = 0; i < used; ++i) {
      if (!in_use(i)) continue;
      const std::uint64_t state = slabs_[i].state.load(std::memory_order_acquire);
      if (!sealed(state) && live_of(state) != 0) live += live_granules(slabs_[i], state);
    }
    if (needed <= allowed(live)) return true;
  }
  *error = {ManagedErrorKind::pinned, size, needed * granule_};
  return false;
}

bool ManagedSlabs::Admission::another() {
  if (verdict < 0) verdict = chain.may_take_slab(size, granules, lane, &error) ? 1 : 0;
  return verdict == 1;
}

bool ManagedSlabs::Admission::operator()(std::uint32_t slot) {
  return chain.in_use(slot) || another();
}

}  // namespace poolcuda
