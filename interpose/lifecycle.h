// The library's life in a process: the configuration parsed when the library loads (a malformed
// POOLCUDA_CONF stops the process with status 2 before main), confirm:1, the fork handler that
// switches a child to pass-through, and the report written at exit. Nothing is ever freed at
// exit (Note [Exit] in lifecycle.cpp).
//
// Depends on pools/config.h and interpose/ only; it names no CUDA symbol.
#pragma once

#include <atomic>

#include "config/config.h"

namespace poolcuda {

namespace detail {
extern std::atomic<bool> g_passthrough;
}

// True in a forked child (and nowhere else): every hook calls the real function and never
// touches the pools, whose state the child inherited mid-flight.
inline bool passthrough() { return detail::g_passthrough.load(std::memory_order_relaxed); }

// The configuration, parsed from POOLCUDA_CONF on first use: by the library's constructor, or
// earlier by a hook when another library's constructor calls CUDA first (Note [Load order] in
// lifecycle.cpp). A malformed value stops the process (status 2) at that first use.
const Config& config();

}  // namespace poolcuda
