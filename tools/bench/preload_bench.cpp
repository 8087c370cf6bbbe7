// poolcuda_preload_bench: the cost of one cudaMalloc + cudaFree pair as a program sees it.
// scripts/bench runs it twice on the CUDA stand-in — under LD_PRELOAD=libpoolcuda.so and
// directly — and puts both JSON results side by side.
//
// Plain CUDA runtime code, linked to libcudart.so.13 by SONAME, knowing nothing of poolcuda:
// what it measures is whatever sits behind the cudaMalloc symbol. The stand-in's call counter
// (found with dlsym; absent on a GPU) tells how many calls reached the real allocator.
//
// Variants:
//   hit    one size, allocated and freed again and again: the pool's hit path.
//   mixed  a ring of live buffers; each pair frees the oldest and allocates the next size of a
//          fixed log-uniform cycle from 512 B to 16 MiB.
// Each variant runs one warm-up round (fills the pool), then `rounds` timed rounds of `pairs`
// pairs; the figures are the median, fastest and 90th-percentile round in ns per pair.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "bench_args.h"

namespace {

#define CHECK(call) bench::die_on_error("poolcuda_preload_bench", (call), #call, __LINE__)
using bench::parse_long;

using CounterFn = unsigned long long (*)(const char*);

struct Options {
  long pairs = 2000;   // pairs per timed round
  long rounds = 21;    // timed rounds
  std::string variant = "all";
  std::string label = "";
};

[[noreturn]] void usage(const char* message) {
  if (message) std::fprintf(stderr, "poolcuda_preload_bench: %s\n", message);
  std::fprintf(stderr,
               "usage: poolcuda_preload_bench [--pairs N] [--rounds N] [--variant hit|mixed|all]\n"
               "                              [--label TEXT]\n"
               "  --pairs N    alloc+free pairs per timed round (default 2000, 1..10000000)\n"
               "  --rounds N   timed rounds per variant (default 21, 1..10000)\n"
               "  --variant V  which loop to run (default all)\n"
               "  --label T    copied into the JSON output as \"label\"\n");
  std::exit(message ? 64 : 0);
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (i + 1 >= argc) usage(("missing value after " + std::string(arg)).c_str());
    const char* value = argv[++i];
    if (arg == "--pairs") {
      if (!parse_long(value, 1, 10000000L, opt.pairs)) usage("--pairs wants 1..10000000");
    } else if (arg == "--rounds") {
      if (!parse_long(value, 1, 10000L, opt.rounds)) usage("--rounds wants 1..10000");
    } else if (arg == "--variant") {
      opt.variant = value;
      if (opt.variant != "hit" && opt.variant != "mixed" && opt.variant != "all")
        usage("--variant wants hit, mixed or all");
    } else if (arg == "--label") {
      opt.label = value;
      if (!bench::json_safe_label(opt.label))
        usage("--label must not contain quotes, backslashes or control characters");
    } else {
      usage(("unknown option " + std::string(arg)).c_str());
    }
  }
  return opt;
}

struct Result {
  std::string name;
  std::string sizes;
  double median_ns = 0, min_ns = 0, p90_ns = 0;
  long long real_mallocs = -1, real_frees = -1;  // -1: no counter (not on the stand-in)
};

class Bench {
 public:
  explicit Bench(const Options& opt)
      : opt_(opt), counter_(reinterpret_cast<CounterFn>(dlsym(RTLD_DEFAULT, "simcuda_counter"))) {
  }

  Result hit() {
    constexpr std::size_t kSize = 64 * 1024;
    return measure("hit", "65536", [](long pairs) {
      for (long i = 0; i < pairs; ++i) {
        void* p = nullptr;
        CHECK(cudaMalloc(&p, kSize));
        CHECK(cudaFree(p));
      }
    });
  }

  Result mixed() {
    // 64 sizes, log-uniform over [512 B, 16 MiB], rounded to 16 bytes; a ring of 16 live ones.
    std::vector<std::size_t> sizes;
    std::uint64_t x = 0x2545f4914f6cdd1dULL;
    for (int i = 0; i < 64; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      double u = static_cast<double>(x >> 11) * 0x1.0p-53;
      double s = std::exp(std::log(512.0) + u * (std::log(16.0 * 1024 * 1024) - std::log(512.0)));
      sizes.push_back((static_cast<std::size_t>(s) + 15) & ~std::size_t{15});
    }
    std::vector<void*> ring(16, nullptr);
    std::size_t next = 0;
    Result r = measure("mixed", "512B..16MiB, 16 live", [&](long pairs) {
      for (long i = 0; i < pairs; ++i) {
        std::size_t at = next % ring.size();
        if (ring[at] != nullptr) CHECK(cudaFree(ring[at]));
        CHECK(cudaMalloc(&ring[at], sizes[next % sizes.size()]));
        ++next;
      }
    });
    for (void*& p : ring) {
      if (p != nullptr) CHECK(cudaFree(p));
      p = nullptr;
    }
    return r;
  }

 private:
  template <typename Loop>
  Result measure(const char* name, const char* sizes, Loop loop) {
    Result r;
    r.name = name;
    r.sizes = sizes;
    unsigned long long m0 = counter_ ? counter_("cudaMalloc") : 0;
    unsigned long long f0 = counter_ ? counter_("cudaFree") : 0;
    loop(opt_.pairs);  // warm-up
    std::vector<double> per_pair;
    for (long round = 0; round < opt_.rounds; ++round) {
      auto start = std::chrono::steady_clock::now();
      loop(opt_.pairs);
      auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start);
      per_pair.push_back(ns.count() / static_cast<double>(opt_.pairs));
    }
    std::sort(per_pair.begin(), per_pair.end());
    r.median_ns = per_pair[per_pair.size() / 2];
    r.min_ns = per_pair.front();
    r.p90_ns = per_pair[std::min(per_pair.size() - 1, per_pair.size() * 9 / 10)];
    if (counter_) {
      r.real_mallocs = static_cast<long long>(counter_("cudaMalloc") - m0);
      r.real_frees = static_cast<long long>(counter_("cudaFree") - f0);
    }
    return r;
  }

  Options opt_;
  CounterFn counter_;
};

void print_count(const char* key, long long value, bool last) {
  if (value < 0) {
    std::printf("      \"%s\": null%s\n", key, last ? "" : ",");
  } else {
    std::printf("      \"%s\": %lld%s\n", key, value, last ? "" : ",");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse_options(argc, argv);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // context creation stays out of the figures

  Bench bench(opt);
  std::vector<Result> results;
  if (opt.variant == "hit" || opt.variant == "all") results.push_back(bench.hit());
  if (opt.variant == "mixed" || opt.variant == "all") results.push_back(bench.mixed());

  long long total = static_cast<long long>(opt.pairs) * (opt.rounds + 1);
  std::printf("{\n  \"label\": \"%s\",\n  \"pairs_per_round\": %ld,\n  \"rounds\": %ld,\n",
              opt.label.c_str(), opt.pairs, opt.rounds);
  std::printf("  \"variants\": [\n");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("    {\n      \"name\": \"%s\",\n      \"sizes\": \"%s\",\n", r.name.c_str(),
                r.sizes.c_str());
    std::printf("      \"pairs\": %lld,\n", total);
    std::printf("      \"median_ns_per_pair\": %.1f,\n", r.median_ns);
    std::printf("      \"min_ns_per_pair\": %.1f,\n", r.min_ns);
    std::printf("      \"p90_ns_per_pair\": %.1f,\n", r.p90_ns);
    print_count("real_cuda_malloc_calls", r.real_mallocs, false);
    print_count("real_cuda_free_calls", r.real_frees, true);
    std::printf("    }%s\n", i + 1 < results.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
  return 0;
}
