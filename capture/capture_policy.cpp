// CapturePolicy (see capture_policy.h).
//
// Note [Capture windows]
// ~~~~~~~~~~~~~~~~~~~~~~
// Between the begin and the end of a stream capture nothing runs: the captured work runs later,
// when the graph is launched, against the addresses it saw. So memory a capture's work uses
// must not move to anyone else while any copy of the graph can still run. While a capture is
// open on a device (its "window"), every allocation on the device comes from the persistent
// pool (exact fit, nothing carved around it) and is pinned for every open capture at once:
// the allocating thread may be another capture's, and which captures' work uses the buffer is
// unknowable, so each keeps it. A free in a window pins the slice too (the captured work
// before the free may use it; a pre-existing buffer freed in the window is "touched" the same
// way) and the slice stays held: it is never handed out again while the window is open, not
// even to the same capture, because two branches of a captured graph may run in parallel on
// replay and reuse inside the window could make them share bytes. Pre-existing buffers the
// window neither hands out nor frees are the program's, as without the library. At the end
// the pins become the graph's PinSet, owned by CUDA through a user object (Note [Graph
// lifetimes]); a failed or invalidated capture gives its pins back at once, and the slices it
// freed take the ordinary free path (their free fence).
//
// Note [Graph lifetimes]
// ~~~~~~~~~~~~~~~~~~~~~~
// CUDA calls a user object's destructor when the last graph, clone, executable graph and
// running launch holding it are gone, on a thread of its own, where no CUDA call is allowed
// and no lock a hot path needs may be taken. post_release() therefore only pushes the pin set
// onto a lock-free stack; the next hook on the device (or the reporter) drains it.
//
// Note [Priming]
// ~~~~~~~~~~~~~~
// A capture that needs more memory than the pools hold calls the driver inside its window
// (legal under the library, which brackets its own calls with relaxed capture mode, but slow,
// and a serving engine or a training loop captures the same sequence again and again). Each
// successful capture leaves a profile: for each exact size, the most slices of it that were
// live at once in the window. Before the next capture on the device begins, prime() tops the
// persistent pool up, with free slices, to the largest profile seen (by bytes): a repeated
// capture then takes everything from memory already held. The largest single profile, not a
// sum or an element-wise maximum of all profiles: graphs of decreasing sizes (one per batch
// size, largest first) leave at most one working set of spare slices, never one per graph.
// Spare slices take at most half of what the device has free when the capture begins: near a
// full device they would take the room an allocation the pools do not serve (graph memory,
// cudaMallocAsync) needs inside the window, and fail it where the plain run succeeds. When that
// half is too small, the pools first give their idle memory back (bounded, as before a host
// function): the capture then finds the room its last run needed, which idle pages of other
// sizes would have kept from it.
// The explicit priming phase (begin(id, true) ... priming_end(id)) serves a warm-up pass run
// before the capture: slices it frees are held until priming ends, so the pool grows to the
// pass's whole working set rather than its transient peak, and the recorded run finds them.
//
// Note [Shared capture memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under capture_share:on the graphs captured on a device share one pool of pinned memory,
// like PyTorch's graph memory pools: a slice freed during (or after) one capture may serve an
// allocation of a later capture, whose graph then uses the same bytes. That is safe only when
// no two of those graphs ever run at the same time (a serving engine capturing one graph per
// batch size and replaying one at a time); then N graphs cost about the largest working set
// instead of the sum. Reuse takes the smallest shared free slice that fits. Within one window
// freed slices still wait for the window's end (Note [Capture windows]). The shared memory is
// released when no graph holding it is left and no capture is open.
//
// Depends on pools/ only.
#include "capture/capture_policy.h"

#include <algorithm>
#include <map>

namespace poolcuda {

// How long a capture begin under capture_share:on waits for its window's fence, so that shared
// slices freed since can serve the capture (as prime() waits for released slices' fences).
constexpr std::uint32_t kSharedFenceWaitMicros = 20000;

struct CapturePolicy::Capture {
  CaptureId id = 0;
  bool priming = false;
  std::unordered_map<DevicePtr, RetainedSlice> pins;  // every slice this capture touched
  std::vector<DevicePtr> freed_while_priming;
  std::map<std::uint64_t, std::uint64_t> live;  // effective size -> slices live in the window
  std::map<std::uint64_t, std::uint64_t> peak;  // effective size -> most live at once
};

struct CapturePolicy::SharedSlice {
  RetainedSlice pin;
  std::uint64_t size = 0;
  bool program_holds = true;     // live in the program's hands
  bool freed_in_window = false;  // freed in an open window: reusable after it
};

CapturePolicy::CapturePolicy(MemoryManager& manager, CaptureOptions options)
    : manager_(manager), options_(options) {}

CapturePolicy::~CapturePolicy() = default;

void CapturePolicy::prime() {
  CaptureProfile profile;
  {
    std::lock_guard hold(mutex_);
    profile = options_.share ? CaptureProfile{} : largest_profile_;
  }
  if (profile.empty()) {
    manager_.record_window_fence();  // what prime() records first, without its waits
    // Shared slices freed since are handed out again only once that fence has passed
    // (MemoryManager::reissue): as prime() does for released slices, give it a moment.
    bool shared_free = false;
    {
      std::lock_guard hold(mutex_);
      shared_free = !shared_free_.empty();
    }
    if (shared_free) manager_.wait_for_window_fence(kSharedFenceWaitMicros);
    return;
  }
  bool short_of_room = false;
  std::uint64_t added = manager_.prime(profile, &short_of_room);
  // Idle pages first, while no window is open yet: what the last capture needed is better spent
  // on its spare slices than on memory no one uses (Note [Priming]).
  constexpr std::uint32_t kRoomMicros = 100000;
  if (short_of_room && manager_.give_back_all(kRoomMicros) != GiveBack::nothing)
    added += manager_.prime(profile);
  std::lock_guard hold(mutex_);
  stats_.primed_bytes += added;
}

void CapturePolicy::begin(CaptureId id, bool explicit_priming) {
  std::lock_guard hold(mutex_);
  if (captures_.count(id) != 0) return;
  auto capture = std::make_unique<Capture>();
  capture->id = id;
  capture->priming = explicit_priming;
  captures_.emplace(id, std::move(capture));
  manager_.set_capture_window(true);
  open_.fetch_add(1, std::memory_order_acq_rel);
}

// The slices the warm-up freed become free again (through their fence) and can serve the
// recorded run; those it still holds stay pinned: the recorded run may use them.
void CapturePolicy::finish_priming(Capture& c) {
  if (!c.priming) return;
  c.priming = false;
  std::vector<RetainedSlice> released;
  for (DevicePtr ptr : c.freed_while_priming) {
    auto pin = c.pins.find(ptr);
    if (pin == c.pins.end()) continue;
    released.push_back(pin->second);
    c.pins.erase(pin);
  }
  c.freed_while_priming.clear();
  release_pins(released);
}

bool CapturePolicy::is_open(CaptureId id) const {
  std::lock_guard hold(mutex_);
  return captures_.count(id) != 0;
}

void CapturePolicy::priming_end(CaptureId id) {
  std::lock_guard hold(mutex_);
  auto it = captures_.find(id);
  if (it != captures_.end()) finish_priming(*it->second);
}

void CapturePolicy::touch_allocation(DevicePtr ptr, std::uint64_t size) {
  const std::uint64_t eff = align_up(size, manager_.alignment());
  for (auto& [id, capture] : captures_) {
    Capture& c = *capture;
    if (c.pins.count(ptr) == 0) c.pins.emplace(ptr, manager_.retain(ptr));
    std::uint64_t& live = c.live[eff];
    ++live;
    c.peak[eff] = std::max(c.peak[eff], live);
  }
}

Reservation CapturePolicy::allocate(std::uint64_t size) {
  std::lock_guard hold(mutex_);
  if (captures_.empty()) return manager_.allocate(size);
  if (options_.share) return allocate_shared(size);
  const Reservation r = manager_.allocate(size, Placement::persistent);
  if (r.ptr == 0) return r;
  touch_allocation(r.ptr, size);
  ++stats_.window_allocations;
  if (r.grew) ++stats_.from_driver;
  return r;
}

FreeOutcome CapturePolicy::free(DevicePtr ptr, StreamToken stream) {
  std::lock_guard hold(mutex_);
  if (shared_.count(ptr) != 0) return free_shared(ptr, !captures_.empty(), stream);
  if (captures_.empty()) return manager_.free(ptr, stream);
  if (options_.share) return free_shared(ptr, true, stream);
  // Every open capture pins it (a pre-existing slice is touched now).
  for (auto& [id, capture] : captures_) {
    if (capture->pins.count(ptr) != 0) continue;
    const RetainedSlice pin = manager_.retain(ptr);
    if (!pin) return manager_.free(ptr, stream);  // not a live slice: the manager says what it is
    capture->pins.emplace(ptr, pin);
  }
  const std::uint64_t eff = manager_.pinned_size(captures_.begin()->second->pins.at(ptr));
  const FreeOutcome outcome = manager_.free(ptr, stream);
  if (outcome != FreeOutcome::freed) return outcome;
  for (auto& [id, capture] : captures_) {
    if (!capture->priming) continue;
    // A warm-up's free makes room for its later allocations: the profile keeps its peak.
    capture->freed_while_priming.push_back(ptr);
    auto live = capture->live.find(eff);
    if (live != capture->live.end() && live->second > 0) --live->second;
  }
  return outcome;
}

PinSet* CapturePolicy::end(CaptureId id, bool ok) {
  std::lock_guard hold(mutex_);
  auto it = captures_.find(id);
  if (it == captures_.end()) return nullptr;
  std::unique_ptr<Capture> c = std::move(it->second);
  captures_.erase(it);
  finish_priming(*c);  // priming never ended: as priming_end would
  manager_.set_capture_window(false);
  open_.fetch_sub(1, std::memory_order_acq_rel);
  if (ok) {
    ++stats_.captures;
  } else {
    ++stats_.failed_captures;
  }

  if (options_.share) {
    for (auto& [ptr, slice] : shared_) {
      if (!slice->freed_in_window || !captures_.empty()) continue;
      slice->freed_in_window = false;
      shared_free_.emplace(slice->size, ptr);
    }
    if (!ok) {
      release_shared_if_unused();
      return nullptr;
    }
    ++shared_graphs_;
    auto* set = new PinSet{this, {}, 0, true, nullptr};
    graphs_.insert(set);
    return set;
  }

  std::vector<RetainedSlice> pins;
  pins.reserve(c->pins.size());
  for (const auto& [ptr, pin] : c->pins) pins.push_back(pin);
  if (ok) {
    // The capture's profile: its peak of live slices per size (Note [Priming]).
    std::uint64_t bytes = 0;
    CaptureProfile profile;
    for (const auto& [eff, count] : c->peak) {
      profile.emplace_back(eff, count);
      bytes += eff * count;
    }
    if (bytes > largest_profile_bytes_) {
      largest_profile_ = std::move(profile);
      largest_profile_bytes_ = bytes;
    }
  }
  if (!ok || pins.empty()) {
    release_pins(pins);
    return nullptr;
  }
  auto* set = new PinSet{this, std::move(pins), 0, false, nullptr};
  for (const RetainedSlice& pin : set->pins) set->bytes += manager_.pinned_size(pin);
  graphs_.insert(set);
  return set;
}

void CapturePolicy::release_pins(std::vector<RetainedSlice>& pins) {
  for (const RetainedSlice& pin : pins) manager_.release_retained(pin);
  pins.clear();
}

void CapturePolicy::release(PinSet* set) {
  if (set == nullptr) return;
  std::unique_ptr<PinSet> owned(set);
  std::lock_guard hold(mutex_);
  if (graphs_.erase(set) == 0) return;  // from before a device reset: nothing left to release
  if (set->shared) {
    if (shared_graphs_ > 0) --shared_graphs_;
    release_shared_if_unused();
    return;
  }
  release_pins(set->pins);
}

void CapturePolicy::post_release(PinSet* set) noexcept {
  PinSet* head = pending_.load(std::memory_order_relaxed);
  do {
    set->next_release = head;
  } while (!pending_.compare_exchange_weak(head, set, std::memory_order_release,
                                           std::memory_order_relaxed));
}

void CapturePolicy::drain_releases() {
  PinSet* set = pending_.exchange(nullptr, std::memory_order_acq_rel);
  while (set != nullptr) {
    PinSet* next = set->next_release;
    release(set);
    set = next;
  }
}

// --- Shared capture memory (Note [Shared capture memory]) ----------------------------------------

Reservation CapturePolicy::allocate_shared(std::uint64_t size) {
  const std::uint64_t eff = align_up(size, manager_.alignment());
  for (auto it = shared_free_.lower_bound(eff); it != shared_free_.end(); ++it) {
    SharedSlice& slice = *shared_.at(it->second);
    if (!manager_.reissue(slice.pin, size)) continue;
    slice.program_holds = true;
    const DevicePtr ptr = it->second;
    shared_free_.erase(it);
    ++stats_.window_allocations;
    return Reservation{ptr, {}, false};
  }
  const Reservation r = manager_.allocate(size, Placement::persistent);
  if (r.ptr == 0) return r;
  auto slice = std::make_unique<SharedSlice>();
  slice->pin = manager_.retain(r.ptr);
  slice->size = manager_.pinned_size(slice->pin);
  shared_.emplace(r.ptr, std::move(slice));
  shared_count_.store(shared_.size(), std::memory_order_release);
  ++stats_.window_allocations;
  if (r.grew) ++stats_.from_driver;
  return r;
}

FreeOutcome CapturePolicy::free_shared(DevicePtr ptr, bool in_window, StreamToken stream) {
  auto it = shared_.find(ptr);
  if (it == shared_.end()) {
    // A buffer from before the window, freed in it: the graph may use it, so it joins.
    const RetainedSlice pin = manager_.retain(ptr);
    if (!pin) return manager_.free(ptr, stream);
    auto slice = std::make_unique<SharedSlice>();
    slice->pin = pin;
    slice->size = manager_.pinned_size(pin);
    it = shared_.emplace(ptr, std::move(slice)).first;
    shared_count_.store(shared_.size(), std::memory_order_release);
  } else if (!it->second->program_holds) {
    return manager_.free(ptr, stream);  // already freed: the manager classifies it (double free)
  }
  const FreeOutcome outcome = manager_.free(ptr, stream);
  if (outcome != FreeOutcome::freed) return outcome;
  SharedSlice& slice = *it->second;
  slice.program_holds = false;
  if (in_window) {
    slice.freed_in_window = true;
  } else {
    shared_free_.emplace(slice.size, ptr);
  }
  return outcome;
}

void CapturePolicy::release_shared_if_unused() {
  if (shared_graphs_ != 0 || !captures_.empty()) return;
  for (auto& [ptr, slice] : shared_) manager_.release_retained(slice->pin);
  shared_.clear();
  shared_free_.clear();
  shared_count_.store(0, std::memory_order_release);
}

// --- Reset and stats -----------------------------------------------------------------------------

void CapturePolicy::forget() {
  std::lock_guard hold(mutex_);
  for (std::size_t i = 0; i < captures_.size(); ++i) manager_.set_capture_window(false);
  open_.store(0, std::memory_order_release);
  captures_.clear();
  graphs_.clear();  // their pin sets come back to release() as no-ops, or never
  shared_.clear();
  shared_free_.clear();
  shared_count_.store(0, std::memory_order_release);
  shared_graphs_ = 0;
}

CaptureStats CapturePolicy::stats() const {
  std::lock_guard hold(mutex_);
  CaptureStats s = stats_;
  s.open_captures = captures_.size();
  s.graphs = graphs_.size();
  for (const PinSet* set : graphs_) {
    s.pinned_slices += set->pins.size();
    s.pinned_bytes += set->bytes;
  }
  for (const auto& [ptr, slice] : shared_) s.shared_bytes += slice->size;
  s.profile_bytes = largest_profile_bytes_;
  return s;
}

ReportSection describe(const CaptureStats& stats) {
  ReportSection section{"capture", "capture", {}, {}, {}};
#define POOLCUDA_CAPTURE_FIELD(member, label, unit, detail) \
  section.add(#member, label, ReportValue::of(Unit::unit, stats.member), Detail::detail);
  POOLCUDA_CAPTURE_NUMBERS(POOLCUDA_CAPTURE_FIELD)
#undef POOLCUDA_CAPTURE_FIELD
  return section;
}

}  // namespace poolcuda
