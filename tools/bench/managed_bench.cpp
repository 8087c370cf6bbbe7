// poolcuda_managed_bench: the cost of one cudaMallocManaged + cudaFree pair as a program sees
// it, with one thread and with two, and what making recycled managed memory read as zero costs
// per MiB, by a host memset and by a device memset (cudaMemsetAsync on a private non-blocking
// stream, then a synchronize of that stream: what a library would do per allocation).
// scripts/bench runs it on the CUDA stand-in directly and under LD_PRELOAD=libpoolcuda.so;
// scripts/gpu-check runs it on a GPU. One JSON object on stdout.
//
// Plain CUDA runtime code, linked to libcudart.so.13 by SONAME, knowing nothing of poolcuda.
// The stand-in's call counter (found with dlsym; absent on a GPU) tells how many calls reached
// the real cudaMallocManaged.
//
// Pairs: one warm-up round (long enough, through a pool, to recycle its memory a few times and
// reach the steady state), then `rounds` timed rounds of `pairs` pairs per thread; figures are
// the median and fastest round, in ns per pair (the round's wall time over all pairs of all
// threads), the pairs per second of the median round, and the CPU time per pair (all threads'
// CPU time over all their pairs: on a machine busy with other work, two threads that do not
// get in each other's way show the same CPU time per pair as one). Zeroing: a buffer of `zero_mib` MiB
// (larger than a default slab, so it is the runtime's own), last written by the host or by the
// device, zeroed in 1 MiB pieces each way; ns per MiB, median of five passes.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_args.h"

namespace {

#define CHECK(call) bench::die_on_error("poolcuda_managed_bench", (call), #call, __LINE__)
using bench::parse_long;

using Clock = std::chrono::steady_clock;
using CounterFn = unsigned long long (*)(const char*);

struct Options {
  long pairs = 20000;
  long warmup = 0;  // 0: `pairs`
  long rounds = 21;
  long size = 1024;
  long zero_mib = 80;
  std::string label;
};

[[noreturn]] void usage(const char* message) {
  if (message) std::fprintf(stderr, "poolcuda_managed_bench: %s\n", message);
  std::fprintf(stderr,
               "usage: poolcuda_managed_bench [--pairs N] [--warmup N] [--rounds N]\n"
               "                              [--size BYTES] [--zero-mib N] [--label TEXT]\n"
               "  --pairs N     pairs per thread per timed round (default 20000, 1..10000000)\n"
               "  --warmup N    pairs per thread in the warm-up round (default: --pairs)\n"
               "  --rounds N    timed rounds (default 21, 1..10000)\n"
               "  --size B      bytes per allocation (default 1024, 1..1073741824)\n"
               "  --zero-mib N  MiB zeroed per zeroing pass (default 80; 0 skips, max 4096)\n"
               "  --label T     copied into the JSON output as \"label\"\n");
  std::exit(message ? 64 : 0);
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (i + 1 >= argc) usage(("missing value after " + std::string(arg)).c_str());
    const char* value = argv[++i];
    bool ok = true;
    if (arg == "--pairs") ok = parse_long(value, 1, 10000000L, opt.pairs);
    else if (arg == "--warmup") ok = parse_long(value, 1, 100000000L, opt.warmup);
    else if (arg == "--rounds") ok = parse_long(value, 1, 10000L, opt.rounds);
    else if (arg == "--size") ok = parse_long(value, 1, 1L << 30, opt.size);
    else if (arg == "--zero-mib") ok = parse_long(value, 0, 4096, opt.zero_mib);
    else if (arg == "--label") {
      opt.label = value;
      if (!bench::json_safe_label(opt.label))
        usage("--label must not contain quotes, backslashes or control characters");
    } else {
      usage(("unknown option " + std::string(arg)).c_str());
    }
    if (!ok) usage(("bad value for " + std::string(arg)).c_str());
  }
  return opt;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// A reusable barrier for `count` threads (a mutex and a generation number; nothing clever).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
      return;
    }
    done_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  const int count_;
  int arrived_ = 0;
  unsigned long generation_ = 0;
};

// CPU time of the calling thread: unlike wall time, it does not count time spent waiting for a
// core on a busy machine, but it does count cache lines bouncing between threads.
double thread_cpu_ns() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

struct PairResult {
  int threads = 0;
  double median_ns = 0, min_ns = 0, pairs_per_second = 0;
  double cpu_ns = 0;  // median round's CPU time per pair, summed over the threads
  long long real_calls = -1;  // -1: no counter (not on the stand-in)
};

// `threads` threads each run `pairs` pairs per round; a barrier starts every round. A round
// lasts from its first thread's start to its last thread's end, as each thread clocks itself
// (a waiting thread's wake-up delay never enters the figure).
PairResult measure_pairs(const Options& opt, int threads, CounterFn counter) {
  int device = 0;
  CHECK(cudaGetDevice(&device));
  const unsigned long long before = counter ? counter("cudaMallocManaged") : 0;
  const std::size_t rounds = static_cast<std::size_t>(opt.rounds) + 1;  // round 0 warms up
  std::vector<std::vector<Clock::time_point>> starts(threads), ends(threads);
  std::vector<std::vector<double>> cpu(threads);
  Barrier sync(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      CHECK(cudaSetDevice(device));
      for (std::size_t round = 0; round < rounds; ++round) {
        sync.arrive_and_wait();
        const double cpu_start = thread_cpu_ns();
        starts[t].push_back(Clock::now());
        const long pairs = round == 0 && opt.warmup != 0 ? opt.warmup : opt.pairs;
        for (long i = 0; i < pairs; ++i) {
          void* p = nullptr;
          CHECK(cudaMallocManaged(&p, static_cast<std::size_t>(opt.size), cudaMemAttachGlobal));
          CHECK(cudaFree(p));
        }
        ends[t].push_back(Clock::now());
        cpu[t].push_back(thread_cpu_ns() - cpu_start);
      }
    });
  }
  for (auto& worker : workers) worker.join();
  std::vector<double> per_pair, cpu_per_pair;
  for (std::size_t round = 1; round < rounds; ++round) {
    Clock::time_point first = starts[0][round], last = ends[0][round];
    double cpu_ns = cpu[0][round];
    for (int t = 1; t < threads; ++t) {
      first = std::min(first, starts[t][round]);
      last = std::max(last, ends[t][round]);
      cpu_ns += cpu[t][round];
    }
    cpu_per_pair.push_back(cpu_ns / static_cast<double>(opt.pairs * threads));
    const double ns = std::chrono::duration<double, std::nano>(last - first).count();
    per_pair.push_back(ns / static_cast<double>(opt.pairs * threads));
  }
  PairResult r;
  r.threads = threads;
  r.median_ns = median(per_pair);
  r.min_ns = *std::min_element(per_pair.begin(), per_pair.end());
  r.pairs_per_second = 1e9 / r.median_ns;
  r.cpu_ns = median(cpu_per_pair);
  if (counter) r.real_calls = static_cast<long long>(counter("cudaMallocManaged") - before);
  return r;
}

struct ZeroResult {
  double host_memset = 0, device_memset = 0;  // ns per MiB
};

// Zeroes `bytes` at `buffer` in 1 MiB pieces, `passes` times, after `dirty` wrote them.
template <typename Dirty, typename Zero>
double ns_per_mib(char* buffer, std::size_t bytes, Dirty dirty, Zero zero) {
  constexpr std::size_t kPiece = std::size_t{1} << 20;
  std::vector<double> passes;
  for (int pass = 0; pass < 5; ++pass) {
    dirty();
    const Clock::time_point start = Clock::now();
    for (std::size_t at = 0; at < bytes; at += kPiece) zero(buffer + at, kPiece);
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    passes.push_back(ns / static_cast<double>(bytes / kPiece));
  }
  return median(passes);
}

// Recycled memory last written by the host (`by_device` false) or by the device.
ZeroResult measure_zeroing(std::size_t mib, bool by_device) {
  const std::size_t bytes = mib << 20;
  char* buffer = nullptr;
  CHECK(cudaMallocManaged(reinterpret_cast<void**>(&buffer), bytes, cudaMemAttachGlobal));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto dirty = [&] {
    if (by_device) {
      CHECK(cudaMemset(buffer, 0xab, bytes));
    } else {
      std::memset(buffer, 0xab, bytes);
    }
    CHECK(cudaDeviceSynchronize());
  };
  ZeroResult r;
  r.host_memset = ns_per_mib(buffer, bytes, dirty, [](char* p, std::size_t n) {
    std::memset(p, 0, n);
  });
  r.device_memset = ns_per_mib(buffer, bytes, dirty, [&](char* p, std::size_t n) {
    CHECK(cudaMemsetAsync(p, 0, n, stream));
    CHECK(cudaStreamSynchronize(stream));
  });
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(buffer));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // context creation stays out of the figures
  const auto counter = reinterpret_cast<CounterFn>(dlsym(RTLD_DEFAULT, "simcuda_counter"));

  const PairResult results[] = {measure_pairs(opt, 1, counter), measure_pairs(opt, 2, counter)};
  std::printf("{\n  \"label\": \"%s\",\n  \"size\": %ld,\n  \"pairs_per_round\": %ld,\n"
              "  \"rounds\": %ld,\n  \"pairs\": [\n",
              opt.label.c_str(), opt.size, opt.pairs, opt.rounds);
  for (std::size_t i = 0; i < std::size(results); ++i) {
    const PairResult& r = results[i];
    std::printf("    {\"threads\": %d, \"median_ns_per_pair\": %.1f, \"min_ns_per_pair\": %.1f, "
                "\"pairs_per_second\": %.0f, \"cpu_ns_per_pair\": %.1f, "
                "\"real_cuda_malloc_managed_calls\": ",
                r.threads, r.median_ns, r.min_ns, r.pairs_per_second, r.cpu_ns);
    if (r.real_calls < 0) std::printf("null}");
    else std::printf("%lld}", r.real_calls);
    std::printf("%s\n", i + 1 < std::size(results) ? "," : "");
  }
  std::printf("  ]");
  if (opt.zero_mib > 0) {
    const std::size_t mib = static_cast<std::size_t>(opt.zero_mib);
    const ZeroResult host = measure_zeroing(mib, false);
    const ZeroResult device = measure_zeroing(mib, true);
    std::printf(",\n  \"zeroing_ns_per_mib\": {\n"
                "    \"after_host_writes\": {\"host_memset\": %.0f, \"device_memset\": %.0f},\n"
                "    \"after_device_writes\": {\"host_memset\": %.0f, \"device_memset\": %.0f}\n"
                "  }",
                host.host_memset, host.device_memset, device.host_memset, device.device_memset);
  }
  std::printf("\n}\n");
  return 0;
}
