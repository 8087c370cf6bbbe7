// MemoryManager: routing of reservations (persistent windows, the `persistent` setting, dynamic
// pools in order with spill from a full capped pool), the free path (pointer index, pins, free
// fences) and cleanup. Out-of-memory recovery is in manager_recovery.cpp, reports and
// consistency checks in manager_inspect.cpp. Depends on pools/ only; the Device is its only way
// to the hardware.
//
// Note [Free fences]
// ~~~~~~~~~~~~~~~~~~
// A program may free a buffer that a kernel on another stream still uses: the real cudaFree
// waits for the device, so that was safe before the pools. Handing such a slice to the next
// reservation at once would let two kernels share bytes. Under FreeFence::events a free
// therefore (1) removes the slice from the pointer index at once, so a second free is a
// detected double free; (2) marks it pending: its bytes are neither in use nor idle
// (pending_fence_bytes in the report); and (3) appends it to the open epoch (FenceQueue, an
// intrusive chain: no allocation per free). The open epoch is closed, by recording one
// Device fence after all work issued so far, when it holds options.fence_batch frees, or a
// quarter of fence_slack bytes (at least 1 MiB: early fences are usually passed by the time the
// bound below needs their memory), or when a reservation misses (cannot be served from free
// memory by the pool routing picked, i.e. just before a pool would grow or the reservation
// would fail for capacity). If fence_record()
// returns kNoFence (a capture is open) the epoch simply stays open. Closed epochs are reaped,
// oldest first, when an epoch closes and on every miss before growing: a passed fence returns
// its slices to their pools, which coalesce them. Reaping only queries (fence_passed), never
// blocks; when a miss reaped something, routing restarts so the returned memory is used before
// the device is asked for more. FreeFence::sync calls Device::synchronize() and frees at once;
// FreeFence::none frees at once (single-stream programs, measurements). FreeFence::automatic
// frees at once while the interposer says the device's work is one ordered queue
// (set_stream_ordered; Note [Stream-ordered reuse] in interpose/stream_order.cpp), and as
// under events otherwise.
//
// The bound. Reaping alone cannot keep up with a host that runs far ahead of the device (the
// usual case on a GPU: kernels are queued, not finished). A loop that allocates and frees one
// size then misses every page-full of frees, finds the fence it just recorded not yet passed,
// and grows: without a bound the pool grows for as long as the host stays ahead, every new page
// idle a moment later. So fence-pending bytes are bounded by
//     limit = max(options.fence_slack, bytes in use / 8)
// (the slack lets short bursts run ahead freely; the share of the live set keeps the bound from
// being tiny next to a large working set). When a miss has closed the open epoch and reaped,
// and the pending bytes still exceed the limit, the manager waits for the OLDEST closed epoch
// (fence_wait_for), gives its slices back, reaps whatever else has passed meanwhile and routes
// again; it repeats while the pending bytes exceed the limit and closed epochs remain, and only
// then grows. Waiting on the oldest fence, not on the newest nor on the whole device, is what
// keeps this cheap: that fence was recorded the longest time ago, so the device is most likely
// past it or close to it, the wait is short, and later fences that passed meanwhile come back
// in the same step. The real cudaFree synchronizes the whole device on every call; this waits,
// rarely, for a point the device has (nearly) reached.
// The wait is bounded: at most kFenceWaitBoundMicros (manager_impl.h) in total per
// reservation, longer only while fences keep passing (Note [A host far ahead]); when the bound
// expires the reservation grows as if there were no bound. A real cudaMalloc never waits on
// streams, and a program may park a stream on a host function that only the allocating thread
// will release: an unbounded wait here would deadlock it. The wait happens with the manager's
// lock released (Note [Outside the lock]), so other threads keep allocating meanwhile. While the
// device passes fences the waits keep memory near the bound; when fences do not pass, growth is
// throttled to one page per bound, never stopped.
// fence_slack 0 leaves only the share of the live set: no pool grows while more than an
// eighth of the bytes in use wait on fences (with nothing in use: while any do) and the oldest
// fence passes within the bound. If the miss could not close the open epoch
// (kNoFence: a capture is open) nothing is waited for: the memory freed during the capture has
// no fence to wait on, and blocking a capturing thread for older work would not free it, so the
// pool grows as before. The out-of-memory path waits far longer (oldest fence first, retrying
// the reservation after each, Note [Recovery and parked streams]) and drain_fences() without
// limit: there the program would otherwise fail, and waiting is what the real cudaFree would
// have done at the time of each free.
//
// A capped pool at its cap may hold memory that only waits for its fence: before the cap
// refuses (or spills to a later pool), the miss reclaims passed fences and then waits for the
// oldest one, without a time bound as the real cudaFree of that memory would have, so a program
// that frees as fast as it allocates under a cap never sees memory it already gave back
// refused.
//
// Capture under FreeFence::sync. A device-wide synchronize while a stream capture is open
// would invalidate the capture, so while Device::capture_active() says one is open a free
// under sync retires its slice through the open epoch exactly as under events; the epoch is
// closed and reaped by later misses, cleanups or drain_fences() like any other. Otherwise a
// cudaFree synchronizes after releasing the lock and gives back, in free order, every slice
// freed before its synchronize began; a stream-ordered free is fenced on its stream (Note
// [Stream-ordered frees]), or waits in the open epoch, and only one on a stream the library
// never saw synchronizes.
//
// Note [A host far ahead]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// With kernels of a millisecond and a host that queues them faster, the oldest fence is several
// kernels behind, more than the 2 ms bound: each reservation over the fence bound waited in vain
// and grew a page, and the pools grew as long as the host stayed ahead (1,000 iterations of a
// 1 MiB buffer, a 1 ms kernel and a free on a non-blocking stream reserved 850 MB; eight
// threads with a stream each 1.0 to 1.6 GB; a graph launch loop 285 MB), where the plain run,
// whose cudaFree waits for the device, holds the buffer it uses. Time was the same either way:
// the device was the bottleneck. A device that passed a fence a moment ago is not parked on the
// host, so a reservation that saw a fence pass in the last kFenceProgressNanos (in this shard)
// waits up to kFenceProgressWaitMicros for the oldest one, and after each that passes the
// bound starts again, kFenceProgressTotalMicros per reservation in all: the host keeps pace
// with the device, as the plain one does, while fences keep passing, and the pools stay within
// the fence bound (the same loops: 75 MB, and 75 MB for the graph loop, in the same times).
// The total is short because a batch's fence covers every stream: eight threads each feeding
// its own stream 5 ms kernels waited up to 100 ms per allocation with a total of 100 ms, while
// their own streams ran dry (1.5 to 1.8 times the plain run's time); with 20 ms, 1.1 to 1.3
// times, holding 1.2 GB instead of the 2.3 GB before these waits. When fences stop passing (a
// park, a kernel longer than the window) the first wait may last kFenceProgressWaitMicros, and
// every later one the 2 ms as before.
//
// Note [Stream-ordered frees]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A stream-ordered free (cudaFreeAsync(ptr, s)) promises more than a cudaFree: every use of the
// memory, on any stream, is ordered before the free on s (the program must make other streams'
// uses wait for events s waits on). So once s has run past the free nothing can touch the
// memory, whatever other streams do. An epoch's fence, recorded on every stream, would wait
// also for streams the free never depended on: one parked on a host function for seconds kept
// such memory pending, and an allocation that needed it failed where the plain run succeeded.
// Under fenced reuse such a free therefore records a fence on s alone, at the free, on the
// freeing thread (a per-thread default stream is that thread's), and the slice waits for that
// fence in the FenceQueue's lane of s and that thread (free_fences.h: one token names every
// thread's per-thread stream, and one thread's park must not hold back another's frees). A lane
// names s by its creation (the lane token fence_record_on gives) and the thread by a serial
// number, never by a handle or an address a later stream or thread may be given: a lane's frees
// pass in order only while they are one stream's of one thread, and a new stream on a destroyed
// parked stream's handle queued behind that park. One
// fence per free: a cudaFreeAsync already puts an operation on the stream; so that fences (and
// the driver's events behind them) stay few, at most kMaxLaneFrees frees wait in a shard's
// lanes (at the limit, those whose fences passed are taken back first), and a stream-ordered
// free past them joins the open epoch as a cudaFree's would, as it does when
// Device::fence_record_on cannot record (the stream captures, a capture begun through the hooks
// is open on its device, the stream is unknown). Not one on another device's stream: the epoch
// has no fence on that device, so its own event is recorded past the limit too, and while a
// capture is open there (Note [Frees on another device's stream] in interpose/cuda_device.cpp).
// Fences no longer pass in the order recorded: a cudaFreeAsync never blocks, so its fence may
// lie behind a park of its own stream, older than fences about to pass. So while any lane holds
// a free, a wait for the oldest fence lasts at most kLaneWaitSliceMicros and takes back whatever
// passed meanwhile; an allocation and out-of-memory recovery (also in other shards) route again
// before they wait again, and recovery uses memory a wait returned before it sends idle pages to
// the driver (whose free waits behind any park). give_back_all and drain_fences wait for every
// fence anyway, so for them the order does not matter.
//
// Note [Outside the lock]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The manager's lock is the one lock of the hot path, so nothing that can wait for the device
// runs under it. Each public method holds it through a Scope (manager_scope.cpp) that collects
// pages to hand back to the device and log lines (stderr may be a full pipe). The pages go to
// Device::release as the lock is released, still under it: a page given up before a device
// reset must reach the device before the reset's forget(), never after it, when its address
// may already be a new page of these pools (two pages at one address). So Device::release must
// never block: the CUDA device only queues the page for its release worker, whose driver free
// (which synchronizes the device) runs on a thread of its own. The log lines are written once
// the lock is released. A reservation that must wait for a fence borrows a ticket
// for it (free_fences.h: the fence stays valid while the ticket is out), releases the lock,
// waits, takes the lock again and routes again from scratch, since another thread may have
// changed everything meanwhile; a device reset (forget()) during the wait only makes the ticket
// linger until it is given back. Since Device::release hands the page to another thread, even
// the thread that trims never blocks on a parked stream; only out-of-memory recovery waits,
// bounded, for those releases to reach the driver before it asks the driver again. The lock
// order is in pools/lock_order.h.
//
// Note [Recovery and parked streams]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A program may park a stream on a host function that only it releases, later, and meanwhile
// allocate: the real cudaMalloc never waits on streams, and memory the program freed before the
// park was free at once, since the real cudaFree waited for the device then. Out-of-memory
// recovery waits for free fences, so it must never wait for one recorded behind such a park.
// Three rules keep it so:
// (1) An epoch's fence lies before any host work issued after its frees: the hooks that can
//     park a stream on the host (host functions, graph launches, whose nodes may be host
//     functions) close the open epoch first (fence_open_frees()). A program that frees while
//     a stream is parked would block in the real cudaFree, so no free of a working program
//     falls between a park and its release; every epoch's fence a recovery meets was recorded
//     before every park still in place, and passes once the work issued before it has run,
//     which is what the real cudaFree would have waited for at the time of the free. (A
//     cudaFreeAsync on a parked stream is the exception: its own fence waits for that park, as
//     the plain call's memory would; waits take it a slice at a time, Note [Stream-ordered
//     frees].)
// (2) A request that even every byte the pools keep for no live slice, added to what the
//     driver has free, could not serve fails at once, without closing, flushing or waiting
//     (beyond_reach()): the real cudaMalloc fails at once too.
// (3) The waits are bounded: at most options.recovery_wait_micros (10 s) in all, and 0.2 s
//     more once it passed (a stop of the process can cost the bound again: Note [Stopped
//     processes]), for fences and for released pages to reach the driver (their free waits for
//     the device as the plain cudaFree did), far above any wait for work the program issued
//     before its frees. A
//     stream parked in a way no hook sees (a kernel spinning on host memory, a driver-level
//     stream wait) can then cost an allocation the bound and fail it, where the real
//     cudaMalloc would have succeeded, but never hang it.
// Pages are another matter: see Note [Idle memory before a park].
//
// Note [Idle memory before a park]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Returning an idle page goes through the real cudaFree, which synchronizes the device, so
// while a stream is parked no page reaches the driver: recovery's flush expires, and a request
// that needs the memory of idle pages fails where the plain run, whose frees reached the driver
// before the park, succeeds. No documented CUDA call returns cudaMalloc memory without that
// synchronization, so the pages must be back before the park begins: before a host function is
// passed on, give_back_all() waits for the fences of freed memory, returns every idle
// page and waits for the pages to reach the driver. That is the synchronization the plain run's
// own frees made, paid once per host function instead of once per free, and only when the
// pools hold something idle, fence-pending or on its way back; a program that launches host
// functions without freeing in between pays nothing. The wait is bounded (a stream parked
// earlier would hold it forever; the plain call would not wait at all): past the bound the host
// function goes on and the remaining pages reach the driver when the device gets to them.
// Stream-ordered frees are not waited for: the plain cudaFreeAsync gives its memory to the
// stream-ordered pool when the stream gets there, never to the driver before a park, and one
// behind a park of its own stream (which may never pass while the program runs) made every
// later host function pay the whole bound again (GiveBackWait::cudafree_fences). For the same
// reason pages that went idle when a stream-ordered free gave back their last slice stay, the
// newest first, up to a 64th of the device (GiveBackWait::before_park): a loop of cudaMalloc, a
// kernel, cudaFreeAsync and a host function on the legacy stream returned its page to the driver
// and took a new one every iteration, twice the plain loop's time on the stand-in, and a device
// synchronize each time on a GPU. Not more: once the stream has passed the free, the plain
// program's memory is the driver's, and a request during the park that needed a kept page of
// 160 MiB on a 256 MiB device failed after 10 seconds (the page's free waited for the park).
// Graph launches, whose nodes may be host functions too, only close the open epoch: waiting for
// the device before every launch would undo what graphs are for.
//
// Note [Give-backs behind a stuck release]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The release thread frees one page at a time. Once a stream is parked, the driver's free of a page
// waits for the park, and every page queued after it waits behind it. A give-back before a host
// function whose flush ran out (its bound: a second) with a page inside the driver's free remembers
// that page; while it is inside still (or a growth's wait found it stuck), the give-back before a
// later host function returns at once, without waiting for a flush that cannot end sooner, and
// keeps its idle pages: queued behind the stuck one, they reached neither the driver nor the
// program until the park ended (a stream parked for a whole run, and a host function on another
// stream each round, lost a round's pages each time: a 96 MiB device refused 1,104 requests that
// plain CUDA served, with all of it on its way to the driver). A give-back for a request CUDA
// refused still gives its pages and waits its whole bound (ten seconds): the park may end
// meanwhile, and the request then gets the memory, as plain CUDA's would. Waiting only when
// nothing had moved since was not enough: a program that allocated, freed with cudaFreeAsync on
// a stream of its own and queued a host function there, beside a stream parked on another host
// function, moved something every time, and each host function waited the whole second (16 of
// them took 15 seconds, against 0.01 without the library).
//
// Note [Exit]
// ~~~~~~~~~~~
// The destructor releases nothing. A manager lives as long as the process; at exit the CUDA
// runtime may already be torn down, so releasing pages would call into a dead driver, and the
// process's memory goes away anyway. Tests that check for leaks free every slice and run an
// explicit cleanup first.
#include "pools/memory_manager.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <new>
#include <thread>
#include <vector>
#include <cstdio>

#include "pools/options.h"
#include "pools/report_tree.h"
#include "pools/layout.h"
#include "pools/manager_shards.h"
#include "pools/sliced_pool.h"
#include "pools/split_pool.h"

namespace poolcuda {

bool flush_within(Device& device, WaitBound& bound) {
  return bound.retry([&] { return device.flush_releases(bound.left_micros()); });
}

MemoryManager::Impl::Impl(Device& d, const ManagerOptions& o)
    : device(d), options(o), ctx(d) {
  ctx.index = &index;
  total_memory = device.memory_info().total_bytes;
  ctx.total_memory = total_memory;
  ctx.hold_percent = options.hold_percent;
  persistent = std::make_unique<PersistentPool>(ctx);
  build_pools(options.layout);
  update_cache_gate();
  // The first growth's records: the first chunks' allocation and page faults were a fifth of a
  // process's first cudaMalloc through the library. Without host memory now, that growth tries
  // again.
  try {
    ctx.pages.make_first_chunk();
    ctx.slices.make_first_chunk();
  } catch (const std::bad_alloc&) {
  }
}

MemoryManager::Impl::~Impl() {
  for (const auto& cache : caches) cache->manager_gone.store(true, std::memory_order_release);
}

void MemoryManager::Impl::build_pools(const PoolLayout& layout) {
  pools.clear();
  for (const PoolSpec& spec : resolve_layout(layout, total_memory, ctx.alignment)) {
    switch (spec.kind) {
      case PoolKind::sliced:
        pools.push_back(std::make_unique<SlicedPool>(ctx, spec.page_size, spec.max_slice_size,
                                                     spec.cap, spec.dealloc_period));
        break;
      case PoolKind::exclusive:
        pools.push_back(
            std::make_unique<ExclusivePool>(ctx, spec.max_alloc_size, spec.dealloc_period));
        break;
      case PoolKind::split:
        pools.push_back(
            std::make_unique<SplitPool>(ctx, spec.max_alloc_size, spec.dealloc_period));
        break;
      case PoolKind::direct:
        pools.push_back(std::make_unique<DirectPool>(ctx, spec.reclaim_at));
        break;
    }
  }
  capacity_warned.assign(pools.size(), false);
  options.layout = layout;
}

void MemoryManager::Impl::drop_everything() {
  for (const auto& cache : caches) {
    std::lock_guard hold(cache->lock);
    cache->clear();
  }
  fences.forget(device);
  for (const auto& [ptr, held] : held_fences) device.fence_destroy(held.fence);
  held_fences.clear();
  index.clear();
  pools.clear();
  persistent.reset();
  ctx.page_set.clear();
  ctx.slices.reset();
  ctx.pages.reset();
  ctx.next_deadline = kNever;
  // Its pages went with the device's memory (borrowed ones included: the lender no longer
  // counts them).
  if (ctx.device_reserved != nullptr) ctx.device_reserved->remove(ctx.totals.reserved);
  ctx.totals = {};
  in_use_published.store(0, std::memory_order_relaxed);
  persistent = std::make_unique<PersistentPool>(ctx);
  build_pools(options.layout);
  sync_head = sync_tail = nullptr;
  sync_returned = sync_added;
  recent_frees.fill(0);
  window_epoch = 0;
  ++generation;
}

MemoryUsage MemoryManager::Impl::usage() const {
  MemoryUsage total = persistent->usage();
  for (const auto& pool : pools) total += pool->usage();
  return total;
}

std::uint64_t MemoryManager::Impl::pending() const {
  std::uint64_t bytes = persistent->pending_bytes();
  for (const auto& pool : pools) bytes += pool->pending_bytes();
  return bytes;
}

std::uint64_t MemoryManager::Impl::idle() const {
  std::uint64_t bytes = persistent->idle_page_bytes();
  for (const auto& pool : pools) bytes += pool->idle_page_bytes();
  return bytes;
}

std::uint64_t MemoryManager::Impl::free_bytes() const {
  std::uint64_t bytes = persistent->free_bytes();
  for (const auto& pool : pools) bytes += pool->free_bytes();
  return bytes;
}

// --- Routing -------------------------------------------------------------------------------------

bool MemoryManager::Impl::reclaim_on_miss(bool* refused) {
  if (!fences.any()) return false;
  *refused = fences.open_count() != 0 && !fences.close(device);
  if (!*refused) last_fence_nanos = coarse_nanos();
  if (fences.reap(device, kGiveBack) == 0) return false;
  last_passed_nanos = coarse_nanos();
  return true;
}

std::uint64_t MemoryManager::Impl::fence_limit() const {
  return std::max(options.fence_slack, usage().bytes_in_use / 8);
}

bool MemoryManager::Impl::over_fence_bound() const { return pending() > fence_limit(); }

void MemoryManager::Impl::wait_for_oldest_fence(Scope& scope, std::uint32_t* budget_us,
                                                std::uint32_t* progress_us) {
  const FenceTicket ticket = fences.borrow_oldest();
  if (!ticket) {
    *budget_us = 0;
    return;
  }
  const std::uint64_t waiting = pending();
  const std::uint64_t limit = fence_limit();
  const bool sliced = fences.any_lanes();
  // Note [A host far ahead]: a device that passed a fence a moment ago is not parked.
  const bool progressing = progress_us != nullptr && *progress_us != 0 &&
                           last_passed_nanos != 0 &&
                           coarse_nanos() - last_passed_nanos < kFenceProgressNanos;
  std::uint32_t bound = *budget_us;
  if (progressing) bound = std::max(bound, std::min(*progress_us, kFenceProgressWaitMicros));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  scope.unlock();  // Note [Outside the lock]
  const bool passed =
      device.fence_wait_for(ticket.fence, sliced ? std::min(bound, kLaneWaitSliceMicros) : bound);
  scope.relock();
  const auto spent = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  const auto spent_us = static_cast<std::uint32_t>(
      std::min<std::int64_t>(spent.count(), std::numeric_limits<std::uint32_t>::max()));
  fences.give_back_ticket(device, ticket);
  if (progressing) {
    *progress_us -= std::min(*progress_us, spent_us);
    if (passed) *budget_us = std::min(*progress_us, kFenceWaitBoundMicros);
    else *budget_us = 0;
  } else {
    *budget_us = (passed || sliced) && spent_us < *budget_us ? *budget_us - spent_us : 0;
  }
  if (passed) last_passed_nanos = coarse_nanos();
  ++fence_waits;
  fence_wait_seconds += static_cast<double>(spent.count()) * 1e-6;
  if (!passed) {
    if (sliced) fences.reap(device, kGiveBack);  // other lanes' fences may have passed
    if (*budget_us != 0) return;
    ++fence_wait_timeouts;
    if (options.log == LogLevel::full)
      log(LogLevel::full, "the oldest free fence did not pass within " +
                              std::to_string(kFenceWaitBoundMicros) + " us: growing with " +
                              std::to_string(waiting) + " B pending, bound " +
                              std::to_string(limit) + " B");
    return;
  }
  fences.reap(device, kGiveBack);  // that epoch, and later ones the device passed meanwhile
  if (options.log == LogLevel::full)
    log(LogLevel::full, "waited for the oldest free fence: " + std::to_string(waiting) +
                            " B pending, bound " + std::to_string(limit) + " B, " +
                            std::to_string(pending()) + " B pending after");
}

bool MemoryManager::Impl::wait_for_oldest_fence(Scope& scope, bool until_passed) {
  const FenceTicket ticket = fences.borrow_oldest();
  if (!ticket) return false;
  const bool sliced = !until_passed && fences.any_lanes();
  scope.unlock();  // Note [Outside the lock]
  if (sliced) {
    device.fence_wait_for(ticket.fence, kLaneWaitSliceMicros);
  } else {
    device.fence_wait(ticket.fence);
  }
  scope.relock();
  fences.give_back_ticket(device, ticket);
  fences.reap(device, kGiveBack);
  return true;
}

MemoryManager::Impl::FenceWait MemoryManager::Impl::wait_for_oldest_fence(Scope& scope,
                                                                          WaitBound& bound,
                                                                          bool with_lanes) {
  if (bound.over()) return FenceWait::none;
  const FenceTicket ticket = fences.borrow_oldest(with_lanes);
  if (!ticket) return FenceWait::none;
  const bool sliced = fences.any_lanes();
  scope.unlock();  // Note [Outside the lock]
  // A slice that runs out returns to the caller, which waits again (Note [Stopped processes]).
  const bool passed =
      sliced ? device.fence_wait_for(ticket.fence,
                                     std::min(bound.left_micros(), kLaneWaitSliceMicros))
             : bound.retry([&] { return device.fence_wait_for(ticket.fence, bound.left_micros()); });
  scope.relock();
  fences.give_back_ticket(device, ticket);
  const std::uint64_t reaped = fences.reap(device, kGiveBack);
  if (passed || reaped != 0) return FenceWait::passed;
  return sliced && !bound.over() ? FenceWait::slice : FenceWait::none;
}

// Note [Held memory bound]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Left alone, pools keep every page they ever grew until the device runs short: a program whose
// sizes never repeat (random sizes up to 1 GiB, 6 GiB live) filled the whole 16 GiB stand-in
// device, and would fill a 141 GiB one, where another process may want the memory. So before a
// dynamic pool grows, the device's bytes reserved plus the growth are weighed against
// options.hold_percent of the most bytes the device has had in use, this request included.
// The device's figures are every shard's: this one's exactly, the others' as they last
// published them. A growth publishes at once, and a page one shard lends another counts in the
// borrower's figure before it leaves the lender's (Shards::borrow_page): with the page counted in
// neither for a moment, the lender's thread grew twice into its room, to 1.57 times the live
// bytes of two threads of random sizes up to 1 GiB. Each check sums the bytes in use; the most seen
// at a growth that succeeded is kept (a request the driver refuses never raises it), and no
// shard's own peak is above the device's, so it counts too.
// With other shards, a growth first tries to borrow another shard's idle page (Borrow::only):
// that moves a page and adds nothing to the device's bytes, so no bound is weighed. Else, over
// the bound:
// (1) This shard's idle pages go back, from any dynamic pool and of any age: the smallest that
//     covers the excess alone, or else the largest first. Against oldest first, that made 10%
//     fewer driver allocations on the 1 GiB random traces, for the same bytes.
// (2) Pages on their way to the driver still count (the driver holds them): while the growth
//     would pass the bound with them, it waits for them, at most kHeldWaitBoundMicros per
//     reservation, and routes again.
// (3) If that is not enough and other shards published idle pages, they release theirs the same
//     way, each under its own lock with this one's released (not during a capture window of
//     theirs), and the reservation routes again, up to kHeldTrimsElsewhere times. Meanwhile it
//     claims its growth's room (Shards::held_claims, counted by every other shard's check) until
//     it grows: else another thread's growth took the room the release made, and two threads of
//     random sizes up to 1 GiB reserved 1.59 to 1.65 times their live bytes (1.43 to 1.49 with
//     the claim).
// (4) With several shards, the check and the growth hold the growth gate, so two shards never
//     both grow into the same room. It ranks before a shard's lock (Note [Lock order]): route()
//     only tries it, and when another growth holds it, the reservation takes it with its own
//     lock released and routes once more under it, so no thread waits for another shard's
//     driver call while it holds its own shard's lock. Out-of-memory recovery's routes, which
//     cannot wait there, go on without it when it is busy.
// (5) Nothing more goes back while a release is stuck behind a parked stream (releases_stuck()):
//     it would stick too, where idle it could still serve a request. At most the pages given
//     back before the stuck free was recognized (kStuckReleaseMicros) wait behind the park.
// (6) What a shard publishes before its scope ends (at a growth, so that the next shard's check
//     counts it) includes the pages it gave up in that scope: the device gets them only at the
//     scope's end, after the growth gate has opened. Published without them, another shard's
//     check found neither those pages in this shard's bytes nor on their way to the driver, and
//     grew into their room: two threads of random sizes up to 64 MiB reserved more than 1.5
//     times their live bytes in 3 or 4 runs of 10 (up to 1.55), with 128 MiB of such pages
//     unseen at one growth.
// The bound is never below the peak plus kHeldSlack for each shard made: a program with a few MiB
// in use holds a page of each pool it uses (2 MiB and 8 MiB sliced pages, an exclusive page),
// more than 1.5 times its bytes in use, and without the slack every growth in one pool gave back
// another's idle page, so every cudaMalloc waited for a driver free that drains the device,
// where the plain cudaMalloc never waits (one buffer of 300 KiB, 1.5 MiB or 3 MiB live at a
// time: 1.5 s of 1.6 s inside cudaMalloc, against 1 ms). Each shard holds such pages of its own
// (Note [Shards]), so the slack is per shard: with one for the device, three threads doing the
// same, each in its shard, gave pages back and waited for the driver again. The slack stays
// below half the bytes in use of the benchmark's smallest trace (16 buffers of 512 B to 16 MiB,
// about 100 MiB live), where 64 MiB would have allowed 1.64 times its live bytes; with two
// threads (two shards) that trace's 1.5 times stays the larger figure.
// The bound never refuses a request: with no idle page left (pages that live slices keep,
// padding), the pool grows past it; reports count those growths, the bytes given back, and the
// growths that went ahead before the pages given back reached the driver (step 2's wait ran out).
// Requests that fit an idle page never reach the check, so a program whose sizes repeat pays
// nothing; one whose sizes never repeat pays driver calls for memory. On the 1 GiB random
// trace: 0.25 driver allocations per pair instead of 0.031, for 1.50 times its live bytes
// instead of 2.67; on the ring of 16 buffers of random sizes, 0.0016 instead of 0.0003 for 1.50
// instead of 2.21 (docs/benchmark-results.md).
//
// Note [Wide reuse at the held bound]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An exclusive pool hands a request a free page of at most twice its class (Note [Exclusive
// pages]): wider, the padding is waste, and the page may serve a request of its own size later.
// But when the growth for the request would pass the held bound, that wider idle page is the
// first thing the bound gives back, and the growth then waits for the driver's free of it and
// makes a driver allocation of its own: the device ends up holding less, at the price of two
// driver calls and a wait. With the ring of 16 buffers of 512 B to 16 MiB, a fifth of them in
// the exclusive tail, that was every growth (180 driver allocations and 161 frees in 100,000
// pairs, at 1.50 times the live bytes). So a request whose growth would pass the bound first
// takes an idle page of up to kWideReuseAtBound times its class, within the same two padding
// bounds as any reuse (a 64th of the device a page; a 16th in all, shared by the shards): nothing
// grows, nothing waits, and the bytes reserved stay what they were, so the bound holds as it did. Measured through the library (four runs each): the ring made 69 driver
// allocations instead of 180 and 5.4M pairs a second instead of 4.4M, with two threads 180
// instead of 414 and 3.3M instead of 2.3M, at the same 1.50 times its live bytes with one
// thread; the random traces up to 64 MiB and 1 GiB, the serving and training traces made as
// many driver calls as before or fewer (1 GiB: 24,232 instead of 25,090 in 100,000 pairs).
// Only a growth that passes the bound asks, and only a pool with a free page wider than it
// would reuse (has_wider_free), so below the bound nothing changes. With other shards, such a
// growth next borrows another shard's idle page as wide (Pool::borrow_at_bound), which that
// shard's trim would otherwise give back for it: the ring with two threads, 129 driver
// allocations instead of 168 (five runs each; its pairs a second within the runs' spread), the
// 1 GiB random trace with two threads 13,958 instead of 15,562.
//
// Note [Releases before growth]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Pages the pools give up reach the driver on another thread (the release worker: the driver's free
// synchronizes the device, Note [Release worker]), so a pool can grow while pages it gave up a
// moment earlier are still allocated: the driver then holds both. When pools trim and grow faster
// than that thread frees, the backlog builds up until the device is full: replaying the training
// trace through the library reserved 3.4 times its peak live bytes (the whole 16 GiB stand-in
// device), against 1.24 when the same pools free synchronously. So a reservation that must grow
// while more bytes are on their way to the driver than the fence bound (fence_slack or an eighth of
// the bytes in use) first waits for them to arrive, with the lock released, at most once and within
// the reservation's wait budget (kFenceWaitBoundMicros, shared with fence waits), then routes
// again. Once waits that ran out have seen one release inside the driver's free for
// kStuckReleaseMicros (a free behind a parked stream), no growth waits again while it is still
// inside; this is remembered apart from recovery's (growth_wait_stuck), so out-of-memory recovery,
// whose bound is seconds, still waits for those pages. Any shorter run-out is not remembered: the
// release thread moved on, never got a core, or lost it in the middle of a free, as on a machine
// whose cores the program keeps busy, and the next growth waits again, which gives it one.
// (Remembering every run-out until fewer bytes were on their way stopped all waits under such load,
// and the backlog grew again: with two threads spinning beside it the training trace reached 3.2
// times its peak live bytes; remembering any run-out with one release inside throughout, 2.0.) Each
// device has its own release thread, so the wait is for this device's queued pages only; a run-out
// with none of them left queued (only held back, a free the driver refused during a capture) is not
// remembered. Hits never pay for any of it: only a growth reads the backlog, and it asks whether a
// capture is open only once the backlog is over the bound.

bool MemoryManager::Impl::releases_stuck() {
  return growth_wait_stuck && growth_wait_stuck->stuck &&
         device.release_in_flight() == growth_wait_stuck->release;
}

std::uint64_t MemoryManager::Impl::releases_on_the_way() const {
  std::uint64_t bytes = device.releasing_bytes();
  if (outbox != nullptr)
    for (const PageRelease& page : outbox->releases) bytes += page.size;
  return bytes;
}

std::uint64_t MemoryManager::Impl::reserved_to_publish() const {
  std::uint64_t bytes = ctx.totals.reserved;
  if (outbox != nullptr)
    for (const PageRelease& page : outbox->releases) bytes += page.size;
  return bytes;
}

void MemoryManager::Impl::flush_before_growth(Scope& scope, std::uint32_t* budget_us) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  scope.unlock();  // hands this scope's releases to the device, then Note [Outside the lock]
  const std::uint64_t in_flight = device.release_in_flight();
  const bool flushed = device.flush_releases(*budget_us);
  scope.relock();
  const auto spent = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  *budget_us = spent.count() < *budget_us ? *budget_us - static_cast<std::uint32_t>(spent.count())
                                          : 0;
  // A run-out with none of this device's pages on the way, or while a capture is open (whose
  // growths never wait for releases), says nothing about a parked stream, and is not remembered.
  if (flushed || in_flight == 0 || device.releasing_bytes() == 0 || device.capture_active()) {
    growth_wait_stuck.reset();
    return;
  }
  if (!growth_wait_stuck || growth_wait_stuck->release != in_flight)
    growth_wait_stuck = StuckRelease{in_flight, start, false};
  growth_wait_stuck->stuck =
      Clock::now() - growth_wait_stuck->since >= std::chrono::microseconds(kStuckReleaseMicros);
}

bool MemoryManager::Impl::beyond_reach(std::uint64_t size, std::uint64_t elsewhere) {
  // In this order, a page that reaches the driver between the two reads is counted twice
  // rather than missed: the estimate errs towards trying.
  std::uint64_t releasing = device.releasing_bytes();
  // Pages this scope released (a direct pool's reclaim, just now) go to the device at unlock.
  if (outbox != nullptr)
    for (const PageRelease& page : outbox->releases) releasing += page.size;
  const DeviceMemoryInfo info = device.memory_info();
  if (info.total_bytes == 0) return false;  // unknown: try everything
  const MemoryUsage u = usage();
  const std::uint64_t unused = u.bytes_reserved - u.bytes_in_use - u.bytes_padding;
  return size > info.free_bytes + releasing + unused + elsewhere;
}

std::uint64_t MemoryManager::Impl::pages_handed_everywhere() const {
  if (shards == nullptr) return pages_handed.load(std::memory_order_acquire);
  std::uint64_t n = 0;
  shards->each([&](const Impl& m) { n += m.pages_handed.load(std::memory_order_acquire); });
  return n;
}

namespace {

// Puts a shard's borrow mode back to normal when a route ends.
struct BorrowMode {
  explicit BorrowMode(PoolContext& c) : ctx(c) {}
  ~BorrowMode() { ctx.borrow = PoolContext::Borrow::first; }
  BorrowMode(const BorrowMode&) = delete;
  BorrowMode& operator=(const BorrowMode&) = delete;
  PoolContext& ctx;
};

}  // namespace

// Note [Pages larger than the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A pool list may give a sliced pool pages larger than the device it runs on (a list written for
// an 80 GiB device, run on a 16 GiB one): its growth can never succeed. Routed as any other, every
// request it accepts failed its growth, ran out-of-memory recovery (which gave back the idle pages
// of every other pool, for nothing) and then went to the driver unpooled, with no word of why:
// `sliced(page=1T)` on the 16 GiB stand-in passed every cudaMalloc through and counted each one as
// a recovery that failed. Such a pool is passed over instead, as a full capped pool is, with one
// line per pool and layout for the device (Shards::first_page_warning) saying so: its sizes go to
// the next pool that accepts them, or, when none does, to the driver, as a size no pool accepts
// does, even after a full capped pool (never refused: the plain call may well succeed).
// Recovery sizes the page it makes room for by the first pool that can grow.
void MemoryManager::Impl::warn_page_past_device(std::size_t pool_index) {
  if (capacity_warned[pool_index]) return;
  capacity_warned[pool_index] = true;
  // Each shard has its pools: the device says it once.
  if (shards != nullptr && !shards->first_page_warning(pool_index)) return;
  const Pool& pool = *pools[pool_index];
  log(LogLevel::basic, "memory pool " + std::to_string(pool_index) + " (" +
                           pool.describe().shape + ") has pages larger than the device (" +
                           human_bytes(total_memory) +
                           "): it never grows, and its sizes go to the next pool that accepts "
                           "them or to CUDA unpooled (give it a smaller page).");
}

Route MemoryManager::Impl::route(std::uint64_t size, Placement placement,
                                 std::uint32_t wait_budget_us, bool may_flush,
                                 bool may_wait_recovery, HeldReservation* held_res) {
  const bool persistent_mode = placement == Placement::persistent || windows > 0 ||
                               capture_windows > 0 ||
                               options.persistent == PersistentMode::enforced;
  const bool size_match = options.persistent == PersistentMode::size_match;
  const bool may_wait = wait_budget_us > 0 && capture_windows == 0;
  bool reclaimed = false;
  bool refused = false;
  bool unparked = false;
  bool unparked_own = false;
  bool passed_over = false;  // a pool that accepts the size but can never grow here
  Route r;
  // Before any growth (Note [Free fences]): the first miss closes the open epoch and reaps
  // passed fences; when memory came back, routing starts over. Returns true to start over.
  auto reclaim = [&] {
    if (reclaimed) return false;
    reclaimed = true;
    return reclaim_on_miss(&refused);
  };
  // While fence-pending bytes exceed their bound, a miss waits for the oldest fence instead.
  auto should_wait = [&] {
    return may_wait && !refused && fences.any_closed() && over_fence_bound() &&
           !device.capture_active();
  };
  // While the pages on their way to the driver exceed the same bound, a growth waits for them
  // first (Note [Releases before growth]).
  auto flush_may_help = [&] {
    // Waiting again would only run out again.
    return !releases_stuck() && !device.capture_active();  // last: it asks every stream
  };
  auto should_flush = [&] {
    if (!may_wait || !may_flush || frozen != 0 || releases_on_the_way() <= fence_limit())
      return false;
    return flush_may_help();
  };
  // Another thread's out-of-memory recovery is under way: a growth now would take the memory
  // it is giving back (Note [Growth during a recovery] in manager_recovery.cpp).
  auto should_let_recover = [&] {
    return may_wait_recovery && may_wait &&
           shards->recovering.load(std::memory_order_acquire) != 0;
  };

restart:
  route_capped = nullptr;
  if (persistent_mode || size_match) {
    if (Slice* s = persistent->try_reserve(size)) return Route::served(s);
  }
  if (persistent_mode || (size_match && persistent->has_size(size))) {
    if (reclaim()) goto restart;
    if (should_wait()) return Route::wait();
    if (should_flush()) return Route::flush();
    if (should_let_recover()) return Route::after_recovery();
    r.status = frozen != 0 ? AllocStatus::failed : persistent->grow(size, &r.slice);
    r.grew = r.status == AllocStatus::ok;
    if (r.status != AllocStatus::ok)
      r.error = Error{r.status == AllocStatus::out_of_memory ? ErrorKind::out_of_memory
                                                              : ErrorKind::device_error,
                      size};
    return r;
  }

  Error capacity;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    Pool& pool = *pools[i];
    if (!pool.accepts(size)) continue;
    if (Slice* s = pool.try_reserve(size)) return Route::served(s);
    if (never_grows(pool)) {  // Note [Pages larger than the device]
      warn_page_past_device(i);
      passed_over = true;
      continue;
    }
    if (Error limit = pool.growth_limit(size)) {
      // Or parked in thread caches: the program freed it (Note [Thread caches]).
      if (flush_caches(false, CacheFlush::every, &pool) != 0) goto restart;
      // Memory this pool holds may only be waiting for its fence (Note [Free fences]).
      if (pool.pending_bytes() > 0) {
        if (reclaim()) goto restart;
        if (!refused && fences.any_closed() && capture_windows == 0 && !device.capture_active())
          return Route::wait(true);
      }
      if (!capacity_warned[i]) {
        capacity_warned[i] = true;
        bool later = false;
        bool to_cuda = passed_over;  // Note [Pages larger than the device]
        for (std::size_t j = i + 1; j < pools.size(); ++j) {
          if (!pools[j]->accepts(size)) continue;
          (never_grows(*pools[j]) ? to_cuda : later) = true;
        }
        log(LogLevel::basic,
            "memory pool " + std::to_string(i) + " (" + pool.describe().shape +
                ") is at capacity (first hit at an allocation of " + std::to_string(size) +
                " B); " +
                (later     ? "spilling to the next accepting pool. The plan is short for this "
                             "workload."
                 : to_cuda ? "passing such requests to CUDA unpooled: no pool that can grow "
                             "on this device accepts them (raise the cap or add a pool)."
                           : "refusing: no later pool accepts this size (raise the cap or add a "
                             "pool)."));
      }
      capacity = limit;
      if (route_capped == nullptr) route_capped = &pool;
      continue;
    }
    // The program freed what thread caches park here: the pool takes it back before it grows,
    // all but the slices this thread's cache parked or reused lately (Note [Thread caches]),
    // unless a reclaim bound counts those too.
    if (!unparked) {
      unparked = true;
      if (flush_caches(false, CacheFlush::every, &pool,
                       pool.has_reclaim_bound() ? nullptr : find_thread_cache(id)) != 0)
        goto restart;
    }
    if (reclaim()) goto restart;
    if (should_wait()) return Route::wait();
    if (should_flush()) return Route::flush();
    if (should_let_recover()) return Route::after_recovery();
    // Note [Held memory bound].
    std::unique_lock<RankedMutex> gate;
    BorrowMode borrow_mode(ctx);
    HeldCheck held;
    if (options.hold_percent != 0 && frozen == 0) {
      if (shards != nullptr && shards->count() > 1) {
        // A page another shard lends adds nothing to the device's bytes: no bound to weigh.
        ctx.borrow = PoolContext::Borrow::only;
        r.status = pool.grow(size, &r.slice);
        ctx.borrow = PoolContext::Borrow::never;  // tried: the growth below asks the device
        if (r.status == AllocStatus::ok) {
          // At once, not at unlock: the lender published its share going, and the device's
          // figure must not lose the page meanwhile.
          reserved_published.store(reserved_to_publish(), std::memory_order_relaxed);
          r.grew = true;
          return r;
        }
        if (held_res == nullptr || !held_res->gate_held) {
          gate = std::unique_lock(shards->growth_gate, std::try_to_lock);
          if (!gate && held_res != nullptr) return Route::gate();
        }
      }
      const std::uint64_t claim = held_res ? held_res->claim : 0;
      if (over_held_bound(pool, size, claim)) {
        // Note [Wide reuse at the held bound].
        if (pool.has_wider_free(size)) {
          if (Slice* s = pool.try_reserve_at_bound(size)) return Route::served(s);
        }
        if (shards != nullptr && shards->count() > 1) {
          ctx.borrow = PoolContext::Borrow::only;
          r.status = pool.borrow_at_bound(size, &r.slice);
          ctx.borrow = PoolContext::Borrow::never;
          if (r.status == AllocStatus::ok) {
            reserved_published.store(reserved_to_publish(), std::memory_order_relaxed);
            r.grew = true;
            return r;
          }
        }
      }
      held = trim_to_held_bound(pool, size, claim);
      if (held.releases_count && held_res != nullptr && held_res->budget_us > 0 &&
          capture_windows == 0 && releases_on_the_way() != 0 && flush_may_help())
        return Route::flush_for_held_bound();
      if (held.over_by != 0 && held.may_release && held_res != nullptr &&
          held_res->trims_elsewhere < kHeldTrimsElsewhere && shards->count() > 1 &&
          shards->idle_elsewhere(shard_index))
        return Route::trim_elsewhere(held.over_by, pool.growth_bytes(size));
    }
    ctx.growth_room = std::min(held.room, device.growth_room());  // Note [Wider pages]
    r.status = frozen != 0 ? AllocStatus::failed : pool.grow(size, &r.slice);
    ctx.growth_room = Device::kNoGrowthLimit;
    r.grew = r.status == AllocStatus::ok;
    if (r.grew) {
      if (held.overrun) ++held_overruns;  // a growth the device refused took nothing past it
      if (held.over_by == 0 && held.releases_count) ++held_early_growths;
      if (held.peak_in_use != 0 && shards != nullptr) {
        // Before the gate opens: the next shard's check counts this growth, and no longer the
        // room this reservation claimed for it.
        reserved_published.store(reserved_to_publish(), std::memory_order_relaxed);
        sample_device_peaks();
        shards->note_held_peak(held.peak_in_use);
        if (held_res != nullptr && held_res->claim != 0) {
          shards->held_claims.fetch_sub(held_res->claim, std::memory_order_relaxed);
          held_res->claim = 0;
        }
      }
      return r;
    }
    // The device is full: this thread's own parked slices are memory the plain program freed.
    if (r.status == AllocStatus::out_of_memory && !unparked_own) {
      unparked_own = true;
      if (flush_caches(false, CacheFlush::every, &pool) != 0) goto restart;
    }
    // A spill already in hand says more (the plan was short) than a device error behind it; but
    // a device without room for this pool's page is out of memory, whatever the caps: recovery
    // and CUDA itself may still serve the request, as they serve the plain call (a capped first
    // pool's error refused 512 B that the driver had room for, once the next pool's 4 MiB page
    // did not fit).
    const bool no_room = r.status == AllocStatus::out_of_memory;
    r.error = capacity && !no_room
                  ? capacity
                  : Error{no_room ? ErrorKind::out_of_memory : ErrorKind::device_error, size};
    return r;
  }
  // A pool passed over for its pages' size leaves the request to CUDA, whatever a full cap
  // before it says: the plain call may well succeed (Note [Pages larger than the device]).
  r.error = capacity && !passed_over ? capacity : Error{ErrorKind::buffer_too_big, size};
  return r;
}

void MemoryManager::Impl::implicit_cleanup() {
  flush_caches(false, CacheFlush::unused);
  persistent->cleanup(false);
  std::uint64_t next = persistent->deadline();
  for (const auto& pool : pools) {
    pool->cleanup(false);
    next = std::min(next, pool->deadline());
  }
  ctx.next_deadline = next;
}

std::uint64_t MemoryManager::Impl::cleanup_all(bool explicit_cleanup, bool keep_ordered_frees) {
  // Note [Idle memory before a park]: a 64th of the device at most.
  std::uint64_t keep = thread_cache_parked_max(total_memory);
  std::uint64_t released = keep_ordered_frees ? persistent->cleanup_but_ordered_frees(&keep)
                                              : persistent->cleanup(explicit_cleanup);
  for (const auto& pool : pools)
    released += keep_ordered_frees ? pool->cleanup_but_ordered_frees(&keep)
                                   : pool->cleanup(explicit_cleanup);
  ctx.next_deadline = kNever;
  for (const auto& pool : pools) ctx.next_deadline = std::min(ctx.next_deadline, pool->deadline());
  return released;
}

std::uint64_t MemoryManager::Impl::release_oldest_idle(std::uint64_t bytes) {
  // The idle page of at least `min_size` bytes that went idle first, over every dynamic pool.
  const auto oldest = [&](std::uint64_t min_size) {
    std::pair<Pool*, Page*> found{nullptr, nullptr};
    for (const auto& pool : pools) {
      Page* page = pool->oldest_idle(min_size);
      if (page == nullptr) continue;
      if (found.second == nullptr || page->idle_order < found.second->idle_order)
        found = {pool.get(), page};
    }
    return found;
  };
  // One page that covers it all, when there is one: fewer driver calls, and the smaller pages
  // the program reuses stay.
  if (auto [pool, page] = oldest(bytes); page != nullptr) return pool->release_idle(page);
  std::uint64_t released = 0;
  while (released < bytes) {
    auto [pool, page] = oldest(0);
    if (page == nullptr) break;
    released += pool->release_idle(page);
  }
  return released;
}

std::uint64_t MemoryManager::Impl::release_fitting_idle(std::uint64_t bytes) {
  Page* covering = nullptr;
  for (const auto& pool : pools) {
    Page* page = pool->smallest_idle(bytes);
    if (page != nullptr && (covering == nullptr || page->size < covering->size)) covering = page;
  }
  if (covering != nullptr) return covering->pool->release_idle(covering);
  // None covers it alone: the largest first, sorted once (a scan for each page released would be
  // quadratic in the idle pages, thousands of them in the sliced pools).
  std::vector<Page*> idle;
  for (const auto& pool : pools) pool->append_idle(&idle);
  std::sort(idle.begin(), idle.end(),
            [](const Page* a, const Page* b) { return a->size > b->size; });
  std::uint64_t released = 0;
  for (std::size_t i = 0; i < idle.size() && released < bytes; ++i)
    released += idle[i]->pool->release_idle(idle[i]);
  return released;
}

MemoryManager::Impl::HeldFigures MemoryManager::Impl::held_figures(std::uint64_t size,
                                                                std::uint64_t own_claim) const {
  // Each shard's bytes in use are part of the device's, so its own peak is at most the device's.
  Shards::Held held{ctx.totals.reserved, ctx.totals.in_use + size};
  if (shards != nullptr) {
    held = shards->held(shard_index, held.reserved, held.peak_in_use);
    held.reserved -= own_claim;  // this reservation's own room
  }
  const std::uint64_t peak = std::max(held.peak_in_use, ctx.totals.in_use_peak);
  const std::uint64_t slack = kHeldSlack * (shards != nullptr ? shards->count() : 1);
  return {held.reserved, held.peak_in_use,
          std::max(peak / 100 * options.hold_percent, peak + slack)};
}

bool MemoryManager::Impl::over_held_bound(const Pool& pool, std::uint64_t size,
                                          std::uint64_t own_claim) const {
  const HeldFigures f = held_figures(size, own_claim);
  return f.reserved + pool.growth_bytes(size) > f.bound;
}

MemoryManager::Impl::HeldCheck MemoryManager::Impl::trim_to_held_bound(const Pool& pool,
                                                                     std::uint64_t size,
                                                                     std::uint64_t own_claim) {
  const std::uint64_t growth = pool.growth_bytes(size);
  HeldFigures held = held_figures(size, own_claim);
  const std::uint64_t bound = held.bound;
  HeldCheck check;
  check.peak_in_use = held.peak_in_use;
  // Nothing more goes while a release is stuck behind a parked stream: so would these be, where
  // idle they could still serve a request.
  check.may_release = releases_on_the_way() == 0 || !releases_stuck();
  if (held.reserved + growth > bound && check.may_release) {
    const std::uint64_t released = release_fitting_idle(held.reserved + growth - bound);
    held_released_bytes += released;
    held.reserved -= released;
  }
  if (held.reserved + growth > bound) check.over_by = held.reserved + growth - bound;
  // A page wider than its first request (a sliced pool's) is not an overrun by itself.
  check.overrun = held.reserved + size > bound;
  // Pages released earlier still count while the driver holds them (read once: it takes the
  // release worker's lock), and so does a wider page's room (Note [Wider pages]).
  const std::uint64_t held_now = held.reserved + releases_on_the_way();
  check.releases_count = held_now + growth > bound;
  check.room = held_now < bound ? bound - held_now : 0;
  return check;
}

bool MemoryManager::Impl::drain(Scope& scope, WaitBound* bound) {
  const bool closed = fences.open_count() == 0 || fences.close(device);
  // A window's empty epoch left last holds nothing to wait for (record_window_fence()).
  const auto waiting = [&] { return fences.any_closed_epoch() || fences.any_lanes(); };
  if (bound == nullptr) {
    while (waiting() && wait_for_oldest_fence(scope, true)) {
    }
    return closed;
  }
  while (waiting() && wait_for_oldest_fence(scope, *bound) != FenceWait::none) {
  }
  return closed && !waiting();
}

// --- Free path -----------------------------------------------------------------------------------

void MemoryManager::Impl::close_epoch_when_due() {
  const std::uint64_t now = coarse_nanos();
  if (fences.open_count() >= std::max<std::uint32_t>(options.fence_batch, 1) ||
      fences.open_bytes() >= epoch_bytes() ||
      now - last_fence_nanos >= options.prompt_fence_nanos) {
    try {
      close_epoch();
    } catch (const std::bad_alloc&) {
    }
  }
}

bool MemoryManager::Impl::fence_on_stream(Slice* slice, StreamToken stream) {
  // At the limit, fences that passed make room first. Another device's stream goes past it: the
  // open epoch, where the limit sends the rest, has no fence on that device. (Asked only here:
  // it looks the stream up in the table.)
  if (fences.lane_frees() >= kMaxLaneFrees) fences.reap(device, kGiveBack);
  if (fences.lane_frees() >= kMaxLaneFrees &&
      device.stream_place(stream) != Device::StreamPlace::other_device)
    return false;
  // The slice is pending already: a failed host allocation (recording a fence, growing a lane)
  // must not leave it in no list, so the caller's list, which needs no memory, takes it then.
  StreamToken lane = stream;
  FenceHandle fence = kNoFence;
  try {
    fence = device.fence_record_on(stream, lane);
    if (fence == kNoFence) return false;
    fences.add_ordered(slice, fence, lane, thread_serial(this_thread_home()));
    return true;
  } catch (const std::bad_alloc&) {
    if (fence != kNoFence) device.fence_destroy(fence);
    return false;
  }
}

void MemoryManager::Impl::retire(Slice* slice, StreamToken stream, FreeBy by) {
  // Written only under the lock: a plain increment, not a locked one, on every free.
  frees.store(frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  Pool* pool = slice->page->pool;
  pool->to_pending(slice);
  slice->freed_in_order = stream != kNoStream;
  FreeFence mode = options.free_fence;
  // One ordered queue: any later user of the memory runs after every earlier one.
  if (mode == FreeFence::automatic) mode = stream_ordered ? FreeFence::none : FreeFence::events;
  switch (mode) {
    case FreeFence::none:
      pool->give_back(slice);
      return;
    case FreeFence::sync:
      // A device-wide synchronize would invalidate an open capture: the slice waits in an
      // epoch like an events free (Note [Free fences]). Nor a free a pin's release makes (Note
      // [Frees a graph's release makes] in manager_api.cpp). A stream-ordered free is fenced on
      // its own stream, as its contract says: the plain one never waits for the device, and a
      // synchronize behind it waited for every stream, a stream the program parked on a host
      // function that only this thread would release too (it hung); failing that (too many such
      // frees wait, a capture), a stream of this device goes to the open epoch, whose fences
      // wait for it. Only one on a stream the library never saw created, which those fences do
      // not cover, waits for the synchronize still.
      if (by == FreeBy::program && !device.capture_active()) {
        if (stream != kNoStream) {
          if (fence_on_stream(slice, stream)) return;
          if (device.stream_place(stream) != Device::StreamPlace::unknown) {
            fences.add(slice);
            close_epoch_when_due();
            return;
          }
        }
        slice->next_pending = nullptr;
        if (sync_tail != nullptr) sync_tail->next_pending = slice;
        else sync_head = slice;
        sync_tail = slice;
        ++sync_added;
        return;
      }
      [[fallthrough]];
    case FreeFence::automatic:
    case FreeFence::events: {
      // Note [Stream-ordered frees]: only that stream's work can still use the slice.
      if (stream != kNoStream && fence_on_stream(slice, stream)) return;
      fences.add(slice);
      close_epoch_when_due();
      return;
    }
  }
}

void MemoryManager::Impl::finish_sync_frees(Scope& scope) {
  if (sync_added == sync_returned) return;
  const std::uint64_t upto = sync_added;
  const std::uint64_t gen = generation;
  scope.unlock();  // Note [Outside the lock]
  const bool synced = device.synchronize();
  scope.relock();
  if (gen != generation) return;  // forgotten meanwhile: nothing to give back
  while (sync_returned < upto && sync_head != nullptr) {
    Slice* slice = sync_head;
    sync_head = slice->next_pending;
    if (sync_head == nullptr) sync_tail = nullptr;
    ++sync_returned;
    // Not synchronized (a capture opened meanwhile): the slice waits in the open epoch, as a
    // free during a capture does, rather than for a later free that synchronizes.
    if (synced) slice->page->pool->give_back(slice);
    else fences.add(slice);
  }
}

void MemoryManager::Impl::close_epoch() {
  if (fences.close(device)) {
    last_fence_nanos = coarse_nanos();
    fences.reap(device, kGiveBack);
  }
}

void MemoryManager::Impl::record_window_fence() {
  // With no free of a pinned slice since the last one (or ever), that fence still follows every
  // held slice's free: no empty epoch is added (a stream parked for good would otherwise keep
  // one per capture begin, and drain() would wait for it).
  if (fences.open_count() != 0 || held_since_window) {
    if (const std::uint64_t closed = fences.close_with_fence(device); closed != 0) {
      last_fence_nanos = coarse_nanos();
      window_epoch = closed;
      ++held_era;  // under the lock every free takes: frees after it note the new era
      held_since_window = false;
    }
  }
  fences.reap(device, kGiveBack);
}

std::uint64_t MemoryManager::Impl::close_and_reap() {
  close_epoch();
  return fences.reap(device, kGiveBack);  // fences that passed when there was no epoch to close
}

FreeOutcome MemoryManager::Impl::classify(DevicePtr ptr) const {
  auto it = ctx.page_set.upper_bound(ptr, PageOrder{});
  if (it == ctx.page_set.begin()) return FreeOutcome::not_mine;
  --it;
  if (ptr >= it->base + it->size) return FreeOutcome::not_mine;
  // Error path only: a linear walk of one page's slices.
  for (const Slice& s : it->slices) {
    if (ptr < s.ptr || ptr >= s.ptr + s.size) continue;
    if (s.state == SliceState::live) return FreeOutcome::interior_pointer;
    // A freed slice still waiting at exactly this address (pending or held) is a double free;
    // in free space, where coalescing has erased the old boundaries, only the record of recent
    // frees can tell a double free from an address that was never handed out.
    if (s.state != SliceState::free && ptr == s.ptr) return FreeOutcome::double_free;
    return recently_freed(ptr) ? FreeOutcome::double_free : FreeOutcome::not_allocated;
  }
  return FreeOutcome::not_mine;  // unreachable while slices tile their page
}

bool MemoryManager::Impl::recently_freed(DevicePtr ptr) const {
  for (const DevicePtr freed : recent_frees)
    if (freed == ptr) return true;
  return false;
}

}  // namespace poolcuda
