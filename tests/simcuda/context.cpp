// Driver initialization and contexts of the stand-in: the initialized flag the runtime and cuInit
// share, one primary context per device with its reference count (held by the runtime once it
// used the device, and by cuDevicePrimaryCtxRetain), contexts made by cuCtxCreate, each
// thread's current context and the contexts below it (cuCtxCreate pushes, cuCtxDestroy pops),
// and the device reset that a primary context's reset or last release performs (which also
// returns the device's contexts to their default limits, limits.cpp, and drops the code loaded
// on the device, code.cpp). Depends only on core.h.
#include "core.h"

#include <atomic>
#include <memory>
#include <mutex>

namespace poolcuda::sim {
namespace {

std::atomic<bool> g_driver_initialized{false};
std::atomic<uint64_t> g_next_context_id{1};

// Each device's primary context now. A reset replaces it (Note [Primary contexts after a
// reset]); the entries change under state_mutex() and are read without it (a pointer each).
struct Primaries {
  std::vector<std::atomic<Context*>> contexts;
  std::vector<bool> runtime_holds;  // guarded by state_mutex()
  // Every primary context made, kept for the process's life: a handle to a reset one stays safe
  // to look at. Guarded by state_mutex() after the first.
  std::vector<std::unique_ptr<Context>> made;

  Context* make(int device, int retains) {
    auto ctx = std::make_unique<Context>();
    ctx->device = device;
    ctx->id = g_next_context_id.fetch_add(1);
    ctx->primary = true;
    ctx->retains = retains;
    made.push_back(std::move(ctx));
    return made.back().get();
  }
};

Primaries& primaries() {
  static auto* p = [] {
    auto* v = new Primaries;  // never destroyed: worker threads outlive static destructors
    const auto n = static_cast<size_t>(config().devices);
    v->contexts = std::vector<std::atomic<Context*>>(n);
    v->runtime_holds.resize(n);
    for (size_t i = 0; i < n; ++i) v->contexts[i].store(v->make(static_cast<int>(i), 0));
    return v;
  }();
  return *p;
}

// The runtime takes its reference on a device's primary context once, the first time it binds it.
void runtime_hold(int device) {
  std::lock_guard lock(state_mutex());
  Primaries& p = primaries();
  if (p.runtime_holds[static_cast<size_t>(device)]) return;
  p.runtime_holds[static_cast<size_t>(device)] = true;
  ++p.contexts[static_cast<size_t>(device)].load()->retains;
}

}  // namespace

bool driver_initialized() { return g_driver_initialized.load(); }

// Called by every entry point: a store each time would move the flag's cache line between the
// threads of a multi-threaded program on every call, a cost the real runtime does not have.
void set_driver_initialized() {
  if (!g_driver_initialized.load()) g_driver_initialized.store(true);
}

Context* primary_context(int device) {
  if (!valid_device(device)) return nullptr;
  return primaries().contexts[static_cast<size_t>(device)].load();
}

Context*& thread_context() {
  thread_local Context* ctx = nullptr;
  return ctx;
}

std::vector<Context*>& contexts_below() {
  thread_local std::vector<Context*> below;
  return below;
}

void runtime_touch() {
  if (config().devices == 0) return;
  set_driver_initialized();
  // The runtime binds the current device's primary context to a thread that has none, or whose
  // primary context a reset destroyed.
  Context* ctx = thread_context();
  if (!ctx || (ctx->primary && ctx->destroyed)) runtime_bind(current_device());
}

void runtime_bind(int device) {
  Context* ctx = primary_context(device);
  if (!ctx) return;
  set_driver_initialized();
  runtime_hold(device);
  thread_context() = ctx;
}

// A primary context's last release and the reset it makes are one step to a retain, as in CUDA:
// a retain in between counted itself on the context being destroyed, and got its handle.
std::mutex& primary_lifecycle_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

void primary_retain(int device) {
  std::lock_guard lifecycle(primary_lifecycle_mutex());
  std::lock_guard lock(state_mutex());
  ++primaries().contexts[static_cast<size_t>(device)].load()->retains;
}

cudaError_t primary_release(int device) {
  std::lock_guard lifecycle(primary_lifecycle_mutex());
  {
    std::lock_guard lock(state_mutex());
    Context& ctx = *primaries().contexts[static_cast<size_t>(device)].load();
    // CUDA_ERROR_INVALID_CONTEXT, in the runtime's numbering.
    if (ctx.retains == 0) return cudaErrorDeviceUninitialized;
    if (--ctx.retains > 0) return cudaSuccess;
  }
  device_reset(device);
  return cudaSuccess;
}

bool primary_active(int device) {
  std::lock_guard lock(state_mutex());
  return primaries().contexts[static_cast<size_t>(device)].load()->retains > 0;
}

Context* create_context(int device) {
  // Kept for the process's life: a destroyed handle must stay safe to look at.
  static auto* created = new std::vector<std::unique_ptr<Context>>;
  auto ctx = std::make_unique<Context>();
  ctx->device = device;
  ctx->id = g_next_context_id.fetch_add(1);
  std::lock_guard lock(state_mutex());
  created->push_back(std::move(ctx));
  return created->back().get();
}

cudaError_t destroy_context(Context* ctx) {
  // The real driver refuses a primary context (CUDA 13, driver 580): only its last release or a
  // reset ends it. CUDA_ERROR_INVALID_CONTEXT, in the runtime's numbering.
  if (ctx->primary) return cudaErrorDeviceUninitialized;
  {
    std::lock_guard lock(state_mutex());
    if (ctx->destroyed) return cudaErrorContextIsDestroyed;
    ctx->destroyed = true;
  }
  drop_context_limits(ctx);  // its heap, FIFO and stack reservations go with it
  drop_context_code(ctx);    // and the modules loaded into it
  if (thread_context() == ctx) {  // popped, as by cuCtxPopCurrent
    std::vector<Context*>& below = contexts_below();
    thread_context() = below.empty() ? nullptr : below.back();
    if (!below.empty()) below.pop_back();
    if (thread_context()) current_device() = thread_context()->device;
  }
  return cudaSuccess;
}

// Note [Primary contexts after a reset]
// A reset (cudaDeviceReset, cuDevicePrimaryCtxReset, the last release) destroys the primary
// context: its handle stays destroyed, and the device's primary context is a new one with a new
// id, which keeps the references held on the old one. On an H200 (driver 580) making the old
// handle current succeeded and the next allocation in it failed with 709 (context destroyed);
// a retain gave the new handle. The runtime binds the new one at its next call on a thread
// whose primary context went; a driver call there gets 709 until the thread makes another
// context current.
void device_reset(int device) {
  {
    std::lock_guard lock(state_mutex());
    invalidate_device_captures_locked(device);
  }
  device_drain(device);
  device_reset_streams(device);
  device_reset_events(device);
  drop_limits(device);
  drop_code(device);
  mem_free_all(device);
  std::lock_guard lock(state_mutex());
  Primaries& p = primaries();
  Context* old = p.contexts[static_cast<size_t>(device)].load();
  p.contexts[static_cast<size_t>(device)].store(p.make(device, old->retains));
  old->destroyed = true;
  // The resetting thread, if it had the old context current, gets the new one (the runtime's
  // cudaDeviceReset leaves its thread ready for the next call).
  if (thread_context() == old) thread_context() = primary_context(device);
}

}  // namespace poolcuda::sim
