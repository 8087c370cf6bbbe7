// The replay engine: one host thread per trace thread, one clock read per operation (the cost
// of operation i is the time from the end of operation i-1 to the end of operation i, so the
// loop's own bookkeeping is included once: harness_ns_per_pair() measures it), statistics after
// the run, and the JSON of a result.
#include "tools/bench/replay.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "tools/bench/timer.h"

namespace poolcuda::bench {
namespace {

struct Slot {
  void* ptr = nullptr;
  std::uint64_t size = 0;
};

// Slots kept empty on each side of a thread's table: two threads' small tables would otherwise
// share a cache line, and every operation's write would move it between their cores.
constexpr std::size_t kSlotPadding = 64 / sizeof(Slot);
// How many operations ahead the loop asks for the slot an operation will use. A trace of a
// million live buffers has a 16 MiB table that no cache holds: read when needed, each slot cost
// the loop a cache and TLB miss, which was counted as the allocator's time (90 to 190 ns a step
// at a million live, against 20 to 30 at a thousand).
constexpr std::size_t kSlotLookahead = 8;

// One thread's replay: its tables (sized before the clock starts), every operation's cost in
// ticks, and where it stopped.
struct ThreadRun {
  explicit ThreadRun(const ThreadOps& thread)
      : slot_storage(thread.slots + 2 * kSlotPadding), cost(thread.ops.size()) {}
  std::vector<Slot> slot_storage;  // the table, padded
  std::vector<Slot>::iterator slots_begin() { return slot_storage.begin() + kSlotPadding; }
  std::vector<std::uint64_t> cost;
  std::size_t done = 0;  // operations completed
  std::string error;
};

// Note [Threads ready before the clock]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A single-thread trace replays on the main thread, which has by then allocated host memory and,
// for the CUDA allocators, made its runtime state and context (replay_cuda.cpp's cudaFree(NULL)).
// The threads of a multi-thread trace are new: their first host allocation makes glibc a malloc
// arena for them, and their first CUDA call makes the runtime's state for them: a tenth of a
// 1,000-pair trace on the 2-core build machine (docs/benchmarks.md), counted only against the
// multi-thread run. A program's threads have done both long before their allocations matter.
// So each thread does both before the clock starts: one host allocation, and the allocator's
// prepare_thread() (cudaFree(NULL) for every CUDA allocator).
void prepare_thread(ReplayAllocator& allocator) {
  void* volatile block = std::malloc(64);
  std::free(block);
  allocator.prepare_thread();
}

void run_thread(const ThreadOps& thread, std::size_t index, ReplayAllocator& allocator,
                std::atomic<bool>& stop, ThreadRun& run) {
  const auto slots = run.slots_begin();
  const std::size_t n = thread.ops.size();
  std::uint64_t previous = ticks();
  std::size_t i = 0;
  for (; i < n; ++i) {
    if ((i & 1023) == 0 && stop.load(std::memory_order_relaxed)) {
      run.error = "stopped: another thread failed";
      break;
    }
    if (i + kSlotLookahead < n) __builtin_prefetch(&slots[thread.ops[i + kSlotLookahead].slot], 1);
    const Op& op = thread.ops[i];
    if (op.kind == OpKind::allocate) {
      void* p = allocator.allocate(op.size);
      if (p == nullptr) {
        run.error = "thread " + std::to_string(index) + ", operation " + std::to_string(i) +
                    ": allocating " + std::to_string(op.size) + " bytes failed: " +
                    allocator.failure();
        break;
      }
      slots[op.slot] = {p, op.size};
    } else if (op.kind == OpKind::release) {
      if (!allocator.release(slots[op.slot].ptr, slots[op.slot].size)) {
        run.error = "thread " + std::to_string(index) + ", operation " + std::to_string(i) +
                    ": freeing " + std::to_string(slots[op.slot].size) + " bytes failed: " +
                    allocator.failure();
        break;
      }
    }
    const std::uint64_t now = ticks();
    run.cost[i] = now - previous;
    previous = now;
  }
  run.done = i;
  if (!run.error.empty()) stop.store(true);
}

double percentile(std::vector<std::uint64_t>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t k =
      std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return static_cast<double>(v[k]);
}

// Pair costs (allocation + its free) and per-phase step costs, from the completed operations.
void summarize(const Trace& trace, const std::vector<ThreadRun>& runs, ReplayResult& result) {
  const double scale = ns_per_tick();
  std::vector<std::uint64_t> pairs;
  struct PhaseCosts {
    std::vector<std::uint64_t> steps;
    std::uint64_t total = 0;
  };
  std::vector<PhaseCosts> phases(trace.phases.size());
  for (std::size_t t = 0; t < runs.size(); ++t) {
    const ThreadOps& thread = trace.threads[t];
    std::vector<std::uint64_t> alloc_cost(thread.slots, 0);
    std::size_t phase = trace.phases.size();  // none yet
    std::uint64_t pending = 0;                // first half of a phase step
    bool half = false;
    for (std::size_t i = 0; i < runs[t].done; ++i) {
      const Op& op = thread.ops[i];
      const std::uint64_t c = runs[t].cost[i];
      if (op.kind == OpKind::phase) {
        phase = op.slot;
        half = false;
        continue;
      }
      if (op.kind == OpKind::allocate) {
        alloc_cost[op.slot] = c;
      } else {
        pairs.push_back(alloc_cost[op.slot] + c);
      }
      if (phase < phases.size()) {
        if (half) phases[phase].steps.push_back(pending + c);
        phases[phase].total += c;
        pending = c;
        half = !half;
      }
    }
  }
  result.pairs = pairs.size();
  if (!pairs.empty()) {
    long double sum = 0;
    for (std::uint64_t c : pairs) sum += c;
    result.mean_ns = static_cast<double>(sum / pairs.size()) * scale;
    result.median_ns = percentile(pairs, 0.5) * scale;
    result.p99_ns = percentile(pairs, 0.99) * scale;
  }
  for (std::size_t p = 0; p < phases.size(); ++p) {
    PhaseResult r;
    r.name = trace.phases[p];
    r.steps = phases[p].steps.size();
    if (r.steps != 0) {
      r.mean_ns = static_cast<double>(phases[p].total) / static_cast<double>(r.steps) * scale;
      r.median_ns = percentile(phases[p].steps, 0.5) * scale;
    }
    result.phases.push_back(r);
  }
}

class NullAllocator final : public ReplayAllocator {
 public:
  void* allocate(std::uint64_t) override { return &byte_; }
  bool release(void*, std::uint64_t) override { return true; }
  std::string failure() override { return {}; }
  void reset_meters() override {}
  Meters meters() override { return {}; }

 private:
  char byte_ = 0;
};

void append_number(std::string& out, const char* key, double value, bool integer = false) {
  char buffer[96];
  std::snprintf(buffer, sizeof buffer, integer ? ",\"%s\":%.0f" : ",\"%s\":%.1f", key, value);
  out += buffer;
}

void append_optional(std::string& out, const char* key, const std::optional<std::uint64_t>& v) {
  out += ",\"";
  out += key;
  out += "\":";
  out += v ? std::to_string(*v) : "null";
}

std::string json_head(const std::string& trace, const std::string& allocator,
                      const std::string& label, bool ok, const std::string& error) {
  std::string out = "{\"trace\":" + json_string(trace) + ",\"allocator\":" +
                    json_string(allocator) + ",\"label\":" + json_string(label) +
                    ",\"status\":" + (ok ? "\"ok\"" : "\"failed\"");
  if (!ok) out += ",\"error\":" + json_string(error);
  return out;
}

}  // namespace

ReplayResult replay(const Trace& trace, ReplayAllocator& allocator) {
  ReplayResult result;
  result.figures = figures(trace);
  ns_per_tick();  // calibrate before the clock matters
  std::vector<ThreadRun> runs(trace.threads.begin(), trace.threads.end());
  std::atomic<bool> stop{false};
  using Clock = std::chrono::steady_clock;
  if (trace.threads.size() == 1) {
    allocator.reset_meters();
    const Clock::time_point start = Clock::now();
    run_thread(trace.threads[0], 0, allocator, stop, runs[0]);
    result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } else {
    // The clock runs from the first thread's start to the last one's end, each read by the
    // thread itself: neither the creation of the threads, nor the wake-up of a thread that slept
    // while the others started, nor the join afterwards is the allocator's time (on this
    // 2-core machine each costs tens of microseconds, as much as a whole 1,000-pair trace). The
    // threads start together, ready (Note [Threads ready before the clock]): each spins until
    // all are ready, and the last to be ready resets the meters, after what the preparations
    // counted, before it lets them go. (The main thread waits in the join: a third thread
    // spinning on two cores made the threads start apart.)
    const std::size_t n = trace.threads.size();
    std::atomic<std::size_t> ready{0};  // n + 1 once the meters are reset: go
    std::vector<Clock::time_point> starts(n), ends(n);
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < n; ++t) {
      workers.emplace_back([&, t] {
        prepare_thread(allocator);
        if (ready.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
          allocator.reset_meters();
          ready.fetch_add(1, std::memory_order_acq_rel);
        }
        // Yields now and then: with fewer cores than threads, a pure spin would hold the core
        // the last thread needs to arrive.
        for (unsigned spins = 1; ready.load(std::memory_order_acquire) != n + 1; ++spins) {
          if (spins % 64 == 0) std::this_thread::yield();
        }
        starts[t] = Clock::now();
        run_thread(trace.threads[t], t, allocator, stop, runs[t]);
        ends[t] = Clock::now();
      });
    }
    for (std::thread& w : workers) w.join();
    result.wall_seconds = std::chrono::duration<double>(
                              *std::max_element(ends.begin(), ends.end()) -
                              *std::min_element(starts.begin(), starts.end()))
                              .count();
  }
  result.meters = allocator.meters();
  for (const ThreadRun& run : runs) {
    // The first real failure, not a thread that stopped because of it.
    if (!run.error.empty() && (result.ok || result.error.rfind("stopped:", 0) == 0)) {
      result.ok = false;
      result.error = run.error;
    }
  }
  summarize(trace, runs, result);
  if (result.wall_seconds > 0) {
    result.pairs_per_second = static_cast<double>(result.pairs) / result.wall_seconds;
  }
  return result;
}

std::unique_ptr<ReplayAllocator> make_null_allocator() {
  return std::make_unique<NullAllocator>();
}

double harness_ns_per_pair() {
  Trace trace;
  trace.name = "harness";
  trace.threads.resize(1);
  trace.threads[0].slots = 1;
  for (int i = 0; i < 20000; ++i) {
    trace.threads[0].ops.push_back({OpKind::allocate, 0, 64});
    trace.threads[0].ops.push_back({OpKind::release, 0, 0});
  }
  NullAllocator null;
  return replay(trace, null).median_ns;
}

std::string result_json(const Trace& trace, const std::string& allocator,
                        const std::string& label, const ReplayResult& r) {
  std::string out = json_head(trace.name, allocator, label, r.ok, r.error);
  out += ",\"threads\":" + std::to_string(trace.threads.size());
  out += ",\"trace_pairs\":" + std::to_string(r.figures.pairs);
  out += ",\"pairs\":" + std::to_string(r.pairs);
  append_number(out, "median_ns", r.median_ns);
  append_number(out, "p99_ns", r.p99_ns);
  append_number(out, "mean_ns", r.mean_ns);
  append_number(out, "pairs_per_second", r.pairs_per_second, true);
  char wall[64];
  std::snprintf(wall, sizeof wall, ",\"wall_seconds\":%.4f", r.wall_seconds);
  out += wall;
  out += ",\"peak_live_bytes\":" + std::to_string(r.figures.peak_live);
  append_optional(out, "peak_reserved_bytes", r.meters.reserved_peak);
  append_optional(out, "reserved_at_end_bytes", r.meters.reserved_now);
  append_optional(out, "driver_allocs", r.meters.driver_allocs);
  append_optional(out, "driver_frees", r.meters.driver_frees);
  append_optional(out, "event_records", r.meters.event_records);
  out += ",\"phases\":[";
  for (std::size_t i = 0; i < r.phases.size(); ++i) {
    const PhaseResult& p = r.phases[i];
    out += (i ? ",{\"name\":" : "{\"name\":") + json_string(p.name);
    out += ",\"steps\":" + std::to_string(p.steps);
    append_number(out, "median_ns", p.median_ns);
    append_number(out, "mean_ns", p.mean_ns);
    out += "}";
  }
  out += "],\"timer\":";
  out += json_string(tick_source());
  append_number(out, "harness_ns_per_pair", harness_ns_per_pair());
  return out + "}";
}

std::string setup_failure_json(const std::string& trace_name, const std::string& allocator,
                               const std::string& label, const std::string& error) {
  return json_head(trace_name, allocator, label, false, error) + "}";
}

}  // namespace poolcuda::bench
