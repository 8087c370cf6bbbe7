// The per-device MemoryManager: owns the dynamic pools and the persistent pool of one device,
// routes each reservation (persistent windows, the `persistent` setting, spill from a full
// capped pool), indexes live slices by device pointer, applies free fences, trims idle pages
// and recovers from out-of-memory. Thread-safe: the pools are split into shards, each with its
// own lock, and threads that keep reserving beside each other move to shards of their own (Note
// [Shards] in manager_shards.cpp); allocate and free first try the calling thread's cache
// (Note [Thread caches] in manager_caches.cpp); the interposer adds no lock of its own on the
// hot path.
//
// Depends on pools/ only; the Device it is given is the only way it reaches hardware.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pools/options.h"
#include "pools/device.h"
#include "pools/report.h"
#include "pools/types.h"
#include "pools/wait_bound.h"

namespace poolcuda {

// Explicit allocation mode, as in the seed: Persistent opens a window, Auto closes one.
enum class AllocationMode : std::uint8_t { automatic, persistent };

// Where one reservation must come from: `automatic` routes by the settings and open windows;
// `persistent` forces the exact-fit persistent pool (memory for a graph capture).
enum class Placement : std::uint8_t { automatic, persistent };

// The most shards a manager's pools split into (ManagerOptions::shards).
inline constexpr std::uint32_t kMaxShards = 8;

// What MemoryManager::give_back_all() did.
enum class GiveBack : std::uint8_t { nothing, done, timed_out };

// Receives the manager's log lines (spill warnings, out-of-memory breakdowns, per-allocation
// traces under log:full). Called after the manager's lock is released, from the thread whose
// call produced the line.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

struct ManagerOptions {
  int device_index = 0;
  PoolLayout layout;
  PersistentMode persistent = PersistentMode::enabled;
  FreeFence free_fence = FreeFence::automatic;
  // Frees per epoch before the epoch is closed even without a miss (Note [Free fences]).
  std::uint32_t fence_batch = 256;
  // Bytes that may wait on free fences before a miss waits for the oldest fence instead of
  // growing a pool: the bound is max(fence_slack, bytes in use / 8). 0 leaves only the share
  // of the bytes in use (Note [Free fences]).
  std::uint64_t fence_slack = 64 * MiB;
  // A free records a fence at once when none was recorded for this long (Note [Free fences]);
  // tests that count epochs set it out of reach.
  std::uint64_t prompt_fence_nanos = 1000000;
  // The most out-of-memory recovery waits, in all, for free fences and for released pages to
  // reach the driver, before it gives up (Note [Recovery and parked streams]); tests of the bound
  // set it short.
  std::uint32_t recovery_wait_micros = 10000000;
  // The most bytes the pools keep reserved, in hundredths of the most bytes the program has had
  // in use: before a growth would go over it, idle pages go back (Note [Held memory bound]).
  // 0: no bound, so that tests of other rules see them alone; the library's default is
  // kDefaultHoldPercent.
  std::uint32_t hold_percent = 0;
  // Each thread keeps a few freed slices for its own next requests of the same size
  // (Note [Thread caches] in manager_caches.cpp); only while frees need no fence.
  bool thread_cache = false;
  // The most shards the pools split into (1 to kMaxShards): threads that keep reserving beside
  // each other move to shards of their own (Note [Shards] in manager_shards.cpp). A layout with
  // a capped pool, persistent:enforced and size-match keep one.
  std::uint32_t shards = 1;
  LogLevel log = LogLevel::basic;
  LogSink log_sink;  // empty: write to stderr prefixed "poolcuda: "
  // Where a reservation's final out-of-memory goes (what the pools held, one line), instead of
  // the log: a caller that tries the driver next says it only if the driver refuses too.
  std::function<void(std::string message)> refusal_sink;
};

// A pin on one slice (MemoryManager::retain). Opaque; valid until released or until forget().
struct RetainedSlice {
  DevicePtr ptr = 0;
  std::uint64_t generation = 0;
  void* node = nullptr;
  std::uint32_t shard = 0;
  explicit operator bool() const { return ptr != 0; }
};

// One device allocation a manager holds (test inspection).
struct PageView {
  DevicePtr base = 0;
  std::uint64_t size = 0;
};

// Where a pointer lies in a manager's pages (MemoryManager::locate).
struct PointerPlace {
  bool pooled = false;       // in one of the manager's pages; the rest is 0 when not
  DevicePtr page_base = 0;   // the page: the device allocation the driver knows
  std::uint64_t page_size = 0;
  DevicePtr allocation = 0;  // the start of the live allocation holding the pointer, 0 if none
  std::uint64_t allocation_size = 0;  // the bytes the program asked for there (its padding not)
  bool page_in_use = false;  // whether any allocation in the page is live
};

struct Reservation {
  DevicePtr ptr = 0;
  Error error;        // set when ptr == 0
  bool grew = false;  // a page was taken from the device for this reservation
};

// Exact sizes and how many slices of each a graph capture needed (its priming profile).
using CaptureProfile = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

class MemoryManager {
 public:
  // `device` must outlive the manager. The layout is resolved against the device's total
  // memory and alignment; a layout that parse_config accepted never fails here.
  MemoryManager(Device& device, const ManagerOptions& options);
  ~MemoryManager();  // releases nothing: see forget() and Note [Exit]
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  // Reserves `size` bytes. A size of 0 or above 2^62 is ErrorKind::buffer_too_big and changes
  // nothing. On device out-of-memory: unless the request exceeds even the driver's free memory
  // plus every pooled byte no live slice uses (then it fails at once), every idle page is
  // returned, then pending free fences are waited for, oldest first, retrying after each, for a
  // bounded time; only then ErrorKind::out_of_memory. Never holds the lock while it waits
  // (Note [Outside the lock], Note [Recovery and parked streams]).
  Reservation allocate(std::uint64_t size, Placement placement = Placement::automatic);

  // Frees by device pointer. Anything but `freed` changes nothing. A free in the order of
  // `stream` (cudaFreeAsync) waits for that stream alone under fenced reuse (Note
  // [Stream-ordered frees] in memory_manager.cpp).
  FreeOutcome free(DevicePtr ptr, StreamToken stream = kNoStream);

  // The requested size of the live slice starting at `ptr`, or 0 when there is none.
  std::uint64_t live_size(DevicePtr ptr) const;

  // The page that holds `ptr` (start or inside) and the live allocation there, if any; a slice
  // parked in a thread cache is freed memory, not an allocation.
  PointerPlace locate(DevicePtr ptr) const;

  // Persistent windows nest: persistent opens one, automatic closes one. Ignored under the
  // `disabled` and `enforced` settings.
  void set_mode(AllocationMode mode);

  // A stream capture opens (true) or ends (false) on the device; they nest. While one is open,
  // every reservation comes from the persistent pool whatever the settings, no idle page is
  // released on the allocation path, and no reservation waits for a fence.
  void set_capture_window(bool open);

  // Replaces the dynamic pools (after an explicit cleanup) when none of their slices is live;
  // otherwise ErrorKind::pools_in_use and nothing changes. Resets high-water marks.
  Error install_layout(const PoolLayout& layout);

  // Returns idle pages to the device: all of them when `explicit_cleanup`, else only those idle
  // for longer than their pool's dealloc period.
  void cleanup(bool explicit_cleanup);

  MemoryUsage memory_usage() const;

  // The alignment of every slice (the device's; constant).
  std::uint64_t alignment() const;

  // Bytes of whole pages that no one uses and no fence protects, counting pages that only
  // thread caches' parked slices keep: what cudaMemGetInfo may add to "free" under
  // memgetinfo:pooled.
  std::uint64_t idle_bytes() const;
  // idle_bytes(), once the memory whose free fences have passed is back (the open epoch closed
  // first, and its fences waited for a moment), with the pages whose memory all waits for a
  // batch's fence (Note [Memory info after a free] in manager_api.cpp): what a memory query
  // reports as free.
  std::uint64_t idle_bytes_now();

  ManagerReport report() const;

  // cudaDeviceReset: the device's memory is gone; drop every page and slice without calling
  // Device::release. The fence of every closed free-fence epoch is passed to
  // Device::fence_destroy (the device's records of it would leak otherwise; the driver object
  // may already be gone with the reset, so fence_destroy must not need it); no other Device
  // method is called. The manager stays usable (empty) afterwards.
  void forget();

  // Under free_fence:auto: whether every piece of work that can touch the device's memory runs
  // in one ordered queue (the interposer decides: Note [Stream-ordered reuse] in
  // interpose/stream_order.cpp). While it does, a free returns its slice at once, without a
  // fence; otherwise frees are fenced as under events. Starts false. Setting it false is a
  // barrier: it returns only once every free that saw it true has finished.
  void set_stream_ordered(bool ordered);

  // While frozen, no reservation takes a new page from the device (it fails with
  // ErrorKind::device_error instead, and the interposer passes the request to the driver): a
  // device reset in progress would free that page behind the pools' back. Freezes nest.
  void set_frozen(bool frozen);

  // --- Additions beyond the first interface ----------------------------------------------------

  // Pins the live slice that starts at `ptr` (used by graph capture): while pinned, a free of
  // that pointer succeeds but the slice is "held" (still counted in use) and is never handed
  // out again; releasing its last pin sends it through the free fence. Pins nest. Returns an
  // empty handle when `ptr` is not the start of a live slice.
  RetainedSlice retain(DevicePtr ptr);

  // Drops one pin taken by retain(). Returns false (and changes nothing) for an empty handle or
  // one taken before forget().
  bool release_retained(const RetainedSlice& pin);

  // Tops up the persistent pool so that it holds, free, at least `count` slices of the
  // effective size of each `size` in the profile: new pages from the device, handed to no one.
  // A graph capture begins with this, so that its window finds the memory it will ask for
  // (Note [Priming] in capture/capture_policy.cpp). Returns the bytes added; stops at the first
  // page the device refuses.
  // `short_of_room` (when not null) is set when the device's free memory stopped it: half of
  // what is free is the most it adds (Note [Priming] in capture/capture_policy.cpp).
  std::uint64_t prime(const CaptureProfile& profile, bool* short_of_room = nullptr);
  // Records the fence that a capture's window, about to open, gives the slices graphs release
  // in it (Note [Releases inside a window] in manager_api.cpp); prime() records it too. No
  // fence while a capture is open on the device.
  void record_window_fence();
  // Waits, within `budget_us`, for the fence the last capture begin recorded before its window
  // opened (record_window_fence()), which the slices graphs release inside a window wait for
  // (Note [Releases inside a window] in manager_api.cpp); true once it has passed and they are
  // back.
  bool wait_for_window_fence(std::uint32_t budget_us);

  // A slice the program freed while `pin` held it ("held") is handed out again, as a live
  // allocation of `requested` bytes (at most its size) at the same address; the pin stays. Not
  // before a window's fence recorded after its free has passed (false then).
  // False, and nothing changes, when the pin is stale, the slice is not held, or it is too
  // small. Shared capture memory (capture_share) reuses held slices this way.
  bool reissue(const RetainedSlice& pin, std::uint64_t requested);

  // The size of the slice a pin holds (0 for an empty or stale pin).
  std::uint64_t pinned_size(const RetainedSlice& pin) const;

  // The program is about to issue work that may park a stream on the host (a host function, a
  // graph launch): the open free-fence epoch, if it holds any free, is closed now, so that its
  // fence lies before that work (Note [Recovery and parked streams]). One relaxed atomic load
  // when it holds none. During a capture the epoch stays open, as on every close.
  void fence_open_frees();

  // Everything the pools keep for no live slice goes back to the device and reaches the driver,
  // within a bound of `max_microseconds` (Note [Stopped processes]): the fences of freed memory
  // are waited for so that it is idle too, every idle page is returned, and the call waits for
  // the pages to reach the driver. For the
  // moments the plain program's own frees would have given that memory back already: before a
  // host function parks a stream (Note [Idle memory before a park] in memory_manager.cpp), and
  // when the driver refuses a cudaMallocAsync. nothing: the pools held nothing idle, pending or
  // on its way back (or a capture is open, or the manager is frozen). timed_out: the bound
  // expired first, or an earlier call's did and nothing moved since (that call's wait is not
  // repeated). Reports count the calls that gave memory back and those that timed out.
  // cudafree_fences: stream-ordered frees whose fences have not passed stay pending.
  GiveBack give_back_all(std::uint32_t max_microseconds,
                         GiveBackWait wait = GiveBackWait::every_fence);

  // Closes the open free-fence epoch and waits (Device::fence_wait) for every closed one, so
  // every pending slice is free again. Blocks: never for the hot path. Returns false when the
  // open epoch could not be closed (the device refused a fence: a capture is open).
  bool drain_fences();
  // drain_fences() within `bound` for every shard together (a stream parked for good holds
  // a fence forever): false when a fence still waits at its end, or the open epoch could not be
  // closed.
  bool drain_fences_within(WaitBound& bound);

  // Whether set_frozen(true) is in force (a device reset is under way).
  bool frozen() const;

  // Between these two another thread gives the pools' memory back for a request they do not
  // serve and retries it: growths wait for it as for an out-of-memory recovery (Note [Growth
  // during a recovery] in manager_recovery.cpp). Every begin needs its end.
  void begin_growth_hold();
  void end_growth_hold();

  // How many slices the program has freed (or released by their last pin), ever, parked ones
  // included (Note [Thread caches]); a later free may already be under way. Takes the lock (to
  // read the caches): not for the hot path.
  std::uint64_t frees() const;

  // Pages released by trimming may still be on their way to the driver (Device::release may
  // hand them to another thread): waits at most `max_microseconds` for them.
  bool flush_releases(std::uint32_t max_microseconds);

  // How many times a miss waited for the oldest free fence because fence-pending bytes exceeded
  // their bound (Note [Free fences]); drain_fences() and the out-of-memory path do not count.
  std::uint64_t fence_waits() const;

  // Of fence_waits(), how many ended because the wait's time bound expired before the fence
  // passed (the reservation then grew a pool instead).
  std::uint64_t fence_wait_timeouts() const;

  // Test inspection, O(pages): every page of every pool, in address order.
  std::vector<PageView> pages() const;

  // Test inspection, O(pages + slices): checks the internal invariants (slices tile their pages,
  // no two free neighbours in a sliced page, free sets and the pointer index match the slices,
  // counters match the slices). Returns an empty string when all hold, else the first breach.
  std::string check_consistency() const;

 private:
  struct Impl;    // one shard
  struct Shards;  // the shards and what routes between them
  // report() takes this many snapshots at most, for one that no change of the shards' pages
  // crossed.
  static constexpr int kReportAttempts = 8;
  ManagerReport report_once() const;  // every shard's snapshot, one after another, added up
  std::unique_ptr<Shards> shards_;
};

}  // namespace poolcuda
