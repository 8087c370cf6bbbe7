// The pools' side of the hooked calls, shared by the runtime and driver hooks (see pooling.h).
//
// Note [Device reset]
// ~~~~~~~~~~~~~~~~~~~
// A device reset frees every allocation and destroys every stream and event of the device: the
// pools forget theirs instead of releasing them (MemoryManager::forget). Other threads may
// allocate and free on the device meanwhile (CUDA leaves that race undefined; plain programs
// survive it), so the manager is frozen from before the first forget to after the reset, and
// until the foreign frees that began before its end are over (Note [Foreign frees] in
// foreign_frees.cpp): it takes no new page from the driver (such a page could be freed by the
// reset and its address handed out again by the driver while the pools still hold it: two
// pages at one address), and requests it cannot serve from memory it already has go to the
// real allocator, unpooled, as they would without the library. Whatever it handed out from its
// own memory after the first forget is forgotten again after the reset. Every manager
// operation is atomic under its lock, so whatever the order the pools stay consistent. The
// release worker never frees a page of the device from the first forget to the end of the reset
// (its address may already belong to someone else), the device's event caches drop every event
// from before the reset, its captures are over, and nothing is charged to its budget any more.
// The managed slabs are frozen the same way, and their forget waits for allocations already
// past their slab's check to finish writing (Note [Managed reset] in pools/managed_chain.cpp).
//
// Note [IPC handles]
// ~~~~~~~~~~~~~~~~~~
// cudaIpcGetMemHandle and cuIpcGetMemHandle take the base of an allocation and make a handle of
// the driver's allocation around it; the process that opens the handle gets a pointer to that
// allocation's start. A pooled allocation is a slice of a page, and the driver knows only the
// page: for a slice that does not start its page (a sliced pool carves from the top of free
// space, so almost none does) the other process would get the page's start, and read and write
// other bytes than the exporter means, with no error anywhere. So the library refuses such a
// handle with cudaErrorInvalidValue (CUDA_ERROR_INVALID_VALUE) and a log line that says which
// layout gives every allocation a page of its own. A handle of a page's start passes while any
// allocation in the page lives: that is how libraries that export (base, offset) pairs work,
// asking cuMemGetAddressRange for the base (the page) first; so does a handle of an allocation
// that starts its page (exclusive and direct pools, and the persistent pool), which the other
// process opens at the right place. A page with nothing live in it is memory the program freed,
// whose handle the driver would have refused: so is it here.
// Pointers in no pooled page (managed memory, memory the pools passed through) go to the driver
// unchanged.
//
// Depends on the registry, the capture policy, the budget, stream order, the current driver
// context, the log and the configuration.
#include "interpose/pooling.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "interpose/budget.h"
#include "interpose/cuda_device.h"
#include "interpose/driver_context.h"
#include "interpose/foreign_frees.h"
#include "interpose/hooks.h"
#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/real_driver.h"
#include "interpose/registry.h"
#include "interpose/release_worker.h"
#include "interpose/stream_order.h"
#include "pools/no_cancel.h"
#include "pools/options.h"
#include "pools/wait_bound.h"

namespace poolcuda::pooling {

namespace {

// Note [Graphs dying]
// CUDA runs the destructor that tells the pools a graph is gone on a thread of its own after
// cudaGraphDestroy or cudaGraphExecDestroy returned, and only once every launch of the graph
// still running has finished. Until then the memory the graph pinned stays with it, also what
// the program freed already: an allocation after the destroy that needs that memory failed for
// lack of it where the plain run, which has no pins (and whose cudaFree of the buffer waited for
// the launch), succeeded. So an allocation about to fail for lack of memory after such a destroy
// (the hooks note the time), while graphs hold pinned memory, waits for the releases as long as
// out-of-memory recovery waits (a launch may run long: 100 ms was not enough for one of 20 ms
// per operation), and routes once more each time one comes, within that one bound: graphs
// destroyed together send their releases one by one (after two graphs of 25 MiB were freed and
// destroyed on a 64 MiB stand-in device whose destructors ran 1 ms apart, a 56 MiB request
// failed with the second still pinned), and one whose launch still runs sends its own after the
// others. Each destroy is waited for until a wait runs out; then it is settled, so a program
// that keeps a graph alive (or destroys a graph whose exec lives on) and probes for the largest
// size that fits pays the wait once at most. (A release drained after a destroy used to settle
// it, and every destroy before it: a graph released at once cut short the wait for another whose
// launch still ran, and the request failed where the plain run succeeded. The price: a request
// that fails for good after a destroy, while another graph keeps pinned memory, is refused after
// the bound.) A request larger than the driver's free memory and what the pools hold beyond their
// unpinned live slices does not wait (the pinned bytes alone were too few a bound: a released
// slice frees its whole page, and a 64 MiB request after a 4 KiB slice was freed in a capture
// failed at once). (The destroys are not told apart by device or graph.) Inside a capture too: a
// loop that captured, destroyed the graph unlaunched and captured again outran the stand-in's
// destructor thread, and its allocations inside the captures failed once the graphs not yet
// reported held the device; what the releases free there waits for the window's fence (Note
// [Releases inside a window] in pools/manager_api.cpp).
std::atomic<std::int64_t> g_last_graph_destroy_ns{std::numeric_limits<std::int64_t>::min() / 2};
// The time of the last destroy whose wait ran out.
std::atomic<std::int64_t> g_graph_destroy_settled_ns{std::numeric_limits<std::int64_t>::min() / 2};
// As long as out-of-memory recovery waits (ManagerOptions::recovery_wait_micros).
constexpr std::chrono::microseconds kGraphReleaseWait{10000000};

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Every destroy up to `destroyed` is settled (Note [Graphs dying]).
void settle_graph_destroys(std::int64_t destroyed) {
  std::int64_t settled = g_graph_destroy_settled_ns.load(std::memory_order_relaxed);
  while (settled < destroyed &&
         !g_graph_destroy_settled_ns.compare_exchange_weak(settled, destroyed,
                                                           std::memory_order_relaxed)) {
  }
}

// cudaMemGetInfo right after a destroy: the release is usually a moment away, so the query
// waits for it briefly, once per destroy (a graph whose exec lives on sends none), without
// settling it: an allocation that needs the memory still waits in full.
std::atomic<std::int64_t> g_graph_destroy_asked_ns{std::numeric_limits<std::int64_t>::min() / 2};
constexpr std::chrono::microseconds kMemInfoGraphWait{2000};

// The bytes live graphs keep: pinned to them, or (capture_share:on) shared among them.
std::uint64_t graph_bytes(const CapturePolicy& capture) {
  const auto stats = capture.stats();
  return stats.pinned_bytes + stats.shared_bytes;
}

void await_graph_release_briefly(CapturePolicy& capture) {
  const std::int64_t destroyed = g_last_graph_destroy_ns.load(std::memory_order_relaxed);
  if (destroyed <= g_graph_destroy_settled_ns.load(std::memory_order_relaxed) ||
      g_graph_destroy_asked_ns.exchange(destroyed, std::memory_order_relaxed) >= destroyed)
    return;
  if (capture.open() || graph_bytes(capture) == 0) return;
  NoCancel no_cancel;  // a wait plain CUDA's call would not make (Note [Cancellation])
  const auto until = std::chrono::steady_clock::now() + kMemInfoGraphWait;
  while (!capture.releases_pending() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

// A call the driver refused for lack of memory, when the pools had nothing idle to give back
// (give_back_idle): waits for the release of a graph destroyed and not yet settled, a little
// longer than cudaMemGetInfo's brief wait, and settles the destroy when none came. Its 2 ms were
// all it had: with the stand-in's destructor thread late on a loaded machine, a cudaMallocAsync
// after a graph's destroy was refused in a third of the runs. Not recovery's 10 s: no release
// comes for a graph whose exec lives on, or one that pinned nothing, and such a call then stalled
// 10 s once per destroy where plain CUDA answers at once.
constexpr std::chrono::milliseconds kUnpooledGraphWait{100};

// Waits within `bound` until a dead graph's release is pending; false when the bound ran out.
bool release_arrives(CapturePolicy& capture, WaitBound& bound) {
  NoCancel no_cancel;  // a wait plain CUDA's call would not make (Note [Cancellation])
  return bound.retry([&] {
    while (!capture.releases_pending()) {
      if (bound.over()) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    return true;
  });
}

bool await_graph_release(CapturePolicy& capture) {
  const std::int64_t destroyed = g_last_graph_destroy_ns.load(std::memory_order_relaxed);
  if (destroyed <= g_graph_destroy_settled_ns.load(std::memory_order_relaxed)) return false;
  if (capture.open() || graph_bytes(capture) == 0) return false;
  WaitBound bound{kUnpooledGraphWait};
  if (release_arrives(capture, bound)) return true;
  settle_graph_destroys(destroyed);
  return false;
}

// Waits within `bound`, the request's (Note [Graphs dying]).
bool graph_release_arrived(CapturePolicy& capture, int device_index, CudaDevice& device,
                           MemoryManager& manager, std::uint64_t size, WaitBound& bound) {
  const std::int64_t destroyed = g_last_graph_destroy_ns.load(std::memory_order_relaxed);
  if (destroyed <= g_graph_destroy_settled_ns.load(std::memory_order_relaxed)) return false;
  const std::uint64_t pinned = graph_bytes(capture);
  if (pinned == 0) return false;
  // A request that the release could not make room for fails without the wait: at most what the
  // pools hold beyond their live slices that are not pinned.
  const MemoryUsage usage = manager.memory_usage();
  const std::uint64_t unpinned = usage.bytes_in_use > pinned ? usage.bytes_in_use - pinned : 0;
  const std::uint64_t room = usage.bytes_reserved > unpinned ? usage.bytes_reserved - unpinned : 0;
  const std::uint64_t driver_free = device.memory_info().free_bytes;
  if (size > room + driver_free) return false;
  // Nor one the driver has room for as it is (a page of the pools' may not fit where the request
  // does): passed on to CUDA, it is served as the plain call is, at once. It waited the whole
  // bound once per destroy while another graph lived (a 4 KiB cudaMalloc with 1 MiB free took
  // 10 s a round in a loop that captured and destroyed a graph each round).
  const std::optional<std::uint64_t> budget_room = budget::room(device_index);
  if (size <= driver_free && (!budget_room || size <= *budget_room)) return false;
  if (!release_arrives(capture, bound)) {
    settle_graph_destroys(destroyed);
    return false;
  }
  capture.drain_releases();
  // Inside a window what the releases freed waits for the fence recorded before it opened
  // (Note [Releases inside a window] in pools/manager_api.cpp), within what is left of the wait.
  if (capture.open()) manager.wait_for_window_fence(bound.left_micros());
  return true;
}

// Note [Frees beside another device's capture]
// A capture on one device may write memory of another (peer memory, managed memory), and a
// capture window pins only its own device's allocations. Plain CUDA refuses a cudaFree where an
// open capture, on any device, forbids the calling thread unsafe calls (Note [Unsafe calls in a
// capture] in capture_hooks.cpp), and frees nothing; a stream-ordered free on a stream that
// captures becomes a node of the graph, and frees nothing before the graph runs. Taken back at
// once, such memory went to the next allocation on its device, and the graph's launch wrote over
// it. So such a free keeps the allocation for the life of the process, as the plain refusal does
// (managed memory the same way: Note [Managed frees during a capture]), when the free's stream
// captures on another device than the memory's, or when it is refused here while a capture is
// open on another device; the free succeeds, a log line says so once per device, and a second
// free of the pointer frees it. A free on a stream that captures on the memory's own device, or
// refused while captures are open on that device alone, goes through their window, which pins
// it until their graphs are gone.
bool keep_beside_capture(Registry& registry, int device, MemoryManager& manager,
                         DevicePtr address) {
  if (manager.live_size(address) == 0) return false;  // not a live allocation's start
  if (registry.first_time(Registry::Once::held_for_other_capture, device)) {
    log_format(LogLevel::basic,
               "device %d: memory freed while a stream capture is open on another device stays "
               "allocated (a graph may still use it)",
               device);
  }
  return true;
}

// What a free has to do with open captures (Note [Frees beside another device's capture]): an
// open capture forbids this thread unsafe calls, or the free's stream captures on a device.
struct CaptureBeside {
  bool refused_here = false;
  int captured_on = -1;  // the capturing stream's device
  // Whether memory of `device` freed so stays allocated.
  bool keeps(int device) const {
    return captured_on >= 0 ? captured_on != device
                            : refused_here && hooks::capture_open_elsewhere(device);
  }
};

// A pooled pointer goes back to its device's pools (through the capture policy while it routes
// frees), or stays allocated (Note [Frees beside another device's capture]); anything else
// answers `not_mine`.
FreeOutcome free_on(Registry& registry, int device, DevicePtr address,
                    StreamToken stream = kNoStream, const CaptureBeside& beside = {}) {
  MemoryManager* manager = registry.manager(device);
  if (manager == nullptr) return FreeOutcome::not_mine;
  CapturePolicy& capture = *registry.capture(device);
  if (capture.releases_pending()) capture.drain_releases();  // Note [Graph lifetimes]
  if (beside.keeps(device) && keep_beside_capture(registry, device, *manager, address))
    return FreeOutcome::freed;
  return capture.routes_frees() ? capture.free(address, stream) : manager->free(address, stream);
}

// Note [Managed frees during a capture]
// A pooled slice freed while a capture is open stays pinned until the graphs of that capture
// are gone (capture/). A managed slab allocation has no pin: its chain would take it back at
// once, the slab would rewind after the capture (no graph work is queued yet, so its fence
// passes), and a later launch of the graph would write into whatever the bytes were handed out
// for. Plain CUDA refuses such a free where a capture forbids the calling thread unsafe calls
// (cudaErrorStreamCaptureUnsupported; Note [Unsafe calls in a capture] in capture_hooks.cpp)
// and frees nothing. So a managed allocation freed there, while a capture is open on its
// device, is never taken back: the free succeeds, as the pools' frees in a window do, and the
// bytes stay allocated for the life of the process, as they do after the plain call's refusal.
// A log line says so once per device. Everywhere else (a relaxed capture, another thread) the
// plain free succeeds, and the memory goes back as usual: a program whose capture uses memory
// freed there runs on freed memory without the library too. Keeping that memory as well made a
// thread that allocated and freed managed memory beside a capture lose all of it, and fail
// requests that plain CUDA served. A second free of a kept pointer frees it (as plain CUDA
// would). A stream-ordered free on a stream that captures is kept the same way in any mode: the
// capture takes it into its graph, after the graph's own work on the memory, so the memory may
// go only when that graph runs (plain CUDA does not free it at the call either); taken back at
// once, it went to the next allocation, and the graph's launch wrote over it. One on a stream
// that does not capture is no unsafe call, which plain CUDA serves beside any capture: it goes
// back as usual (kept, a loop of them beside a global capture ran the device out of memory).
//
// Note [Managed frees on another device's stream]
// A slab's fence covers its own device's streams. Managed memory needs no peer access, so a
// cudaFreeAsync of device-0 managed memory may name a device-1 stream, whose work before the
// free no fence of device 0 waits for: the chain would take the memory back at once, and the
// stream's late writes would land in a new allocation. Such a free is held instead: an event of
// the stream's device is recorded on the stream, and the allocation goes back to its chain once
// that event has passed, looked at by the next free, memory query, pointer query or give-back;
// not under free_fence:none, which reuses at once. (Recording the other devices' events in
// every slab fence instead let a capture or a parked stream on any device stop every slab from
// rewinding.) To the program a held allocation is freed already: pointer queries answer as for
// freed memory, and a second free of it is a double free (it would otherwise be taken as live,
// and the held free, landing later, would free whatever was allocated there next). A reset of
// the memory's device drops its held frees with its slabs; a reset of the stream's device waited
// for the stream, so its events are taken as passed (CudaDevice::peer_event_passed).
struct HeldManagedFree {
  DevicePtr address = 0;
  int owner = -1;
  CudaDevice::PeerEvent event;
  std::uint64_t id = 0;   // never reused (events and addresses are)
  bool landing = false;   // a call is giving it to its slab; still freed to the program
};
struct HeldManagedFrees {
  std::mutex mutex;                   // a leaf: nothing else is locked under it
  std::vector<HeldManagedFree> list;  // under mutex
  std::uint64_t next_id = 1;          // under mutex
};
// Never destroyed (a free may come during exit), and no dynamic initialiser (Note [Load order]
// in lifecycle.cpp).
HeldManagedFrees& held_frees() {
  static auto* held = new HeldManagedFrees;
  return *held;
}
std::atomic<std::size_t> g_held_count{0};  // held_frees().list.size(), read without the mutex

// Whether `address` starts an allocation whose free is held. The caller holds the mutex.
bool held_locked(const HeldManagedFrees& frees, DevicePtr address) {
  for (const HeldManagedFree& free : frees.list)
    if (free.address == address) return true;
  return false;
}

void release_passed_managed_frees(Registry& registry) {
  if (g_held_count.load(std::memory_order_acquire) == 0) return;
  HeldManagedFrees& frees = held_frees();
  std::vector<HeldManagedFree> held;
  {
    std::lock_guard<std::mutex> hold(frees.mutex);
    held = frees.list;
  }
  // The events are asked without the lock (a driver call each). A free stays listed, so freed
  // to the program, until it has reached its slab; the one call that marks it landing lands it.
  std::erase_if(held, [](const HeldManagedFree& free) {
    return free.landing || !free.event.owner->peer_event_passed(free.event);
  });
  if (held.empty()) return;
  std::vector<HeldManagedFree> taken;
  {
    std::lock_guard<std::mutex> hold(frees.mutex);
    for (const HeldManagedFree& passed : held) {
      const auto at = std::find_if(frees.list.begin(), frees.list.end(),
                                   [&](const auto& free) { return free.id == passed.id; });
      if (at == frees.list.end() || at->landing) continue;  // another call's, or a reset's
      at->landing = true;
      taken.push_back(*at);
    }
  }
  for (const HeldManagedFree& free : taken) {
    free.event.owner->return_peer_event(free.event);
    if (ManagedSlabs* chain = registry.managed(free.owner)) chain->free(free.address);
  }
  std::lock_guard<std::mutex> hold(frees.mutex);
  std::erase_if(frees.list, [&](const HeldManagedFree& free) {
    return std::any_of(taken.begin(), taken.end(),
                       [&](const HeldManagedFree& landed) { return landed.id == free.id; });
  });
  g_held_count.store(frees.list.size(), std::memory_order_release);
}

// A managed free whose memory stays allocated for good, since nothing tells when its last user
// is done: freed to the program, and said once per device and reason.
FreeOutcome stays_allocated(Registry& registry, int device, Registry::Once reason,
                            const char* how) {
  if (registry.first_time(reason, device))
    log_format(LogLevel::basic, "device %d: managed memory freed %s", device, how);
  return FreeOutcome::freed;
}

// `stream`: a stream-ordered free's stream, as other_device_stream names it (or kNoStream);
// `captured`: that stream captures (Note [Managed frees during a capture]).
FreeOutcome free_from_chain(Registry& registry, ManagedSlabs& chain, int device,
                            DevicePtr address, StreamToken stream, bool captured) {
  // Any device's capture (Note [Frees beside another device's capture]).
  const bool capturing =
      captured || (stream == kNoStream && hooks::any_capture_open() &&
                   hooks::unsafe_calls_refused_here());
  // Under free_fence:none the program orders reuse itself (Note [Managed frees on another
  // device's stream]).
  const bool fenced = stream != kNoStream && config().free_fence != FreeFence::none;
  if (g_held_count.load(std::memory_order_acquire) != 0) {
    HeldManagedFrees& frees = held_frees();
    std::lock_guard<std::mutex> hold(frees.mutex);
    if (held_locked(frees, address)) return FreeOutcome::double_free;
  }
  if (capturing || fenced) {
    const ManagedLookup found = chain.find(address);
    if (found.kind != ManagedLookup::Kind::live || found.start != address)
      return chain.free(address);  // the chain says what it is
    if (capturing) {
      return stays_allocated(registry, device, Registry::Once::managed_held_for_capture,
                             "while a stream capture is open stays allocated (a graph may "
                             "still use it)");
    }
    CudaDevice* cuda = registry.device(device);
    const CudaDevice::PeerEvent event =
        cuda != nullptr ? cuda->record_if_other_device(stream) : CudaDevice::PeerEvent{};
    if (event.keep) {
      return stays_allocated(registry, device, Registry::Once::managed_kept_unordered,
                             "on a stream the library cannot follow (it captures, or no event "
                             "could be recorded on it) stays allocated");
    }
    if (event.event != nullptr) {
      HeldManagedFrees& frees = held_frees();
      std::lock_guard<std::mutex> hold(frees.mutex);
      frees.list.push_back(HeldManagedFree{address, device, event, frees.next_id++, false});
      g_held_count.store(frees.list.size(), std::memory_order_release);
      return FreeOutcome::freed;
    }
  }
  return chain.free(address);
}

// A managed slab allocation goes back to its chain: the device's own first, then every other.
FreeOutcome free_managed(Registry& registry, int device, DevicePtr address, StreamToken stream,
                         bool captured, int* owner) {
  if (ManagedSlabs* chain = registry.managed(device)) {
    const FreeOutcome outcome =
        free_from_chain(registry, *chain, device, address, stream, captured);
    if (outcome != FreeOutcome::not_mine) return outcome;
  }
  for (int other = 0; other < registry.managed_bound(); ++other) {
    ManagedSlabs* chain = other == device ? nullptr : registry.managed(other);
    if (chain == nullptr) continue;
    const FreeOutcome outcome =
        free_from_chain(registry, *chain, other, address, stream, captured);
    if (outcome != FreeOutcome::not_mine) {
      *owner = other;
      return outcome;
    }
  }
  return FreeOutcome::not_mine;
}


// The device whose managed slabs hold a live allocation starting at `address` (`device`'s asked
// first), or -1.
int managed_holder(const Registry& registry, int device, DevicePtr address) {
  const auto starts_at = [&](int d) {
    const ManagedSlabs* chain = registry.managed(d);
    if (chain == nullptr) return false;
    const ManagedLookup found = chain->find(address);
    return found.kind == ManagedLookup::Kind::live && found.start == address;
  };
  if (device >= 0 && device < registry.managed_bound() && starts_at(device)) return device;
  for (int other = 0; other < registry.managed_bound(); ++other)
    if (other != device && starts_at(other)) return other;
  return -1;
}

// The held frees of `device`'s memory go with its slabs (Note [Managed frees on another
// device's stream]).
void drop_held_frees(int device) {
  if (g_held_count.load(std::memory_order_acquire) == 0) return;
  HeldManagedFrees& frees = held_frees();
  std::vector<CudaDevice::PeerEvent> events;
  {
    std::lock_guard<std::mutex> hold(frees.mutex);
    std::erase_if(frees.list, [&](const HeldManagedFree& free) {
      if (free.owner != device || free.landing) return false;  // a landing one is its lander's
      events.push_back(free.event);
      return true;
    });
    g_held_count.store(frees.list.size(), std::memory_order_release);
  }
  for (const CudaDevice::PeerEvent& event : events) event.owner->return_peer_event(event);
}

}  // namespace

void release_passed_managed_frees() {
  release_passed_managed_frees(Registry::instance());
}

bool managed_free_held(DevicePtr start) {
  if (g_held_count.load(std::memory_order_acquire) == 0) return false;
  HeldManagedFrees& frees = held_frees();
  std::lock_guard<std::mutex> hold(frees.mutex);
  return held_locked(frees, start);
}

namespace {

int reset_pools(int device, const std::function<int()>& real, bool primary_replaced);

}  // namespace

void forget_replaced_contexts() {
  driver::forget_replaced([](int device) { reset_pools(device, [] { return 0; }, true); });
}

Route allocate(const char* api, int device, std::size_t size, void** ptr) {
  forget_replaced_contexts();
  drop_kept();  // a refusal's account belongs to its own request
  if (ptr == nullptr || size == 0 || device < 0) return Route::forward;
  Registry& registry = Registry::instance();
  MemoryManager* manager = registry.manager_or_create(device);
  if (manager == nullptr) return Route::forward;
  // Larger than the device: the real call fails cleanly and sets its own error.
  if (size > registry.device(device)->total_bytes()) return Route::forward;

  CapturePolicy& capture = *registry.capture(device);
  if (capture.releases_pending()) capture.drain_releases();  // Note [Graph lifetimes]
  // Out-of-memory recovery gives back empty managed slabs too (Device::give_back_elsewhere).
  Reservation reservation = capture.open() ? capture.allocate(size) : manager->allocate(size);
  // A capture that began during the wait takes the request in its window.
  if (reservation.ptr == 0 && reservation.error.kind == ErrorKind::out_of_memory) {
    WaitBound graph_wait{kGraphReleaseWait};
    while (reservation.ptr == 0 && reservation.error.kind == ErrorKind::out_of_memory &&
           graph_release_arrived(capture, device, *registry.device(device), *manager, size,
                                 graph_wait))
      reservation = capture.open() ? capture.allocate(size) : manager->allocate(size);
  }
  // A sticky context error is not checked on a hit: that would cost a CUDA call on every
  // allocation, and the program's next launch or synchronisation reports the error anyway.
  if (reservation.ptr != 0) {
    *ptr = reinterpret_cast<void*>(reservation.ptr);
    return Route::pooled;
  }
  switch (reservation.error.kind) {
    case ErrorKind::out_of_memory:
    case ErrorKind::device_error:
      return Route::forward;  // Note [Last error] in hooks.cpp: the real call's own failure
    case ErrorKind::buffer_too_big:
      // Note [Last error]: not the pools' size, but the driver may well have it.
      if (registry.first_time(Registry::Once::no_pool_accepts, device)) {
        log_format(LogLevel::basic,
                   "device %d: no pool accepts %zu bytes; passing such requests to %s", device,
                   size, api);
      }
      return Route::forward;
    default:
      log_format(LogLevel::basic, "%s(%zu B) on device %d refused: %s", api, size, device,
                 describe(reservation.error).c_str());
      return Route::refused;
  }
}

int forward(int device, std::size_t size, void** ptr, const std::function<int()>& real,
            Passed kind) {
  // Counted as it reaches CUDA: a request the budget refuses never does.
  const auto passed = [&] {
    if (PassthroughCounters* counters = Registry::instance().passthrough(device)) {
      (kind == Passed::managed ? counters->managed_mallocs : counters->mallocs)
          .fetch_add(1, std::memory_order_relaxed);
    }
  };
  if (ptr == nullptr || size == 0) {
    passed();
    return real();
  }
  // Idle pages and empty managed slabs count against the budget as they do against the device
  // (Note [Room for what the pools do not serve]): given back, the charge is tried once more.
  // A request larger than the budget's room and all the library could give back is refused at
  // once (Note [Requests beyond reach]): its waits for fences (10 s at most) made a request that
  // plain CUDA refuses at once wait.
  bool within_budget = budget::charge(device, size);
  if (!within_budget && !beyond_budget_reach(device, size)) {
    GrowthHold hold;  // Note [Room held for the retry]
    // Tried again even when nothing went back: a page on its way may have arrived meanwhile,
    // and only then left the budget (Note [Budget] in budget.cpp).
    give_back_idle(device, hold);
    within_budget = budget::charge(device, size);
  }
  if (!within_budget) {
    if (has_kept()) {
      const std::uint64_t left = budget::room(device).value_or(0);
      say_kept("; the budget refused it too, with " + std::to_string(left) +
               " B left within it");
    }
    return kOverBudget;
  }
  budget::ChargeScope charged(device, size);
  passed();
  // The pools' reserved bytes, when they refused the request and will say so (Note [A
  // refusal's account]).
  MemoryManager* manager = has_kept() ? Registry::instance().manager(device) : nullptr;
  const std::uint64_t reserved_before =
      manager != nullptr ? manager->memory_usage().bytes_reserved : 0;
  const int result = real();
  if (result == 0) {
    charged.keep();
    // In a context of the program's, its destroy frees the memory too.
    const driver::CurrentContext ctx =
        driver::program_contexts_made() ? driver::current_context() : driver::CurrentContext{};
    budget::passed_through(device, *ptr, size,
                           ctx.handle != nullptr && !ctx.primary ? ctx.handle : nullptr);
    drop_kept();  // the pools' refusal, if any, cost the program nothing
  } else if (has_kept()) {
    // Note [A refusal's account]
    // The pools' figures are from before CUDA was asked: what the device had free then tells
    // the rest. Pages of this device's pools that went back to the driver meanwhile (the retry
    // that gives idle pages back) are in both figures, which the line says, lest a reader add
    // them up. Asked only for a line to write: a program that probes for the largest allocation
    // that fits pays nothing more.
    CudaDevice* cuda = Registry::instance().device(device);
    const bool given_back =
        manager != nullptr && manager->memory_usage().bytes_reserved < reserved_before;
    say_kept(cuda == nullptr ? std::string("; CUDA's own allocation failed too")
                             : "; CUDA's own allocation failed too, with " +
                                   std::to_string(cuda->memory_info().free_bytes) +
                                   (budget::limit(device) ? " B free within the budget"
                                                          : " B free on the device") +
                                   (given_back ? " once the pools had given their idle pages back"
                                               : ""));
  }
  return result;
}

ForwardedFree::ForwardedFree(int device, const void* ptr)
    : device_(device),
      charge_(ptr == nullptr ? budget::PassedCharge{}
                             : budget::take_through(const_cast<void*>(ptr))) {}

void ForwardedFree::finish(bool freed) {
  budget::settle_through(charge_, freed);
  if (!freed && charge_.ptr != nullptr) return;  // counted: frees done, and every cudaFree(NULL)
  if (PassthroughCounters* counters = Registry::instance().passthrough(device_))
    counters->frees.fetch_add(1, std::memory_order_relaxed);
}

// Note [Host functions beside a capture]
// The give-back before a host function used to be left out while any capture was open on the
// device, since its page frees and trims were thought to invalidate the capture. They do not:
// the release thread frees in relaxed capture mode, which CUDA allows beside any capture (Note
// [Releases during capture] in release_worker.cpp), and no fence is recorded during a capture
// (the give-back waits for the fences recorded before it). Leaving it out kept idle pages from
// the driver while the stream parked: a program that freed 400 MiB, parked a stream on a host
// function that only its next cudaMalloc would release, and asked for 700 MiB of a 1 GiB device
// while another thread captured, waited out recovery's 10 seconds and was refused, where plain
// CUDA, whose cudaFree had returned the memory before the park, served it at once. So only a
// host function that goes into a capture's graph (its stream is capturing), which parks nothing
// now, is passed on without a give-back.

void fence_before_host_work() {
  stream_order::host_work_issuing();  // Note [Leaving behind a park] in stream_order.cpp
  const Registry& registry = Registry::instance();
  for (int device = 0; device < Registry::kMaxDevices; ++device) {
    if (MemoryManager* manager = registry.manager(device)) manager->fence_open_frees();
  }
}

// Note [Memory info after a synchronize]
// Frees wait in an open batch until a later free or allocation closes it with a fence
// (pools/memory_manager.cpp); cudaMemGetInfo closes it too, but the events it records then have
// not passed when it asks right away, so memory a program freed and then synchronized for was
// missing from "free" until some later call (8 MiB of 20 freed MiB in a reviewer's program).
// Plain CUDA counts it at once. A device-wide synchronize (cudaDeviceSynchronize,
// cuCtxSynchronize) passes every event recorded before it, so the hooks close the open batch
// just before the real call: afterwards its fence has passed and the memory counts as idle.
void before_device_synchronize(int device) {
  if (MemoryManager* manager = Registry::instance().manager(device)) manager->fence_open_frees();
}

namespace {

// Whether a host function on `stream` goes into a capture's graph, where it parks nothing now:
// only while a capture the hooks saw is open. A stream whose capture status cannot be read
// counts as capturing, and gets no give-back.
bool host_function_captured(cudaStream_t stream) {
  if (!hooks::any_capture_open()) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return real_driver::cuStreamIsCapturing()(reinterpret_cast<CUstream>(stream), &status) !=
             CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

void before_host_function(cudaStream_t stream) {
  fence_before_host_work();
  // Note [Host functions beside a capture].
  if (host_function_captured(stream)) return;
  Registry& registry = Registry::instance();
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(kParkGiveBackMicros);
  for (int device = 0; device < Registry::kMaxDevices; ++device) {
    MemoryManager* manager = registry.manager(device);
    if (manager == nullptr) continue;
    // A device stuck behind an earlier park must not leave the next ones no time at all.
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
    const auto bound = static_cast<std::uint32_t>(
        std::max<std::int64_t>(left, kParkGiveBackMicros / 10));
    manager->give_back_all(bound, GiveBackWait::before_park);
    // Empty managed slabs too, as a free would have had them back.
    WaitBound trim_bound{std::chrono::microseconds(bound)};
    registry.trim_managed(device, trim_bound);
  }
}

Freed release(int device, const void* ptr, StreamToken stream) {
  forget_replaced_contexts();
  Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  Freed freed;
  freed.owner = device;
  release_passed_managed_frees(registry);
  // A pointer allocated on another device may be freed with any device current, and on any
  // device's stream (Note [Frees on another device's stream] in cuda_device.cpp).
  StreamToken named = kNoStream;
  if (stream != kNoStream) {
    named = CudaDevice::other_device_stream(device, stream);
    registry.manager_or_create(device);  // records the fence on its legacy or per-thread stream
  }
  // Managed slabs first: a range test per slab, no lock. Whether the stream captures is asked
  // only while a capture the hooks saw is open, on any device: the stream may be another
  // device's than the current one.
  const bool any_capture = hooks::any_capture_open();
  const bool captured = stream != kNoStream && any_capture &&
                        hooks::capturing(reinterpret_cast<cudaStream_t>(stream));
  // free_fence:sync makes every free outside a capture the barrier the real cudaFree is, as the
  // pools' frees are (a slab's reuse waits for its own fence in every mode); the synchronize
  // refuses while a capture is open. A stream-ordered free is no barrier, but on a stream the
  // library never saw created, which the slab's fence does not cover, it waits for a
  // synchronize. Before its slab takes it back: another thread's fence in between could let the
  // slab rewind, and hand the memory out, while that stream still writes it.
  if (config().free_fence == FreeFence::sync) {
    const int holder = managed_holder(registry, device, address);
    CudaDevice* owner = holder >= 0 ? registry.device(holder) : nullptr;
    if (owner != nullptr &&
        (stream == kNoStream || owner->stream_place(stream) == Device::StreamPlace::unknown))
      owner->synchronize();
  }
  freed.outcome = free_managed(registry, device, address, named, captured, &freed.owner);
  if (freed.outcome != FreeOutcome::not_mine) return freed;
  // Note [Frees beside another device's capture]: asked only while a capture is open.
  CaptureBeside beside;
  if (captured) {
    beside.captured_on = hooks::stream_device(reinterpret_cast<cudaStream_t>(stream));
  } else if (any_capture && stream == kNoStream) {
    beside.refused_here = hooks::unsafe_calls_refused_here();
  }
  freed.outcome = free_on(registry, device, address, stream, beside);
  for (int other = 0; freed.outcome == FreeOutcome::not_mine && other < Registry::kMaxDevices;
       ++other) {
    if (other == device) continue;
    freed.outcome = free_on(registry, other, address, named, beside);
    freed.owner = other;
  }
  return freed;
}

void graph_destroyed() {
  g_last_graph_destroy_ns.store(steady_ns(), std::memory_order_relaxed);
}

bool managed_allocation(const void* ptr) {
  return managed_holder(Registry::instance(), -1, reinterpret_cast<DevicePtr>(ptr)) >= 0;
}

int holder_device(const void* ptr) {
  Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  for (int device = 0; device < registry.managed_bound(); ++device) {
    const ManagedSlabs* chain = registry.managed(device);
    if (chain != nullptr && chain->find(address).kind != ManagedLookup::Kind::not_mine)
      return device;
  }
  for (int device = 0; device < Registry::kMaxDevices; ++device) {
    const MemoryManager* manager = registry.manager(device);
    if (manager != nullptr && manager->locate(address).pooled) return device;
  }
  return -1;
}

void log_refused_free(const char* api, const void* ptr, const Freed& freed) {
  const char* why = freed.outcome == FreeOutcome::double_free ? "double free"
                    : freed.outcome == FreeOutcome::interior_pointer
                        ? "not the start of an allocation"
                        : "lies in pooled free memory, in no live allocation (freed "
                          "before, or never handed out)";
  log_format(LogLevel::basic, "%s(%p) on device %d: %s; nothing changed", api, ptr, freed.owner,
             why);
}

bool in_pooled_free_memory(const void* ptr) {
  const Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  for (int device = 0; device < Registry::kMaxDevices; ++device) {
    MemoryManager* manager = registry.manager(device);
    if (manager == nullptr) continue;
    if (manager->live_size(address) != 0) return false;  // an allocation's start: the usual ask
    const PointerPlace place = manager->locate(address);
    // An allocation's padding is no more the program's than freed memory is.
    if (place.pooled)
      return place.allocation == 0 || address - place.allocation >= place.allocation_size;
  }
  // A page the pools gave up is freed memory until the driver has it back (it may wait for the
  // device that long).
  return ReleaseWorker::instance().holds(ptr);
}

bool ipc_exportable(const char* api, const void* ptr) {
  const Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  for (int device = 0; device < Registry::kMaxDevices; ++device) {
    MemoryManager* manager = registry.manager(device);
    if (manager == nullptr) continue;
    const PointerPlace place = manager->locate(address);
    if (!place.pooled) continue;
    if (place.allocation == place.page_base) return true;
    if (address == place.page_base && place.page_in_use) return true;
    if (place.allocation == 0) {
      log_format(LogLevel::basic,
                 "%s(%p) on device %d refused: the pointer lies in pooled memory that is not "
                 "allocated; nothing changed",
                 api, ptr, device);
    } else {
      log_format(LogLevel::basic,
                 "%s(%p) on device %d refused: the allocation starts %s into a pooled page of "
                 "%s, and a process that opened the handle would get the page's start instead; "
                 "nothing changed. Allocations shared through IPC handles need a page of their "
                 "own: POOLCUDA_CONF=pools:exclusive gives every allocation one",
                 api, ptr, device, format_size(place.allocation - place.page_base).c_str(),
                 format_size(place.page_size).c_str());
    }
    return false;
  }
  if (ReleaseWorker::instance().holds(ptr)) {
    log_format(LogLevel::basic,
               "%s(%p) refused: the pointer lies in pooled memory that was freed and is on its "
               "way back to the driver; nothing changed",
               api, ptr);
    return false;
  }
  return true;
}

// Note [Room for what the pools do not serve]
// Pitched, managed (past the slabs), stream-ordered and driver-managed allocations come from the
// driver, never from the pools, and so do plain allocations of a size no pool takes, those made
// in a context of cuCtxCreate, a memory pool's allocations, physical memory (cuMemCreate),
// arrays (mipmapped too), and what a context takes for a larger heap, printf buffer or stack
// (cuCtxSetLimit); but they all draw on the same device: the pools' idle pages and the memory
// waiting for its free fences are memory plain CUDA would have given back at the program's
// frees, and so are managed slabs with nothing live in them. So such a call that the driver (or
// the budget) refuses for lack of memory gets all of it back (give_back_idle) and is tried once
// more (also when a page reached the driver meanwhile: Note [Room that arrived meanwhile]):
// under the pools it fails only where the plain call would. (Managed slabs wait while a capture
// is open: a trim records fences, which a capture must never see.) The runtime's calls also keep
// the last-error slot as the plain call leaves it (hooks::with_room, Note [Stream-ordered
// allocations] in hooks.cpp); the driver's have none (driver_hooks::with_room). cuMemCreate
// names its device, which need not be current; a memory pool's device cannot be asked, so its
// allocations get the current device's idle memory first and every other device's after
// (driver_hooks::with_room_anywhere). Code the driver loads (a kernel's module at its first
// launch, modules and libraries) gets the same (Note [Launches short of memory] in hooks.cpp).
// Graph memory a GPU allocates at instantiation or launch is not covered: docs/pools.md says
// what to do there.

// Note [Requests beyond reach]
// A call the driver refused for lack of memory gets what the library keeps on the device for no
// live allocation and is tried once more (Note [Room for what the pools do not serve]). That
// give-back waits for the fences of freed memory and for the driver's frees of the pages, that
// is for the device's streams: a request the plain call refuses at once was refused after a
// running kernel's 3 s, or the 10 s bound behind a parked stream, even when the pools had found
// it beyond their own reach (Note [Recovery and parked streams] in
// pools/manager_recovery.cpp). So the give-back is skipped when the request is larger than the
// driver's free memory and everything the library could add to it: whatever the pools hold
// beyond their live bytes (idle pages, memory waiting for fences and the holes in used pages,
// which cannot all go back), pages on their way to the driver, graph memory, pinned or shared
// (counted again, though live graphs' is also in use), and empty managed slabs. The driver's
// figure, not a budget's: the budget refused nothing here. Read in the order a page travels
// (pools, release queue, driver), so a page that moves meanwhile counts twice, never not at all;
// a page the library grew meanwhile, and freed, would be in neither figure, so any growth
// during the reads means trying: every error of the estimate errs towards trying. A request the
// budget refused gets the same test against what the budget has left (beyond_budget_reach): it
// waited for the same give-back. A stream-ordered pool's allocation gets only the device's size:
// its pool may keep memory that cudaMemGetInfo counts as used and the library cannot see.
namespace {

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  constexpr std::uint64_t kMost = std::numeric_limits<std::uint64_t>::max();
  return a > kMost - b ? kMost : a + b;
}

// Everything the library could give back on `device` (Note [Requests beyond reach]), the pages
// on their way to the driver read last.
std::uint64_t held_for_nothing(Registry& registry, CudaDevice& cuda, int device) {
  release_passed_managed_frees(registry);
  std::uint64_t held = 0;
  if (CapturePolicy* capture = registry.capture(device)) {
    // What dead graphs released goes back to the pools first, as give_back_idle() does.
    if (capture->releases_pending()) capture->drain_releases();
    held = graph_bytes(*capture);
  }
  if (MemoryManager* manager = registry.manager(device)) {
    const MemoryUsage usage = manager->memory_usage();
    const std::uint64_t used = usage.bytes_in_use + usage.bytes_padding;
    if (usage.bytes_reserved > used) held = saturating_add(held, usage.bytes_reserved - used);
  }
  if (const ManagedSlabs* slabs = registry.managed(device))
    held = saturating_add(held, slabs->empty_bytes());
  return saturating_add(held, cuda.releasing_bytes());
}

// `room` (what the driver has free, or what the budget has left) and all the library holds
// against `size`; false (try) whenever the library took memory from the driver meanwhile: a page
// grown after the pools were read and freed again is in neither figure.
bool out_of_reach(int device, std::size_t size,
                  const std::function<std::optional<std::uint64_t>()>& room) {
  Registry& registry = Registry::instance();
  CudaDevice* cuda = registry.device(device);
  if (cuda == nullptr) return false;
  const std::uint64_t grown_before = budget::growth_so_far(device);
  const std::uint64_t held = held_for_nothing(registry, *cuda, device);
  const std::optional<std::uint64_t> left = room();
  if (!left || budget::growth_so_far(device) != grown_before) return false;
  return size > saturating_add(*left, held);
}

}  // namespace

bool beyond_reach(int device, std::size_t size, bool stream_pool) {
  const CudaDevice* cuda = Registry::instance().device(device);
  if (cuda == nullptr) return false;
  // The device's own size, not a budget's: most of what comes here is not charged to one.
  if (cuda->device_bytes() != 0 && size > cuda->device_bytes()) return true;
  return !stream_pool && out_of_reach(device, size, [device]() -> std::optional<std::uint64_t> {
    const DeviceMemoryInfo driver = Registry::instance().device(device)->driver_memory_info();
    if (driver.total_bytes == 0) return std::nullopt;  // unknown: try
    return driver.free_bytes;
  });
}

bool beyond_budget_reach(int device, std::size_t size) {
  const std::optional<std::uint64_t> limit = budget::limit(device);
  if (!limit) return false;
  if (size > *limit) return true;
  // A page's charge goes after its driver free returns: read after the release queue.
  return out_of_reach(device, size, [device, limit]() -> std::optional<std::uint64_t> {
    return budget::room(device).value_or(*limit);
  });
}

// Note [Room that arrived meanwhile]
// The pools hand the pages they give up to the release thread (Note [Release worker] in
// release_worker.cpp), so the driver gets a page back a little after the pools let it go. A call
// retried after give_back_idle (those of Note [Room for what the pools do not serve] above and of
// Note [Launches short of memory] in hooks.cpp) that the driver refuses meanwhile gets the page
// through give_back_idle, which waits for pages on their way. But the page may reach the driver
// between the refusal and that look: give_back_idle then finds nothing to give or wait for, and
// the call used to fail where the plain program, whose cudaFree had returned the memory before
// the call, got it (seed 15 of stream_ordered in docs/differential-test.md, Known divergences).
// So each of those calls makes a ReturnsSince before it asks the driver, and after a refusal is
// tried once more when give_back_idle gave anything or a page reached the driver since. No gap
// is left between the two: a lane counts a page returned (ReleaseWorker::pages_returned) under
// the same lock, and in the same step, that takes it off the bytes give_back_idle waits for.
// While a capture is open on the device a page that arrived meanwhile is no reason to try again
// (a retry could turn the program's out-of-memory error into the capture's invalidation): only
// what the give-back itself returned is, the pages idle then and those whose fences, recorded
// before the capture, passed.
bool ReturnsSince::moved(int device) const {
  if (ReleaseWorker::pages_returned() == seen_) return false;
  const CapturePolicy* capture = device >= 0 ? Registry::instance().capture(device) : nullptr;
  return capture == nullptr || !capture->open();
}

// Note [Room held for the retry]
// A call the pools do not serve gets their idle memory back and is tried once more (Note [Room for
// what the pools do not serve]); but another thread allocating meanwhile could grow a pool into
// that room, and between its free and its next allocation a pooled thread holds both pages (the
// plain program's cudaFree had returned the first): two threads on a 256 MiB device, one cycling
// cudaMalloc and cudaFree of random sizes up to 30% of it, the other cudaMallocPitch,
// cudaMallocAsync or cudaMallocManaged of 30%, at most 60% live, saw 2 to 12 of 600 unpooled
// calls fail where the plain run never did. So after the give-back a second, short one (20 ms
// at most) runs as an out-of-memory recovery of the device (Note [Growth during a recovery] in
// pools/manager_recovery.cpp), and the recovery lasts until the retry has returned (GrowthHold):
// another thread's growth waits for it, 20 ms at most and once per allocation, then goes ahead;
// reuse of what a pool holds never waits. The second give-back returns what went idle during the
// first. The first runs without the hold: its wait for fences may last seconds behind a stream
// parked on a host function, and holding meanwhile made every growth of another thread wait its
// 20 ms (100 allocations of another thread took 2 s instead of nothing).
GrowthHold::~GrowthHold() {
  Registry& registry = Registry::instance();
  for (int device = 0; devices_ != 0; ++device, devices_ >>= 1) {
    if ((devices_ & 1) == 0) continue;
    if (MemoryManager* manager = registry.manager(device)) manager->end_growth_hold();
  }
}

void GrowthHold::hold(int device) {
  if (device < 0 || device >= Registry::kMaxDevices || (devices_ >> device & 1) != 0) return;
  MemoryManager* manager = Registry::instance().manager(device);
  if (manager == nullptr) return;
  manager->begin_growth_hold();
  devices_ |= std::uint64_t{1} << device;
}

bool give_back_idle(int device, GrowthHold& hold, GiveBackWait wait) {
  // As long as out-of-memory recovery waits (ManagerOptions::recovery_wait_micros).
  constexpr std::uint32_t kGiveBackMicros = 10000000;
  // The held pass's bound: no longer than another thread's growth waits for the hold.
  constexpr std::uint32_t kHeldGiveBackMicros = 20000;
  Registry& registry = Registry::instance();
  release_passed_managed_frees(registry);
  // What dead graphs gave back becomes idle first (Note [Graph lifetimes]): only pooled calls
  // took it, so after a graph's destroy an unpooled request (cudaMallocAsync, managed past the
  // slabs, a memory pool's, a kernel's code) was refused while the graph's memory stayed held.
  CapturePolicy* capture = device >= 0 ? registry.capture(device) : nullptr;
  if (capture != nullptr) {
    await_graph_release_briefly(*capture);
    if (capture->releases_pending()) capture->drain_releases();
  }
  MemoryManager* manager = device >= 0 ? registry.manager(device) : nullptr;
  bool pages =
      manager != nullptr && manager->give_back_all(kGiveBackMicros, wait) != GiveBack::nothing;
  // Nothing idle: a destroyed graph's memory may be the room the call needs.
  if (!pages && capture != nullptr && manager != nullptr && await_graph_release(*capture)) {
    capture->drain_releases();
    pages = manager->give_back_all(kGiveBackMicros, wait) != GiveBack::nothing;
  }
  hold.hold(device);  // Note [Room held for the retry]
  if (manager != nullptr && manager->give_back_all(kHeldGiveBackMicros, wait) != GiveBack::nothing)
    pages = true;
  WaitBound trim_bound{std::chrono::microseconds(kGiveBackMicros)};
  const bool slabs =
      (capture == nullptr || !capture->open()) && registry.trim_managed(device, trim_bound);
  return pages || slabs;
}

// Note [Memory on its way to the driver]
// A page the pools give up goes to the release thread (Note [Release worker] in
// release_worker.cpp), whose driver free waits for the device; behind queued work the page is
// then neither idle in a pool nor free in the driver's figure, though the plain program's
// cudaFree had returned it (under ThreadSanitizer a query missed 40 MiB of pages queued behind
// a memset). Such pages count as free, but only those still queued, read after the driver's
// figure: a page in the queue then was in it when the driver answered, and so is not in that
// answer. The page inside the driver's free is left out: whether the driver had taken it back
// when it answered cannot be known, and counting it once counted it twice (a request of every
// byte reported free was then refused). So are pages held back for a capture: the driver may
// refuse them again while it lasts, and a request of the reported size could not get them. The
// queue is read before the idle pages: a page moving from a pool to the queue in between counts
// in neither, never in both.
// The other way round, a page another thread takes from the driver after its figure, uses and
// frees before the idle pages are read counts in both (a query during churn reported up to
// 252 MiB more than was free, and a request of what it reported, less what the churning thread
// could hold, failed where the plain run never did; under a budget, a charge made after
// charged_now() did the same). So the bytes the library took from the driver since just before
// the driver's figure (budget::growth_so_far, counted as each of its driver allocations returns)
// are taken off what the pools add: a page counted twice was among them. Churn then shows less
// free than there is for the moment, never more.
void adjust_memory_info(int device, std::uint64_t grown_before, std::size_t* free_bytes,
                        std::size_t* total_bytes) {
  if (free_bytes == nullptr) return;
  // Under memgetinfo:raw without a budget the driver's numbers stand: nothing to look at.
  if (config().memgetinfo == MemGetInfoMode::raw && !budget::limit(device)) return;
  Registry& registry = Registry::instance();
  release_passed_managed_frees(registry);
  // What dead graphs gave back (Note [Graph lifetimes]): else counted only after the next
  // allocation or free.
  if (CapturePolicy* capture = registry.capture(device); capture != nullptr) {
    await_graph_release_briefly(*capture);
    if (capture->releases_pending()) capture->drain_releases();
  }
  MemoryManager* manager = registry.manager(device);
  // Only whole idle pages: the out-of-memory path returns them to the driver, so a request of
  // any size can really get them. Free space inside pages that live slices keep (holes) serves
  // only requests that fit a hole, so counting it would let an allocation of the reported free
  // size fail.
  const ManagedSlabs* slabs = registry.managed(device);
  const std::uint64_t charged = budget::charged_now(device);  // first: budget.h
  const bool pooled = config().memgetinfo == MemGetInfoMode::pooled;
  // Before the idle pages (Note [Memory on its way to the driver]).
  const std::uint64_t on_their_way =
      pooled ? ReleaseWorker::instance().queued_bytes(device) : 0;
  const std::uint64_t idle_read = (manager != nullptr ? manager->idle_bytes_now() : 0) +
                                  (slabs != nullptr ? slabs->empty_bytes() : 0);
  // After the idle pages: what the pools took from the driver since its figure may be in both.
  const std::uint64_t grown = budget::growth_so_far(device) - grown_before;
  const auto less_grown = [grown](std::uint64_t bytes) {
    return bytes > grown ? bytes - grown : std::uint64_t{0};
  };
  const std::uint64_t counted = less_grown(idle_read + on_their_way);
  if (pooled && counted != 0) {
    const std::uint64_t room = total_bytes != nullptr && *total_bytes > *free_bytes
                                   ? *total_bytes - *free_bytes
                                   : counted;
    *free_bytes += static_cast<std::size_t>(counted < room ? counted : room);
  }
  // Queued pages are still charged (Note [Budget] in budget.cpp): they count as the idle do.
  budget::adjust_memory_info(device, charged, counted, free_bytes, total_bytes);
}

int reset_device(int device, const std::function<int()>& real) {
  return reset_pools(device, real, false);
}

namespace {

// The end of a reset's freeze: the device's pools and managed slabs take memory from the driver
// again.
void thaw_after_reset(int device) {
  Registry& registry = Registry::instance();
  if (MemoryManager* manager = registry.manager(device)) manager->set_frozen(false);
  registry.thaw_managed(device);
}

int reset_pools(int device, const std::function<int()>& real, bool primary_replaced) {
  // The pools forget the device's memory before the real reset and take it up again after: a
  // cancellation inside the reset (the stand-in's waits for streams are cancellation points)
  // left them without memory the driver still held, and a free of one pointer then freed its
  // whole page under live neighbours. So the reset runs whole, and a cancellation asked for
  // meanwhile takes effect at the program's next cancellation point (Note [Cancellation]).
  NoCancel whole;
  driver::begin_pools_reset(device);  // Note [Primary contexts replaced] in driver_context.cpp
  Registry& registry = Registry::instance();
  // Created now if it does not exist yet, so that no racing first allocation can create an
  // unfrozen one during the reset.
  MemoryManager* manager = device >= 0 ? registry.manager_or_create(device) : nullptr;
  auto forget = [&] {
    if (manager != nullptr) {
      registry.forget_managed(device);  // before the device's events go (its fences are there)
      drop_held_frees(device);
      manager->forget();
      registry.capture(device)->forget();
      registry.device(device)->forget_events();
      registry.device(device)->captures_forgotten();
      hooks::device_captures_forgotten(device);
    }
    // A replaced context's streams are dead and leave the table as fences find them so (Note
    // [Stale streams] in cuda_device.cpp); the new context's, made before this forget, live.
    if (!primary_replaced) registry.streams().forget_device(device);
  };
  if (manager != nullptr) manager->set_frozen(true);
  registry.freeze_managed(device);
  stream_order::device_reset(device);
  ReleaseWorker::instance().begin_reset(device);
  forget();
  const int result = real();
  forget();
  budget::forget_device(device);
  ReleaseWorker::instance().end_reset(device);
  driver::end_pools_reset(device);
  // A free that asked the driver before the reset may still free the address after it: no page
  // or slab is taken until such frees are over (Note [Foreign frees] in foreign_frees.cpp).
  thaw_after_foreign_frees(device, &thaw_after_reset);
  return result;
}

}  // namespace

void track_stream(cudaStream_t stream, int device, unsigned int flags) {
  if (stream == nullptr || device < 0) return;
  Registry& registry = Registry::instance();
  // A stream-ordered free on this stream may be of another device's memory: its fence is an
  // event of this device (Note [Frees on another device's stream] in cuda_device.cpp), which
  // only a device the registry knows can record.
  registry.manager_or_create(device);
  registry.streams().add(stream, device, flags);
  stream_order::stream_created(device, stream, (flags & cudaStreamNonBlocking) != 0);
}

void untrack_stream(cudaStream_t stream) {
  Registry& registry = Registry::instance();
  // Out of the table first: no fence may be recorded on it once the real destroy has run. Its
  // queued work still runs after the destroy, so later fences wait for its tail (Note
  // [Destroyed streams] in cuda_device.cpp); under the table's lock, so that no fence falls
  // between the removal and the tail. Under free_fence:sync too: a stream-ordered free there
  // that gets no event of its own waits for the event batch, not for a synchronize.
  auto table = registry.streams().lock();
  TrackedStream removed;
  if (registry.streams().remove_locked(stream, &removed) &&
      config().free_fence != FreeFence::none) {
    if (CudaDevice* device = registry.device(removed.device)) device->adopt_stream_tail(stream);
  }
}

}  // namespace poolcuda::pooling
