// The library's life in a process: the configuration parsed when the library loads (a malformed
// POOLCUDA_CONF stops the process with status 2 before main), confirm:1, whether this copy of
// the library is the active one (not a forked child, not a second copy loaded after another),
// whether the process ever made a CUDA call through it, and the work done at exit (Note [Exit]
// in lifecycle.cpp: nothing is ever freed).
//
// Depends on config/config.h and interpose/ only; it names no CUDA symbol.
#pragma once

#include <atomic>
#include <string>

#include "config/config.h"

namespace poolcuda {

namespace detail {
// Note [Active copy] in lifecycle.cpp.
enum CopyState : int {
  undecided,
  active,
  duplicate_unannounced,
  duplicate,
  forked_unannounced,
  forked
};
extern std::atomic<int> g_state;
extern std::atomic<bool> g_touched;
bool passthrough_slow(int state);
void first_cuda_call();
}  // namespace detail

// True when every hook must call the real function and never touch the pools: in a child
// forked after its parent used CUDA through the library (whose pools it inherited mid-flight,
// Note [Fork]) and in a second copy of the library loaded after another one (Note [Active
// copy]). The active copy pays one relaxed load.
inline bool passthrough() {
  const int state = detail::g_state.load(std::memory_order_relaxed);
  return state == detail::active ? false : detail::passthrough_slow(state);
}

// Called by every hook that reaches the pools: the process has touched CUDA through the
// library (Note [Silent processes]). One relaxed load after the first call.
inline void note_cuda_call() {
  if (!detail::g_touched.load(std::memory_order_relaxed)) detail::first_cuda_call();
}

// Whether any CUDA call reached the library in this process.
bool touched_cuda();

// Logs `message` at `level` now if the process has touched CUDA, else at its first CUDA call
// (never, if it makes none): notes about the library itself must not come from a process that
// never uses it (Note [Silent processes]).
void log_when_touched(LogLevel level, std::string message);

// Seconds since the library's constructor ran (for report headers).
double uptime_seconds();

// The configuration, parsed from POOLCUDA_CONF on first use: by the library's constructor, or
// earlier by a hook when another library's constructor calls CUDA first (Note [Load order] in
// lifecycle.cpp). A malformed value stops the process (status 2) at that first use.
const Config& config();

}  // namespace poolcuda
