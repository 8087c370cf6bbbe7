// The current driver context and primary contexts (see driver_context.h).
//
// Note [Primary contexts]
// The runtime works in each device's primary context (one per device, reference counted), and so
// does a static cudart; a driver program may use it too (cuDevicePrimaryCtxRetain) or make
// contexts of its own (cuCtxCreate), whose memory the primary context cannot use. The pools
// belong to the primary context, so a driver hook pools only when the current context is its
// device's primary one. The driver has no "is this primary?" query: the answer comes from
// comparing the context with the device's primary context, which cuDevicePrimaryCtxRetain gives
// (paired with a release, and only while the primary context is alive, so that the check never
// creates or destroys it). Context ids (cuCtxGetId) are never reused in a process, so the answer
// is cached per thread by id: a hook costs two driver calls (current context, its id). Without
// cuCtxGetId (drivers older than 12.0) the check runs on every call.
//
// Note [Primary contexts replaced]
// The last release of a primary context destroys it, and its memory with it; the next retain
// makes a new one. The release hook forgets the pools when the context is gone after the
// release, but another thread may retain the device's primary context between the release and
// that look: the look then found it alive, the pools kept the dead context's pages and handed
// them out in the new one (copies refused, kernels faulting). The library's own retain and
// release pair (above) can be the last release too, when the program's own last release lands
// between the two, and no hook sees that one. So each device keeps the id of the primary context
// whose memory the pools may hold: the first one the hooks see after a reset (0 until then). A
// primary context seen with a larger id replaced it, and it is dead (there is one primary
// context per device at a time, and ids grow with each context made); a smaller id is a stale
// look (a thread that read it before, and then did not run for a while). The library's own
// release that leaves the context it looked at dead finds that id dead too. Such a discovery
// may come inside one of the library's own calls, under a lock of the pools, so it only notes
// the dead id; the pools forget at the next safe point (a pooled allocation or free, or the
// release hook) before they touch the pools, and only while the slot still holds that id: the
// compare-exchange that takes it out decides which thread resets, and a dead id noted again
// after the reset finds another value there. The release hook reads the id before the real
// release; a release that leaves no primary context resets the pools unless the slot moved on
// to a later context (whose pools forgot this one's memory already). While the pools reset, the
// slot says so: nothing seen is recorded then, and no second reset starts beside the first
// (it could forget memory the first let in). A hit of a thread's cached context records its id
// again after a reset (one load when it is there). Left: a thread that allocates in the new
// context between another thread's discovery and the forget may still get a slice of the dead
// context.
//
// Note [Destroyed contexts]
// A context destroyed by one thread stays current on the others, and every driver call they make
// in it fails with CUDA_ERROR_CONTEXT_IS_DESTROYED: a cuCtxCreate context another thread
// destroyed, or a device's old primary context after a reset (cudaDeviceReset,
// cuDevicePrimaryCtxReset, the last release). The driver hooks must answer such a call as the
// driver does, never free or hand out pooled memory in it: a free there once gave a live buffer
// of the program back to the pools, to be handed out again over its bytes. cuCtxGetId and
// cuCtxGetDevice fail in a destroyed context (CUDA_ERROR_CONTEXT_IS_DESTROYED), so no cached
// answer is read for it, and current_context() reports it as destroyed.
//
// Note [Contexts of the program's]
// The runtime's calls run in the thread's current context, which is a context of the program's
// own while one of cuCtxCreate is current (PyCUDA makes its contexts so, and cuBLAS and cuDNN then
// allocate their workspaces with cudaMalloc in them). Memory from the pools is the primary
// context's: handed out there, a kernel of the other context could not use it, and a page grown
// there went with that context's cuCtxDestroy while the pools still handed out its slices. So a
// runtime allocation in a context of the program's goes to the driver, as a driver one does
// (counted against a `limit` as any request the pools do not serve), and a runtime free of pooled
// memory there is taken back in the primary context. Asking for the current context costs
// driver calls on every allocation and free; a process that never made a context (nearly all)
// is spared them: the hooks of the calls that make one set a flag, and the runtime hooks ask
// only once it is set.
//
// Depends on real_driver.h.
#include "interpose/driver_context.h"

#include <atomic>

#include "interpose/real_driver.h"

namespace poolcuda::driver {

namespace {

struct Cached {
  unsigned long long id = 0;  // 0: empty (ids start at 1)
  int device = -1;
  bool primary = false;
};

__attribute__((tls_model("initial-exec"))) thread_local Cached t_cached;

// Note [Primary contexts replaced]: for each device, the id of the primary context whose memory
// the pools may hold (0: none known), and the id of one found dead whose memory they must forget
// at the next safe point (0: none).
constexpr int kMaxDevices = 64;
std::atomic<unsigned long long> g_primary_ids[kMaxDevices] = {};
std::atomic<unsigned long long> g_dead_ids[kMaxDevices] = {};
// In a slot while the device's pools reset: nothing seen then is recorded, and no other reset
// starts (a second reset beside the first could forget memory the first let in).
constexpr unsigned long long kResetting = ~0ULL;

bool in_range(int device) { return device >= 0 && device < kMaxDevices; }

// `dead` is the id of a primary context of `device` that is gone.
void found_dead(int device, unsigned long long dead) {
  g_dead_ids[device].store(dead, std::memory_order_release);
  detail::g_any_replaced.store(true, std::memory_order_release);
}

// Takes the slot from `from` to "resetting": true when this thread is the one to reset.
bool claim(int device, unsigned long long from) {
  unsigned long long seen = from;
  return g_primary_ids[device].compare_exchange_strong(seen, kResetting,
                                                       std::memory_order_acq_rel);
}

// Records `id` as `device`'s primary context when none is; a later one means the recorded one
// is dead. An earlier one is a stale look (a thread that read it before the recorded context was
// made, and then did not run for a while): ids grow with each context made.
void note_primary(int device, unsigned long long id) {
  if (!in_range(device) || id == 0 || id == kResetting) return;
  std::atomic<unsigned long long>& slot = g_primary_ids[device];
  unsigned long long seen = 0;
  if (slot.compare_exchange_strong(seen, id, std::memory_order_acq_rel)) return;
  if (seen != kResetting && seen < id) found_dead(device, seen);
}

// `device`'s primary context, if it is alive; null otherwise. Takes no lasting reference; when
// its release is the last one after all (the program's own last release came in between), the
// context is dead and its memory must go.
CUcontext primary_of(int device) {
  if (!primary_alive(device)) return nullptr;
  CUcontext primary = nullptr;
  if (real_driver::cuDevicePrimaryCtxRetain()(&primary, device) != CUDA_SUCCESS) return nullptr;
  unsigned long long id = 0;
  if (real_driver::cuCtxGetId()(primary, &id) == CUDA_SUCCESS) note_primary(device, id);
  real_driver::cuDevicePrimaryCtxRelease_v2()(device);
  if (primary_alive(device)) return primary;
  if (id != 0 && in_range(device)) found_dead(device, id);
  return nullptr;
}

}  // namespace

void detail::forget_marked(void (*forget)(int device)) {
  if (!detail::g_any_replaced.exchange(false, std::memory_order_acq_rel)) return;
  for (int device = 0; device < kMaxDevices; ++device) {
    const unsigned long long dead = g_dead_ids[device].exchange(0, std::memory_order_acq_rel);
    // Only while the pools still hold that context's memory: a reset since forgot it.
    if (dead != 0 && claim(device, dead)) forget(device);
  }
}

void begin_pools_reset(int device) {
  if (!in_range(device)) return;
  // Claimed already by the caller that found the context dead, or a reset of the program's.
  std::atomic<unsigned long long>& slot = g_primary_ids[device];
  unsigned long long seen = slot.load(std::memory_order_acquire);
  while (seen != kResetting &&
         !slot.compare_exchange_weak(seen, kResetting, std::memory_order_acq_rel)) {
  }
}

void end_pools_reset(int device) {
  if (in_range(device)) g_primary_ids[device].store(0, std::memory_order_release);
}

unsigned long long look_at_primary(int device) {
  const CUcontext primary = primary_of(device);
  unsigned long long id = 0;
  if (primary == nullptr || real_driver::cuCtxGetId()(primary, &id) != CUDA_SUCCESS) return 0;
  note_primary(device, id);
  return id;
}

bool primary_alive(int device) {
  unsigned int flags = 0;
  int active = 0;
  return real_driver::cuDevicePrimaryCtxGetState()(device, &flags, &active) == CUDA_SUCCESS &&
         active != 0;
}

bool claim_dead_primary(int device, unsigned long long before) {
  if (!in_range(device)) return true;
  // Not when the pools hold a later context's memory (a thread found this one dead, and they
  // forgot its memory already) or are resetting now.
  return claim(device, before) || claim(device, 0);
}

CurrentContext current_context() {
  CurrentContext current;
  if (real_driver::cuCtxGetCurrent()(&current.handle) != CUDA_SUCCESS ||
      current.handle == nullptr) {
    current.handle = nullptr;
    return current;
  }
  unsigned long long id = 0;
  const bool have_id = real_driver::cuCtxGetId()(current.handle, &id) == CUDA_SUCCESS && id != 0;
  if (have_id && t_cached.id == id) {
    current.device = t_cached.device;
    current.primary = t_cached.primary;
    // Recorded again after a reset of the pools forgot it (one load when it is there).
    if (current.primary && in_range(current.device) &&
        g_primary_ids[current.device].load(std::memory_order_relaxed) != id)
      note_primary(current.device, id);
    return current;
  }
  CUdevice device = -1;
  const CUresult asked = real_driver::cuCtxGetDevice()(&device);
  if (asked != CUDA_SUCCESS) {
    current.destroyed = asked == CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return current;
  }
  current.device = device;
  current.primary = primary_of(device) == current.handle;
  if (have_id) {
    if (current.primary) note_primary(device, id);
    t_cached = {id, current.device, current.primary};
  }
  return current;
}

bool is_primary(CUcontext ctx, int* device) {
  int count = 0;
  if (ctx == nullptr || real_driver::cuDeviceGetCount()(&count) != CUDA_SUCCESS) return false;
  for (int d = 0; d < count; ++d) {
    if (primary_of(d) == ctx) {
      *device = d;
      return true;
    }
  }
  return false;
}

bool make_primary_current(int device) {
  CurrentContext current = current_context();
  if (current.primary && current.device == device) return true;
  CUcontext primary = primary_of(device);
  return primary != nullptr && real_driver::cuCtxSetCurrent()(primary) == CUDA_SUCCESS;
}

PrimaryScope::PrimaryScope(int device) {
  if (real_driver::cuCtxGetCurrent()(&saved_) != CUDA_SUCCESS) return;
  CurrentContext current = current_context();
  if (current.primary && current.device == device) {
    ok_ = true;
    return;
  }
  ok_ = switched_ = make_primary_current(device);
}

PrimaryScope::~PrimaryScope() {
  if (switched_) real_driver::cuCtxSetCurrent()(saved_);
}

}  // namespace poolcuda::driver
