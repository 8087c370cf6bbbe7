// The synthetic traces (RMM's random allocations, the 16/32 MiB bursts, the one-buffer loop,
// the log-uniform ring, the live-slice levels) and the registry of the whole suite. The model
// traces (LLM serving, training) live in trace_gen_models.cpp.
#include "tools/bench/trace_gen.h"

#include <functional>
#include <string>

#include "tools/bench/trace_build.h"

namespace poolcuda::bench {
namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;

std::string thread_suffix(std::size_t threads) {
  if (threads == 1) return {};
  std::string suffix = "-";  // appended, not "-" + ...: GCC 12 at -O3 warns falsely on that
  suffix += std::to_string(threads);
  suffix += 't';
  return suffix;
}

std::string count_name(std::uint64_t n) {
  if (n >= 1000000 && n % 1000000 == 0) return std::to_string(n / 1000000) + "M";
  if (n >= 1000 && n % 1000 == 0) return std::to_string(n / 1000) + "k";
  return std::to_string(n);
}

std::string size_name(std::uint64_t bytes) {
  if (bytes % GiB == 0) return std::to_string(bytes / GiB) + "GiB";
  if (bytes % MiB == 0) return std::to_string(bytes / MiB) + "MiB";
  if (bytes % KiB == 0) return std::to_string(bytes / KiB) + "KiB";
  return std::to_string(bytes) + "B";
}

}  // namespace

// RMM's random_allocations pattern, per thread: 2N steps; each draws a size uniform in
// [1, max]; with nothing live it allocates, otherwise it allocates with probability 73% while
// fewer than N allocations were made and the live bytes stay under the cap, and frees a
// uniformly chosen live buffer in every other case. Whatever is live at the end is freed.
Trace rmm_random(std::uint64_t allocations, std::uint64_t max_size, std::size_t threads,
                 const GenOptions& options) {
  Trace trace = empty_trace("rmm-" + count_name(allocations) + "-" + size_name(max_size) +
                                thread_suffix(threads),
                            threads, options.seed);
  const std::uint64_t per_thread = scaled(allocations / threads, options.scale, 10);
  const std::uint64_t cap = kRmmUsageCap / threads;
  for (std::size_t t = 0; t < threads; ++t) {
    Rng rng(Rng::derive(options.seed, t));
    ThreadBuilder builder(trace, t);
    struct Live {
      std::uint32_t slot;
      std::uint64_t size;
    };
    std::vector<Live> live;
    std::uint64_t made = 0, bytes = 0;
    for (std::uint64_t step = 0; step < 2 * per_thread; ++step) {
      const std::uint64_t size = rng.uniform(1, max_size);
      bool allocate = true;
      if (!live.empty()) {
        const bool chance = rng.uniform(0, 99) < 73;
        allocate = chance && made < per_thread && bytes + size < cap;
      }
      if (allocate) {
        live.push_back({builder.allocate(size), size});
        ++made;
        bytes += size;
      } else {
        const std::size_t at = static_cast<std::size_t>(rng.uniform(0, per_thread - 1) %
                                                        live.size());
        builder.release(live[at].slot);
        bytes -= live[at].size;
        live[at] = live.back();
        live.pop_back();
      }
    }
    for (const Live& l : live) builder.release(l.slot);
  }
  return trace;
}

// Eight 16 MiB buffers allocated then freed, then four 32 MiB ones, repeated.
Trace burst_pattern(std::uint64_t repetitions, std::size_t threads, const GenOptions& options) {
  Trace trace = empty_trace("burst-16MiB-32MiB" + thread_suffix(threads), threads, options.seed);
  const std::uint64_t per_thread = scaled(repetitions / threads, options.scale, 2);
  for (std::size_t t = 0; t < threads; ++t) {
    ThreadBuilder builder(trace, t);
    std::vector<std::uint32_t> slots;
    for (std::uint64_t r = 0; r < per_thread; ++r) {
      for (auto [count, size] : {std::pair{8, 16 * MiB}, std::pair{4, 32 * MiB}}) {
        slots.clear();
        for (int i = 0; i < count; ++i) slots.push_back(builder.allocate(size));
        for (std::uint32_t slot : slots) builder.release(slot);
      }
    }
  }
  return trace;
}

// One buffer of `size` bytes allocated and freed again and again.
Trace one_buffer_loop(std::uint64_t pairs, std::uint64_t size, std::size_t threads,
                      const GenOptions& options) {
  Trace trace =
      empty_trace("loop-" + size_name(size) + thread_suffix(threads), threads, options.seed);
  const std::uint64_t per_thread = scaled(pairs / threads, options.scale, 10);
  for (std::size_t t = 0; t < threads; ++t) {
    ThreadBuilder builder(trace, t);
    for (std::uint64_t i = 0; i < per_thread; ++i) builder.release(builder.allocate(size));
  }
  return trace;
}

// A ring of `live` buffers with sizes log-uniform in [512 B, 16 MiB]: each step frees the
// oldest and allocates a new one.
Trace log_uniform_ring(std::uint64_t pairs, std::size_t live, std::size_t threads,
                       const GenOptions& options) {
  Trace trace = empty_trace("ring" + std::to_string(live) + "-512B-16MiB" +
                                thread_suffix(threads),
                            threads, options.seed);
  const std::uint64_t per_thread = scaled(pairs / threads, options.scale, 2 * live);
  for (std::size_t t = 0; t < threads; ++t) {
    Rng rng(Rng::derive(options.seed, t));
    ThreadBuilder builder(trace, t);
    std::vector<std::uint32_t> ring;
    std::size_t oldest = 0;
    for (std::uint64_t i = 0; i < per_thread; ++i) {
      const std::uint64_t size = rng.log_uniform(512, 16 * MiB);
      if (ring.size() < live) {
        ring.push_back(builder.allocate(size));
        continue;
      }
      builder.release(ring[oldest]);
      ring[oldest] = builder.allocate(size);
      oldest = (oldest + 1) % live;
    }
    for (std::size_t i = 0; i < ring.size(); ++i) builder.release(ring[(oldest + i) % ring.size()]);
  }
  return trace;
}

// Grows to each live level in turn with sizes log-uniform in [64 B, 64 KiB] (phase
// grow-LEVEL), then churns `churn` steps at that level (phase live-LEVEL: each step frees a
// uniformly chosen live slice and allocates a new one), and finally frees everything in a
// random order (phase drain).
Trace live_slices(const std::vector<std::uint64_t>& levels, std::uint64_t churn,
                  const GenOptions& options) {
  Trace trace = empty_trace("slices-" + count_name(levels.empty() ? 0 : levels.back()), 1,
                            options.seed);
  Rng rng(Rng::derive(options.seed, 0));
  ThreadBuilder builder(trace, 0);
  std::vector<std::uint32_t> live;
  const std::uint64_t steps = scaled(churn, options.scale, 100);
  for (std::uint64_t nominal : levels) {
    const std::uint64_t level = scaled(nominal, options.scale, 10);
    builder.phase("grow-" + count_name(level));
    while (live.size() < level) live.push_back(builder.allocate(rng.log_uniform(64, 64 * KiB)));
    builder.phase("live-" + count_name(level));
    for (std::uint64_t i = 0; i < steps; ++i) {
      const std::size_t at = static_cast<std::size_t>(rng.uniform(0, live.size() - 1));
      builder.release(live[at]);
      live[at] = builder.allocate(rng.log_uniform(64, 64 * KiB));
    }
  }
  builder.phase("drain");
  for (std::size_t i = live.size(); i > 1; --i) {
    std::swap(live[i - 1], live[static_cast<std::size_t>(rng.uniform(0, i - 1))]);
  }
  for (std::uint32_t slot : live) builder.release(slot);
  return trace;
}

namespace {

struct Family {
  TraceEntry entry;
  std::function<Trace(const GenOptions&)> make;
};

// Each entry's counts are the full suite's; GenOptions::scale shrinks them.
const std::vector<Family>& families() {
  static const std::vector<Family> table = [] {
    std::vector<Family> t;
    for (std::size_t threads : {1, 2}) {
      for (std::uint64_t n : {1000, 10000, 100000}) {
        for (std::uint64_t max : {1 * MiB, 64 * MiB, 1 * GiB}) {
          std::string name = "rmm-" + count_name(n) + "-" + size_name(max) +
                             thread_suffix(threads);
          std::string summary = "RMM random allocations: " + count_name(n) +
                                " allocations, sizes uniform in 1 B.." + size_name(max) +
                                ", 73% allocate, at most " + size_name(kRmmUsageCap) + " live";
          if (threads > 1) summary += ", split between 2 threads";
          t.push_back({{name, summary}, [n, max, threads](const GenOptions& o) {
                         return rmm_random(n, max, threads, o);
                       }});
        }
      }
    }
    t.push_back({{"burst-16MiB-32MiB", "8 x 16 MiB allocated then freed, then 4 x 32 MiB, "
                                       "5,000 times"},
                 [](const GenOptions& o) { return burst_pattern(5000, 1, o); }});
    t.push_back({{"burst-16MiB-32MiB-2t", "the same, split between 2 threads"},
                 [](const GenOptions& o) { return burst_pattern(5000, 2, o); }});
    t.push_back({{"loop-64KiB", "one 64 KiB buffer allocated and freed 1,000,000 times"},
                 [](const GenOptions& o) { return one_buffer_loop(1000000, 64 * KiB, 1, o); }});
    t.push_back({{"loop-64KiB-2t", "the same, split between 2 threads"},
                 [](const GenOptions& o) { return one_buffer_loop(1000000, 64 * KiB, 2, o); }});
    t.push_back({{"ring16-512B-16MiB", "16 live buffers, log-uniform 512 B..16 MiB; each of "
                                       "100,000 allocations frees the oldest"},
                 [](const GenOptions& o) { return log_uniform_ring(100000, 16, 1, o); }});
    t.push_back({{"ring16-512B-16MiB-2t", "the same, split between 2 threads (16 live each)"},
                 [](const GenOptions& o) { return log_uniform_ring(100000, 16, 2, o); }});
    t.push_back({{"llm-serving", "LLM serving, hidden 4096, 32 layers, fp16: 300 steps of 1 to "
                                 "4096 tokens, per-request KV cache that grows and is freed"},
                 [](const GenOptions& o) { return llm_serving(300, o); }});
    t.push_back({{"training", "training, 16 layers, hidden 1024, fp16: forward activations "
                              "freed LIFO by backward, persistent weights and Adam state, 100 "
                              "steps"},
                 [](const GenOptions& o) { return training(100, o); }});
    t.push_back({{"slices-1M", "1k, 10k, 100k then 1M live slices of 64 B..64 KiB, "
                               "20,000 churn steps at each level"},
                 [](const GenOptions& o) {
                   return live_slices({1000, 10000, 100000, 1000000}, 20000, o);
                 }});
    return t;
  }();
  return table;
}

}  // namespace

std::vector<TraceEntry> suite_traces() {
  std::vector<TraceEntry> out;
  for (const Family& f : families()) out.push_back(f.entry);
  return out;
}

std::optional<Trace> generate(std::string_view name, const GenOptions& options) {
  for (const Family& f : families()) {
    if (f.entry.name != name) continue;
    Trace trace = f.make(options);
    trace.name = f.entry.name;  // scaled counts keep the suite's name
    trace.description = f.entry.summary;
    return trace;
  }
  return std::nullopt;
}

}  // namespace poolcuda::bench
