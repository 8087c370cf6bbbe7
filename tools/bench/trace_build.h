// What the trace generators share: a seeded random generator whose sequence is fixed by this
// code alone (no standard-library distribution, whose results differ between libraries), and a
// builder that appends one thread's operations to a Trace and hands out slots. Depends on
// trace.h only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/bench/trace.h"

namespace poolcuda::bench {

// xoshiro256** seeded through splitmix64: fast, and the same numbers on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (std::uint64_t& word : state_) {
      seed += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      word = z ^ (z >> 31);
    }
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [lo, hi] (lo <= hi), by the multiply-shift reduction.
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {
    __extension__ typedef unsigned __int128 Wide;
    const Wide range = static_cast<Wide>(hi - lo) + 1;
    return lo + static_cast<std::uint64_t>((static_cast<Wide>(next()) * range) >> 64);
  }

  // Uniform in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Log-uniform in [lo, hi] (0 < lo <= hi): every octave equally likely.
  std::uint64_t log_uniform(std::uint64_t lo, std::uint64_t hi) {
    const double v = std::exp(std::log(static_cast<double>(lo)) +
                              unit() * (std::log(static_cast<double>(hi)) -
                                        std::log(static_cast<double>(lo))));
    return std::clamp(static_cast<std::uint64_t>(v), lo, hi);
  }

  // A seed for a sub-stream (one per thread of a trace), independent of this stream's use.
  static std::uint64_t derive(std::uint64_t seed, std::uint64_t stream) {
    return Rng(seed ^ (0xd1b54a32d192ed03ULL * (stream + 1))).next();
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t state_[4];
};

// Appends operations to one thread of a trace. Freed slots are reused last-in first-out, so
// the slot table stays as small as the most buffers live at once.
class ThreadBuilder {
 public:
  ThreadBuilder(Trace& trace, std::size_t thread) : trace_(trace), thread_(thread) {}

  std::uint32_t allocate(std::uint64_t size) {
    std::uint32_t slot;
    if (free_slots_.empty()) {
      slot = ops().slots++;
    } else {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    ops().ops.push_back({OpKind::allocate, slot, size});
    return slot;
  }

  void release(std::uint32_t slot) {
    ops().ops.push_back({OpKind::release, slot, 0});
    free_slots_.push_back(slot);
  }

  void phase(std::string_view label) {
    auto& phases = trace_.phases;
    auto it = std::find(phases.begin(), phases.end(), label);
    if (it == phases.end()) it = phases.insert(it, std::string(label));
    ops().ops.push_back({OpKind::phase, static_cast<std::uint32_t>(it - phases.begin()), 0});
  }

 private:
  ThreadOps& ops() { return trace_.threads[thread_]; }

  Trace& trace_;
  std::size_t thread_;
  std::vector<std::uint32_t> free_slots_;
};

// An empty trace of `threads` threads, ready for builders.
inline Trace empty_trace(std::string name, std::size_t threads, std::uint64_t seed) {
  Trace trace;
  trace.name = std::move(name);
  trace.seed = seed;
  trace.threads.resize(threads);
  return trace;
}

// A count scaled for a quick run: never below `floor`.
inline std::uint64_t scaled(std::uint64_t count, double scale, std::uint64_t floor) {
  return std::max(floor, static_cast<std::uint64_t>(static_cast<double>(count) * scale));
}

}  // namespace poolcuda::bench
