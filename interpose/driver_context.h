// The calling thread's current driver context, as the driver hooks and the driver path of the
// library's own calls need it: its device, and whether it is that device's primary context
// (Note [Primary contexts] in driver_context.cpp). Pooled memory lives in primary contexts only;
// a context made with cuCtxCreate is another address space's business.
//
// Depends on real_driver.h.
#pragma once

#include <cuda.h>

#include <atomic>

namespace poolcuda::driver {

struct CurrentContext {
  CUcontext handle = nullptr;  // null: no context is current on this thread
  int device = -1;
  bool primary = false;
  // The current context was destroyed (Note [Destroyed contexts] in driver_context.cpp): every
  // driver call in it fails, and the real call must answer.
  bool destroyed = false;
  // A context is current and alive: calls can issue work in it.
  bool live() const { return handle != nullptr && !destroyed; }
};

CurrentContext current_context();

// Whether the program made a context of its own (cuCtxCreate, cuCtxFromGreenCtx) so far: only
// then can the runtime's calls run outside a primary context, and the runtime hooks ask
// (Note [Contexts of the program's] in driver_context.cpp). One relaxed load.
namespace detail {
inline std::atomic<bool> g_program_contexts{false};
}  // namespace detail
inline bool program_contexts_made() {
  return detail::g_program_contexts.load(std::memory_order_relaxed);
}
inline void note_program_context() {
  detail::g_program_contexts.store(true, std::memory_order_relaxed);
}

// Whether the calling thread's current context is a live context of the program's own: the
// runtime's allocations there are the driver's, not the pools'.
inline bool in_program_context() {
  if (!program_contexts_made()) return false;
  const CurrentContext ctx = current_context();
  return ctx.live() && !ctx.primary;
}

// Note [Primary contexts replaced] in driver_context.cpp: runs `forget` for each device whose
// primary context was found replaced (or destroyed by the library's own release) since the last
// call: its memory is gone. One relaxed load when none was. Only where no lock of the pools is
// held.
namespace detail {
inline std::atomic<bool> g_any_replaced{false};
void forget_marked(void (*forget)(int device));
}  // namespace detail
inline void forget_replaced(void (*forget)(int device)) {
  if (detail::g_any_replaced.load(std::memory_order_relaxed)) detail::forget_marked(forget);
}
// A reset of `device`'s pools begins (and ends): what the hooks see meanwhile is not recorded,
// and afterwards no context is known to the pools.
void begin_pools_reset(int device);
void end_pools_reset(int device);
// Looks at `device`'s primary context now, marking the device for forget_replaced() if the one
// seen before is gone; its id, or 0 when it is not alive (or has no id).
unsigned long long look_at_primary(int device);
// After a release left `device` without a primary context: whether its pools must forget that
// context's memory, `before` being its id (0: unknown). False when a thread found a later primary
// context meanwhile (and its pools forgot already), or a reset of the pools is under way.
bool claim_dead_primary(int device, unsigned long long before);
// Whether `ctx` is the primary context of a device, and which (for cuCtxDestroy).
bool is_primary(CUcontext ctx, int* device);

// Whether `device`'s primary context exists now (someone holds a reference on it).
bool primary_alive(int device);

// Makes `device`'s primary context current on this thread, if it is alive. False otherwise
// (nothing changes).
bool make_primary_current(int device);

// For a scope: makes `device`'s primary context current and puts back the thread's context
// afterwards. ok() is false when the primary context is not alive (nothing changed).
class PrimaryScope {
 public:
  explicit PrimaryScope(int device);
  ~PrimaryScope();
  PrimaryScope(const PrimaryScope&) = delete;
  PrimaryScope& operator=(const PrimaryScope&) = delete;

  bool ok() const { return ok_; }

 private:
  CUcontext saved_ = nullptr;
  bool switched_ = false;
  bool ok_ = false;
};

}  // namespace poolcuda::driver
