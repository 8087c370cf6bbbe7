// The replay engine every allocator shares: runs a trace's threads against an allocator behind
// one small interface, times every operation, and turns the timings and the allocator's meters
// into one result (and its JSON). Knows nothing of CUDA or the pools; the replayer programs
// (replay_pools.cpp, replay_cuda.cpp) supply the allocators.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/json.h"
#include "tools/bench/trace.h"

namespace poolcuda::bench {

// What an allocator reports about its use of the device over the replay. Absent figures are
// ones it cannot know (e.g. driver calls on a real GPU).
struct Meters {
  // Device bytes obtained from the driver and not yet returned: now (after the trace freed
  // everything) and the most at once during the replay.
  std::optional<std::uint64_t> reserved_now, reserved_peak;
  // Driver allocations (cudaMalloc, cuMemAlloc), driver frees (cudaFree, cuMemFree) and event
  // records (cudaEventRecord) made during the replay.
  std::optional<std::uint64_t> driver_allocs, driver_frees, event_records;
};

class ReplayAllocator {
 public:
  virtual ~ReplayAllocator() = default;
  // A buffer of `size` bytes, or nullptr after which failure() says why. Called from the
  // trace's threads concurrently.
  virtual void* allocate(std::uint64_t size) = 0;
  // Frees a buffer allocate() returned (with its size); false on failure.
  virtual bool release(void* ptr, std::uint64_t size) = 0;
  // Why the calling thread's last allocate() or release() failed.
  virtual std::string failure() = 0;
  // Just before the replay: counters to zero, peaks restart from what is held now.
  virtual void reset_meters() = 0;
  // Just after the replay (every buffer freed, unless it failed).
  virtual Meters meters() = 0;
  // In each thread of a trace with several, before the clock starts: what the one thread of a
  // single-thread replay has done before it (Note [Threads ready before the clock] in replay.cpp).
  virtual void prepare_thread() {}
};

struct PhaseResult {
  std::string name;
  std::uint64_t steps = 0;  // consecutive operation pairs (in a churn phase: free + allocate)
  double median_ns = 0;     // per step
  double mean_ns = 0;
};

struct ReplayResult {
  bool ok = true;
  std::string error;          // set when !ok
  std::uint64_t pairs = 0;    // allocations freed during the replay (all of them when ok)
  // Per pair: the allocation's cost plus its free's cost, over every pair of every thread.
  double median_ns = 0, p99_ns = 0, mean_ns = 0;
  double pairs_per_second = 0;  // all threads together, over the replay's wall time
  double wall_seconds = 0;
  std::vector<PhaseResult> phases;
  Meters meters;
  TraceFigures figures;
};

// Replays `trace` (one host thread per trace thread, started together). Stops at the first
// failed operation and reports it; buffers still live then are abandoned.
ReplayResult replay(const Trace& trace, ReplayAllocator& allocator);

// An allocator that does nothing, successfully (every allocation is the same non-null
// pointer): replaying a trace through it measures the replay loop itself.
std::unique_ptr<ReplayAllocator> make_null_allocator();

// The median cost of an allocate+free pair through the replay loop itself (the null allocator
// on a one-buffer loop): what every figure includes besides the allocator.
double harness_ns_per_pair();

// One JSON object describing a run (status "ok" or "failed"); docs/benchmarks.md lists the keys.
std::string result_json(const Trace& trace, const std::string& allocator,
                        const std::string& label, const ReplayResult& result);

// A run that never started (the allocator could not be set up), in the same shape.
std::string setup_failure_json(const std::string& trace_name, const std::string& allocator,
                               const std::string& label, const std::string& error);

}  // namespace poolcuda::bench
