// The trace generators of the side-by-side benchmark: every trace of the suite by name, built
// from a seed (the same seed and build give the same trace, operation for operation). Sizes are
// chosen so that every allocator under test can run every trace on a 16 GiB device (the CUDA
// stand-in's default), including an allocator that rounds each request up to a power of two;
// docs/benchmarks.md lists each trace and what was scaled. Depends on trace.h only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/bench/trace.h"

namespace poolcuda::bench {

struct GenOptions {
  std::uint64_t seed = 1;
  // Multiplies every operation count (allocations, repetitions, steps, live levels) for a
  // quick run; 1 is the full suite. Each count keeps a small floor.
  double scale = 1.0;
};

struct TraceEntry {
  std::string name;
  std::string summary;  // one line, becomes the trace's description
};

// Every trace of the suite, in the order the benchmark runs and prints them.
std::vector<TraceEntry> suite_traces();

// Builds the named trace; nullopt for a name the suite does not have.
std::optional<Trace> generate(std::string_view name, const GenOptions& options);

// The families, for the registry and for tests. `threads` splits the family's work into that
// many independent per-thread streams (each with its own sub-seed).
Trace rmm_random(std::uint64_t allocations, std::uint64_t max_size, std::size_t threads,
                 const GenOptions& options);
Trace burst_pattern(std::uint64_t repetitions, std::size_t threads, const GenOptions& options);
Trace one_buffer_loop(std::uint64_t pairs, std::uint64_t size, std::size_t threads,
                      const GenOptions& options);
Trace log_uniform_ring(std::uint64_t pairs, std::size_t live, std::size_t threads,
                       const GenOptions& options);
Trace llm_serving(std::uint64_t steps, const GenOptions& options);
Trace training(std::uint64_t steps, const GenOptions& options);
Trace live_slices(const std::vector<std::uint64_t>& levels, std::uint64_t churn,
                  const GenOptions& options);

// RMM's benchmark caps the bytes live at once at 16,000 MiB; on a 16 GiB device an allocator
// that rounds to powers of two could need twice that, so the suite caps it here (split evenly
// between threads).
inline constexpr std::uint64_t kRmmUsageCap = std::uint64_t{6} << 30;

}  // namespace poolcuda::bench
