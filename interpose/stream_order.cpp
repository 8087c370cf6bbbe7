// StreamOrder (see stream_order.h).
//
// Note [Stream-ordered reuse]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Claim. If every operation that can touch a device's memory is issued to a set Q of streams
// that is totally ordered (of any two operations, the one issued later starts only after the
// other completed), a slice freed at host time t may go to a new owner at once. Proof: the old
// owner's work that may use the slice was issued before t (after cudaFree the program makes
// no new use of it); the new owner learns the address after t, so all its work is issued after
// t; in a total order that respects issue order, all of it runs after all of the old work.
// Which sets are totally ordered? An operation on the legacy default stream L waits for every
// operation issued before it on every blocking stream of the device, and an operation on a
// blocking stream waits for every operation issued before it on L; a stream is FIFO. So
// Q = {L} plus at most one blocking stream B (created, or a thread's per-thread default
// stream, which is blocking) is totally ordered: of two operations on L and B, the later
// waits for the earlier. Two blocking streams besides L are not ordered with each other, and
// a non-blocking stream is not ordered with L at all. Work of another device that reads this
// device's memory (peer access, a peer copy) is in no such order either.
// So under free_fence:auto a device is ordered while: every stream creation and every use of a
// per-thread default stream is visible to the hooks, at most one blocking stream and no
// non-blocking stream was ever created on it, per-thread default streams count as blocking
// streams (one per thread seen using one), it is the only device the process ever used (made
// current, gave pools or a stream to), and no peer access or peer copy was asked for. A graph
// runs as one operation of the stream it is launched on, and the memory its nodes use is
// pinned by the capture policy, so captures change nothing; but a device is never left ordered
// while a capture is open on it (below), so it leaves before the capture begins.
// Leaving. When a condition fails at host time t_x (a stream appears, a second thread uses
// its per-thread stream, another device comes in), memory already reused may still be in use
// by work issued before t_x. set_stream_ordered(false) first makes every later free fenced and
// returns only once every free that judged the device ordered has finished (it takes the
// manager's lock). Then one event F is recorded on L: it completes after everything issued
// before it on L and on every blocking stream. Until F has completed, every queue the program
// can reach that is not ordered after L waits for F before the program can put work on it:
// - a non-blocking stream created later, on any device (another device's work can reach this
//   memory by a copy), waits for F before the program sees its handle;
// - another device's legacy stream waits for F at that device's first use (made current, given
//   pools or a stream); its blocking and per-thread streams then follow by its own legacy rule;
// - when another device comes in, every non-blocking stream in the stream table waits for F.
// A new blocking stream or per-thread stream of this device orders after F by L's own rule.
// The first use is enough: a device is ordered only while no other device was ever used, so
// every F is recorded before any other device's first use, and none after it. F stays pending
// until a query finds it complete (a device reset drops its device's fences: the reset waits
// for all of that work). Recording on L would invalidate a capture a blocking stream has open,
// hence the rule above. Leaving is final: a device that left never comes back.
// What the library cannot see: per-thread default streams are seen through the hooked entry
// points (cudaLaunchKernel, copies and memsets of every shape, host functions, graph launches,
// event records and waits, in both flavours, and the cudaStreamPerThread handle given to them:
// a thread whose only work was a 2D copy once went unseen); two threads
// that use their per-thread streams only through a library with its own runtime, handing it
// cudaStreamPerThread, are not seen. Stream creation is hooked at both layers, but the driver's
// launches and copies are not: a program that calls the driver itself (cuMemAlloc, cuMemFree,
// cuStreamCreate from its own code or from a statically linked runtime; the dynamic runtime's
// calls come from inside the library's hooks and do not count) could use per-thread streams
// there, so its devices leave ordered reuse at its first such call (driver_used_directly).
// A program that never allocates, frees or creates a stream through the driver but launches or
// copies there on per-thread streams is not seen; such a program should run with
// free_fence:events. A device made current through the driver (cuCtxSetCurrent, a push or pop,
// cuCtxCreate) counts as used, as after cudaSetDevice (context_switched).
//
// Note [Leaving behind a park]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// F need not cover all the work issued before t_x, only the old owners' work of memory freed
// while the device was ordered, all issued before the last such free. That matters when the
// program has parked L (or a blocking stream, which L then waits for) on a host function it
// releases later: an F recorded after the park completes only after the park, and a stream
// created during it would wait for it, so the program's cudaStreamSynchronize of a stream it
// never used would hang where the plain call returns. So before host work (a host function, a
// graph launch) an ordered device records an event on L, once per batch of frees (the
// manager's free count), and leaving uses that event as F when no free came after it; otherwise
// it records a new one as before. A cudaFree during the park blocks the plain program's thread
// until the park ends, but a cudaFreeAsync on the parked stream or another thread's free does
// not: after one of those, leaving records F behind the park, and a stream created then waits
// for it (docs/limits.md). Fencing every free made while host work may still run avoids that,
// but a loop that queues a host function each iteration then ran 3 to 5 times as long and
// returned its page to the driver every few iterations, slower than plain CUDA.
//
//
// Note [Leaving before any free]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// F exists for memory that changed owners while the device was ordered. A device whose pools
// never had a free (a thread cache's parked one included: MemoryManager::frees) has handed no
// memory to a second owner, so it leaves without F, and nothing waits. That is the usual start
// of a program: allocate, start a kernel that runs until the host or a stream releases it, then
// make the streams that feed it; with F, each of those streams first waited for that kernel,
// and the program hung where plain CUDA ran.
//
// Note [Leaving among threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A leave runs under the state's lock, but two calls decide without it whether anything is
// left to do: a thread's first use of its per-thread stream, and a capture's begin. Each read a
// flag the leave cleared first, before its barrier and before F was recorded, so a call in
// between went ahead as if the device had left already: a thread's first per-thread write
// raced the old owner's work on memory reused while the device was ordered (wrong bytes, in
// about half the runs of twelve threads that began at once with another thread creating a
// stream), and a capture begun on a blocking stream was invalidated by F's record on the
// legacy stream. Both now read the count of ordered devices, which a leave lowers only once F
// is recorded: a call that still sees it takes the lock and waits for the leave to end.
// Another device's first use had the same two faults. Its bit in `used` was set before the
// leave it caused and before that device's legacy stream waited for F, so a second thread
// making the device current at that moment found the bit and went ahead (wrong bytes in about
// half the runs of twelve threads); the bit is now set last. And a thread's first work without
// a cudaSetDevice (or after a switch of context) skipped the first use once no device was
// ordered, though fences were still pending for it to wait for: a helper thread's cudaMemcpy
// on device 0 into reused device-1 memory ran beside the old owner's kernel every time. It now
// looks while a fence may be pending too. A first driver call had the first fault again (a
// second thread's cuMemAlloc went ahead while the first one's leave had not yet made the device
// fence its frees): it now also waits while the count is raised. And a device's pools were
// published before device_added made it ordered: a thread that allocated from them in between
// and launched on its per-thread stream, or began a capture, was never counted, and the device
// became ordered with that work in flight (wrong bytes, an invalidated capture, in about 2% of
// the runs of a thread whose first calls overlapped the main thread's); the registry now calls
// device_added before it publishes the pools.
//
// Depends on the registry, the configuration and the real-function table.
#include "interpose/stream_order.h"

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "interpose/lifecycle.h"
#include "interpose/own_call.h"
#include "interpose/own_api.h"
#include "interpose/registry.h"
#include "pools/lock_order.h"

namespace poolcuda::stream_order {

namespace {

constexpr int kMaxDevices = Registry::kMaxDevices;
static_assert(kMaxDevices <= 64, "one bit per device");

std::uint64_t bit(int device) { return std::uint64_t{1} << device; }

struct DeviceState {
  std::atomic<bool> ordered{false};
  MemoryManager* manager = nullptr;
  int blocking = 0;      // blocking queues besides the legacy stream (created or per-thread)
  int non_blocking = 0;  // non-blocking streams created
  // Recorded on L before host work, and the manager's free count then (Note [Leaving behind a
  // park]).
  cudaEvent_t before_host_work = nullptr;
  std::uint64_t frees_then = 0;
};

// The event F of a device that left, while its work may still be running.
struct Fence {
  cudaEvent_t event = nullptr;
  int device = -1;
};

struct State {
  RankedMutex mutex{LockRank::stream_order};
  std::atomic<bool> visible{true};  // false once the driver is used directly
  std::atomic<int> ordered_devices{0};
  // Whether `pending` may hold a fence: another device's first use must still wait for it.
  std::atomic<bool> fences_pending{false};
  // Devices made current, given pools or streams; a device's bit is set once its first use has
  // queued its waits (Note [Leaving among threads]).
  std::atomic<std::uint64_t> used{0};
  int first_device = -1;
  bool connected = false;  // peer access, a peer copy, a second device
  std::vector<Fence> pending;
  DeviceState devices[kMaxDevices];
};

State& state() {
  static State* s = new State;  // never destroyed (Note [Exit] in lifecycle.cpp)
  return *s;
}

bool in_range(int device) { return device >= 0 && device < kMaxDevices; }

// Whether the device may be ordered now (Note [Stream-ordered reuse]). Caller holds the lock.
bool may_be_ordered(const State& s, int device) {
  const DeviceState& d = s.devices[device];
  return s.visible.load() && !s.connected && s.first_device == device &&
         (s.used.load() & ~bit(device)) == 0 && d.non_blocking == 0 && d.blocking <= 1 &&
         d.manager != nullptr;
}

// Forgets the fences that have completed. Caller holds the lock and an own-call scope.
void prune(State& s) {
  std::erase_if(s.pending, [](const Fence& fence) {
    // Any answer but "not ready" is final (an event of a failed context never completes).
    if (own::cudaEventQuery()(fence.event) == cudaErrorNotReady) return false;
    own::cudaEventDestroy()(fence.event);
    return true;
  });
  s.fences_pending.store(!s.pending.empty(), std::memory_order_release);
}

// Whether a first use of a device may have something to do: a device is still ordered, or a
// fence may still be pending. Read without the lock.
bool first_use_matters(const State& s) {
  return s.ordered_devices.load(std::memory_order_acquire) != 0 ||
         s.fences_pending.load(std::memory_order_acquire);
}

// `stream`, a non-blocking stream of `device` just created, waits for every pending fence.
// Caller holds the lock.
void wait_for_fences(State& s, int device, cudaStream_t stream) {
  if (s.pending.empty()) return;
  OwnCallScope scope(device);
  if (!scope.ok()) return;
  prune(s);
  for (const Fence& fence : s.pending) own::cudaStreamWaitEvent()(stream, fence.event, 0);
}

// The device leaves ordered reuse; `waiters` are made to wait for its fence F. Caller holds the
// lock.
void leave(State& s, int device, const std::vector<cudaStream_t>& waiters) {
  DeviceState& d = s.devices[device];
  if (!d.ordered.exchange(false)) return;
  // Still counted until F is recorded (or found needless, or out of reach): the calls that read
  // the count without the lock wait for this leave to end (Note [Leaving among threads]).
  struct Uncount {
    State& s;
    ~Uncount() { s.ordered_devices.fetch_sub(1, std::memory_order_release); }
  } uncount{s};
  d.manager->set_stream_ordered(false);  // a barrier: no free still judges it ordered
  OwnCallScope scope(device);
  if (!scope.ok()) return;
  cudaEvent_t fence = std::exchange(d.before_host_work, nullptr);
  // Nothing was ever freed: no memory has an old owner, and nothing needs F (Note [Leaving
  // before any free]).
  if (d.manager->frees() == 0) {
    if (fence != nullptr) own::cudaEventDestroy()(fence);
    return;
  }
  // No free since it was recorded: it covers every old owner's work (Note [Leaving behind a
  // park]).
  if (fence != nullptr && d.frees_then != d.manager->frees()) {
    own::cudaEventDestroy()(fence);
    fence = nullptr;
  }
  if (fence == nullptr) {
    if (own::cudaEventCreateWithFlags()(&fence, cudaEventDisableTiming) != cudaSuccess) {
      // Without an event, wait for the device itself: the one safe way left.
      own::cudaDeviceSynchronize()();
      return;
    }
    own::cudaEventRecord()(fence, cudaStreamLegacy);
  }
  for (cudaStream_t waiter : waiters) own::cudaStreamWaitEvent()(waiter, fence, 0);
  s.pending.push_back(Fence{fence, device});
  s.fences_pending.store(true, std::memory_order_release);
}

// Another device's work may now touch every device's memory: all leave, and every non-blocking
// stream of the process waits for each one's F.
void connect_all(State& s) {
  if (s.connected) return;
  s.connected = true;
  if (s.ordered_devices.load() == 0) return;
  std::vector<cudaStream_t> waiters;
  {
    Registry& registry = Registry::instance();
    auto table = registry.streams().lock();
    for (const TrackedStream& tracked : registry.streams().streams())
      if (tracked.non_blocking) waiters.push_back(tracked.stream);
  }
  for (int device = 0; device < kMaxDevices; ++device) leave(s, device, waiters);
}

// `device` is used: made current, given pools or given a stream. At its first use another
// device comes in, and its legacy stream waits for every pending fence. Caller holds the lock.
void use(State& s, int device) {
  if ((s.used.load() & bit(device)) != 0) return;
  // Set last: a thread that finds the bit without the lock goes ahead, so its work must come
  // after the waits queued here (Note [Leaving among threads]).
  struct MarkUsed {
    State& s;
    int device;
    ~MarkUsed() { s.used.fetch_or(bit(device), std::memory_order_release); }
  } mark{s, device};
  if (s.first_device < 0 || s.first_device == device) return;
  connect_all(s);
  if (s.pending.empty()) return;
  OwnCallScope scope(device);
  if (!scope.ok()) return;
  prune(s);
  for (const Fence& fence : s.pending)
    own::cudaStreamWaitEvent()(cudaStreamLegacy, fence.event, 0);
}

}  // namespace

void driver_used_directly() {
  State& s = state();
  // Another thread's first driver call clears the flag before its leaves (Note [Leaving among
  // threads]): while one still runs, wait for it.
  if (!s.visible.load(std::memory_order_acquire) &&
      s.ordered_devices.load(std::memory_order_acquire) == 0)
    return;
  std::lock_guard hold(s.mutex);
  if (!s.visible.exchange(false)) return;
  for (int device = 0; device < kMaxDevices; ++device) leave(s, device, {});
}

void device_added(int device, MemoryManager& manager) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard hold(s.mutex);
  s.devices[device].manager = &manager;
  if (s.first_device < 0) s.first_device = device;
  use(s, device);
  // Only free_fence:auto follows the stream order; the others never leave, so never enter.
  if (config().free_fence != FreeFence::automatic || !may_be_ordered(s, device)) return;
  manager.set_stream_ordered(true);
  s.devices[device].ordered.store(true);
  s.ordered_devices.fetch_add(1);
}

void device_reset(int device) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard hold(s.mutex);
  // Host work during the reset records no new one: the device's manager is frozen meanwhile.
  const cudaEvent_t event = std::exchange(s.devices[device].before_host_work, nullptr);
  if (event == nullptr && s.pending.empty()) return;
  OwnCallScope scope(device);
  if (event != nullptr) own::cudaEventDestroy()(event);
  std::erase_if(s.pending, [device](const Fence& fence) {
    if (fence.device != device) return false;
    own::cudaEventDestroy()(fence.event);
    return true;
  });
  s.fences_pending.store(!s.pending.empty(), std::memory_order_release);
}

void stream_created(int device, cudaStream_t stream, bool non_blocking) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard hold(s.mutex);
  DeviceState& d = s.devices[device];
  if (non_blocking) {
    ++d.non_blocking;
  } else {
    ++d.blocking;
  }
  use(s, device);
  if (!may_be_ordered(s, device)) leave(s, device, {});
  if (non_blocking) wait_for_fences(s, device, stream);
}

namespace {
__attribute__((tls_model("initial-exec"))) thread_local bool t_per_thread_seen = false;
}  // namespace

bool per_thread_stream_seen() { return t_per_thread_seen; }

void per_thread_stream_gone() { t_per_thread_seen = false; }

void per_thread_stream_used() {
  t_per_thread_seen = true;
  State& s = state();
  // Zero once every leave has recorded its F (Note [Leaving among threads]).
  if (s.ordered_devices.load(std::memory_order_acquire) == 0) return;
  static thread_local bool counted[kMaxDevices] = {};
  int device = -1;
  if (own::cudaGetDevice()(&device) != cudaSuccess || !in_range(device) || counted[device])
    return;
  counted[device] = true;
  std::lock_guard hold(s.mutex);
  ++s.devices[device].blocking;
  if (!may_be_ordered(s, device)) leave(s, device, {});
}

void device_made_current(int device) {
  if (!in_range(device)) return;
  note_cuda_call();  // before the lock: Note [Fork] in lifecycle.cpp
  State& s = state();
  if ((s.used.load(std::memory_order_acquire) & bit(device)) != 0) return;
  std::lock_guard hold(s.mutex);
  use(s, device);
}

namespace {
// Whether this thread's current device was counted since its last switch of context.
__attribute__((tls_model("initial-exec"))) thread_local bool t_device_counted = false;
}  // namespace

void work_issued() {
  if (!first_use_matters(state())) return;
  if (t_device_counted) return;
  t_device_counted = true;  // later switches go through cudaSetDevice or context_switched()
  int device = -1;
  if (own::cudaGetDevice()(&device) == cudaSuccess) device_made_current(device);
}

void context_switched() {
  t_device_counted = false;
  if (!first_use_matters(state())) return;
  CUdevice device = -1;
  if (real_driver::cuCtxGetDevice()(&device) == CUDA_SUCCESS) device_made_current(device);
}

void devices_connected() {
  note_cuda_call();  // before the lock: Note [Fork] in lifecycle.cpp
  State& s = state();
  std::lock_guard hold(s.mutex);
  connect_all(s);
}

void capture_beginning(int device) {
  if (!in_range(device)) return;
  State& s = state();
  // Not the device's flag: another thread's leave clears it before it records F on the legacy
  // stream, which would invalidate a capture begun meanwhile (Note [Leaving among threads]).
  if (s.ordered_devices.load(std::memory_order_acquire) == 0) return;
  std::lock_guard hold(s.mutex);
  leave(s, device, {});
}

void host_work_issuing() {
  State& s = state();
  if (s.ordered_devices.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard hold(s.mutex);
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceState& d = s.devices[device];
    if (!d.ordered.load() || d.manager->frozen()) continue;  // frozen: a reset is under way
    const std::uint64_t frees = d.manager->frees();
    if (d.before_host_work != nullptr && d.frees_then == frees) continue;  // still covers all
    OwnCallScope scope(device);
    if (!scope.ok()) continue;
    if (d.before_host_work == nullptr &&
        own::cudaEventCreateWithFlags()(&d.before_host_work, cudaEventDisableTiming) !=
            cudaSuccess) {
      d.before_host_work = nullptr;
      continue;
    }
    own::cudaEventRecord()(d.before_host_work, cudaStreamLegacy);
    d.frees_then = frees;
  }
}

bool ordered(int device) { return in_range(device) && state().devices[device].ordered.load(); }

}  // namespace poolcuda::stream_order
