// The replayers' clock: one cheap read per operation. On x86-64 it reads the time-stamp counter
// (constant-rate on every CPU this project targets), elsewhere the steady clock in nanoseconds;
// ticks_to_ns() converts with a rate calibrated once against the steady clock. Header-only, no
// dependency beyond the standard library.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace poolcuda::bench {

inline std::uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

inline const char* tick_source() {
#if defined(__x86_64__)
  return "tsc";
#else
  return "steady_clock";
#endif
}

// Nanoseconds per tick, measured once over 20 ms of steady-clock time.
inline double ns_per_tick() {
  static const double rate = [] {
#if defined(__x86_64__)
    using Clock = std::chrono::steady_clock;
    const Clock::time_point t0 = Clock::now();
    const std::uint64_t k0 = ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const Clock::time_point t1 = Clock::now();
    const std::uint64_t k1 = ticks();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    return k1 > k0 ? ns / static_cast<double>(k1 - k0) : 1.0;
#else
    return 1.0;
#endif
  }();
  return rate;
}

}  // namespace poolcuda::bench
