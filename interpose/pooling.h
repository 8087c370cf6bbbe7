// What the pools do for an allocation, a free, a memory query, a device reset and the creation
// and destruction of streams, whichever layer asked: the runtime hooks (hooks.cpp) and the driver
// hooks (driver_hooks.cpp) share one set of per-device managers, capture policies and one stream
// table, so a pointer from cudaMalloc may be freed with cuMemFree and the reverse. Callers pass
// the device (the runtime's current device, or the device of the current primary context);
// these functions answer in the pools' terms and leave the CUDA error codes to the caller.
//
// Depends on the registry, the capture policy, the budget, stream order, the log and the
// configuration.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "interpose/budget.h"
#include "interpose/release_worker.h"
#include "pools/types.h"

namespace poolcuda::pooling {

enum class Route {
  pooled,   // *ptr is a pooled allocation
  forward,  // the real allocator answers (size 0, no pools for the device, too large, no pool
            // accepts the size, out of memory after the pools' own recovery)
  refused,  // a capped pool is full: out of memory without asking the driver (logged)
};

// `api` names the call in log lines ("cudaMalloc", "cuMemAlloc"). Inside a capture window the
// device's capture policy serves it (Note [Capture windows] in capture/capture_policy.cpp).
Route allocate(const char* api, int device, std::size_t size, void** ptr);

// A request the pools do not serve: `real` allocates it (the runtime's or the driver's
// allocator, returning its result code, 0 for success) within the device's budget (Note
// [Budget] in budget.cpp). Returns the real result, or kOverBudget when the budget refused it
// and `real` was not called. Counted as passed through.
// `kind` names the counter (cudaMalloc or cudaMallocManaged).
inline constexpr int kOverBudget = -1;
enum class Passed { malloc, managed };
int forward(int device, std::size_t size, void** ptr, const std::function<int()>& real,
            Passed kind = Passed::malloc);

// The driver's free of `ptr`, which the pools do not own: made just before the real call (a
// passed-through pointer's budget charge comes off the books then, since the driver may give
// the address to another thread's allocation as soon as its free is done), finished with
// whether the driver freed it (counted as passed through and uncharged, or the charge put back).
class ForwardedFree {
 public:
  ForwardedFree(int device, const void* ptr);
  void finish(bool freed);

 private:
  int device_;
  budget::PassedCharge charge_;
};

struct Freed {
  FreeOutcome outcome = FreeOutcome::not_mine;
  int owner = -1;  // the device whose pools own the pointer
};

// Returns `ptr` to the pools that own it: the managed slabs first, then `device`'s pools, then
// every other device's (a pointer may be freed with any device current). not_mine: the real
// free answers. `stream`: a stream-ordered free on that stream, named with `device` current
// (Note [Stream-ordered frees] in pools/memory_manager.cpp); it may be another device's stream
// than the memory's (Note [Frees on another device's stream] in cuda_device.cpp).
Freed release(int device, const void* ptr, StreamToken stream = kNoStream);

// Managed allocations freed on another device's stream wait for that stream before their slab
// takes them back (Note [Managed frees on another device's stream] in pooling.cpp); to the
// program they are freed. The first gives back those whose stream has passed (call it before a
// lookup in the slabs), the second says whether the allocation that starts at `start` still
// waits.
void release_passed_managed_frees();
bool managed_free_held(DevicePtr start);

// The device whose pools (managed slabs or pages) hold `ptr`, live or free; -1 for none. A
// snapshot: memory allocated or given back meanwhile may or may not be seen.
int holder_device(const void* ptr);

// Whether `ptr` starts a live allocation of some device's managed slabs. A snapshot, as above.
bool managed_allocation(const void* ptr);

// The program destroyed a graph or an executable graph (Note [Graphs dying] in pooling.cpp).
void graph_destroyed();

// Logs a refused free (double free, interior pointer, never allocated), naming `api`.
void log_refused_free(const char* api, const void* ptr, const Freed& freed);

// Whether an IPC handle of `ptr` made by the driver would let another process open the memory
// the program means (Note [IPC handles] in pooling.cpp): true for a pointer outside the pools'
// pages, for a page's start while anything in the page lives, and for a pointer in a live
// allocation that starts its page.
// False (logged, naming `api`) for any other pointer in a pooled page.
bool ipc_exportable(const char* api, const void* ptr);

// While it lives, a growth of the held devices' pools on another thread first waits for it to
// end (at most 20 ms, once per allocation), as it waits for an out-of-memory recovery: taken by
// give_back_idle() and kept by the caller until its retry of the refused call has returned (Note
// [Room held for the retry] in pooling.cpp).
class GrowthHold {
 public:
  GrowthHold() = default;
  GrowthHold(const GrowthHold&) = delete;
  GrowthHold& operator=(const GrowthHold&) = delete;
  ~GrowthHold();
  // Holds `device` (once; a device without pools is not held).
  void hold(int device);

 private:
  std::uint64_t devices_ = 0;  // a bit per device held
};

// Gives everything `device`'s pools keep for no live slice back to the driver, waiting (10 s
// at most, as out-of-memory recovery) for the fences of freed memory (with cudafree_fences, only
// of memory freed by a free that is not stream-ordered) and for the pages to get there
// (MemoryManager::give_back_all(); Note [Stream-ordered allocations] in hooks.cpp), with the
// device's growths held by `hold` first. True when the pools had anything to give.
bool give_back_idle(int device, GrowthHold& hold,
                    GiveBackWait wait = GiveBackWait::every_fence);

// Made before a call the driver may refuse for lack of memory (one atomic load): after a
// refusal, whether a page the pools gave up reached the driver since, which makes the call worth
// trying once more on `device` even when give_back_idle() finds nothing left to give; never while
// a capture is open on `device` (Note [Room that arrived meanwhile]).
class ReturnsSince {
 public:
  ReturnsSince() : seen_(ReleaseWorker::pages_returned()) {}
  bool moved(int device) const;

 private:
  std::uint64_t seen_;
};

// Whether no memory the library could give back would make room for `size` bytes on `device`,
// the driver having refused them (Note [Requests beyond reach] in pooling.cpp). `stream_pool`: a
// stream-ordered pool's allocation, which may also take what that pool keeps, unseen: only a
// request larger than the device is beyond reach.
bool beyond_reach(int device, std::size_t size, bool stream_pool = false);
// The same for a request `device`'s budget refused: more than the budget has left and everything
// the library could give back. False without a budget.
bool beyond_budget_reach(int device, std::size_t size);

// Whether `ptr` lies in a pooled page outside the bytes every live allocation asked for: memory
// the program freed (or never got, such as an allocation's padding), which the driver, knowing
// only the page, would call allocated.
bool in_pooled_free_memory(const void* ptr);


// cudaMemGetInfo/cuMemGetInfo: memgetinfo:pooled adds the idle pooled pages to *free_bytes; a
// budget (limit) caps both numbers. `grown_before` is budget::growth_so_far(device), read just
// before the driver gave its figures (Note [Memory on its way to the driver] in pooling.cpp).
void adjust_memory_info(int device, std::uint64_t grown_before, std::size_t* free_bytes,
                        std::size_t* total_bytes);

// A device reset (cudaDeviceReset, cuDevicePrimaryCtxReset, the last release of the primary
// context): `real` makes it; the pools forget the device's memory, streams and events around it
// (Note [Device reset] in pooling.cpp). Returns `real`'s result.
int reset_device(int device, const std::function<int()>& real);
// The pools of the devices whose primary context was found replaced forget its memory (Note
// [Primary contexts replaced] in driver_context.cpp). Holding no lock of the pools.
void forget_replaced_contexts();

// The program is about to issue work that may park a stream on the host: every device's open
// free-fence epoch is closed first (MemoryManager::fence_open_frees()). One atomic load per
// device with pools when no free waits in an open epoch.
void fence_before_host_work();

// A device-wide synchronize of `device` is about to begin: its pools' open batch of frees gets
// its fence now, so that the synchronize passes it and memory freed before it counts as free
// right after (cudaMemGetInfo, Note [Memory info after a synchronize] in pooling.cpp).
void before_device_synchronize(int device);

// The most a host function waits for the pools' idle memory to reach the driver before it is
// passed on: far above the time a device takes to finish the work queued before it, short
// enough that a stream parked earlier (which holds the driver's frees) costs a call little.
inline constexpr std::uint32_t kParkGiveBackMicros = 1000000;

// The program is about to issue a host function (cudaLaunchHostFunc, cudaStreamAddCallback, or
// the driver's) on `stream` (cudaStreamPerThread for the per-thread stream), which may park it
// until the program releases it: fence_before_host_work(), then, unless `stream` is capturing,
// every device's pools give their idle memory back to the driver, within kParkGiveBackMicros in
// all (MemoryManager::give_back_all()).
void before_host_function(cudaStream_t stream);

// Streams enter the table when created (in a device's primary context) and leave it just before
// the real destroy (Note [Destroyed streams] in cuda_device.cpp).
void track_stream(cudaStream_t stream, int device, unsigned int flags);
void untrack_stream(cudaStream_t stream);

}  // namespace poolcuda::pooling
