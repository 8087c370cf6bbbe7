// poolcuda_workload: a program that allocates and frees device memory the way a training
// framework does when its own caching allocator is off — every activation, workspace and
// gradient of every step is a cudaMalloc and a cudaFree. It is the subject of scripts/demo and
// scripts/gpu-check, and of a short test in the `preload` suite.
//
// It is plain CUDA runtime code and knows nothing about poolcuda: the same binary runs on a
// GPU, on the CUDA stand-in (LD_LIBRARY_PATH=build/tests/simcuda) and under
// LD_PRELOAD=libpoolcuda.so. The only optional link to its surroundings is the stand-in's
// call counter, looked up with dlsym so that its absence (a real GPU) is harmless.
//
// Every buffer gets data written on its stream (cudaMemsetAsync over its head, a pattern
// copied in with cudaMemcpyAsync) and a window copied back into pinned host memory, which is
// checked after the step's streams are synchronized. Frees happen while that work may still
// be queued, on the legacy default stream and on a second, non-blocking stream: an allocator
// that hands freed memory out before the device is done with it corrupts what is checked
// (see Note [Free fences] in DESIGN.md). The checksum covers only the data read back, so it is
// the same with and without the pool for the same --seed and --steps. On the stand-in, its race
// detector is consulted too: any unordered overlapping access there fails the run.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

void die_on_error(cudaError_t err, const char* what, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "poolcuda_workload: %s failed at line %d: %s (%s)\n", what, line,
               cudaGetErrorName(err), cudaGetErrorString(err));
  std::exit(2);
}
#define CHECK(call) die_on_error((call), #call, __LINE__)

// splitmix64: small, fast, and the same sequence on every platform.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// Sizes as a model's tensors have them: mostly small (biases, norms, attention scratch), some
// medium, a few large (embeddings, logits). Log-uniform within each class.
std::size_t draw_size(Rng& rng) {
  double r = rng.unit();
  double lo, hi;
  if (r < 0.55) {
    lo = 4.0 * KiB, hi = 256.0 * KiB;
  } else if (r < 0.85) {
    lo = 256.0 * KiB, hi = 4.0 * MiB;
  } else {
    lo = 4.0 * MiB, hi = 40.0 * MiB;
  }
  double size = std::exp(std::log(lo) + rng.unit() * (std::log(hi) - std::log(lo)));
  return static_cast<std::size_t>(size);
}

struct Options {
  long steps = -1;        // -1: not given
  double seconds = -1.0;  // -1: not given
  std::uint64_t seed = 1;
  int layers = 24;
  std::size_t write_bytes = 1 * MiB;  // bytes of each buffer the memset covers
};

[[noreturn]] void usage(const char* message) {
  if (message) std::fprintf(stderr, "poolcuda_workload: %s\n", message);
  std::fprintf(stderr,
               "usage: poolcuda_workload [--steps N] [--seconds S] [--seed N] [--layers N]\n"
               "                         [--write-bytes N]\n"
               "  --steps N        run N training steps (default 20 when --seconds is not given)\n"
               "  --seconds S      run steps until S seconds have passed (with --steps: whichever\n"
               "                   ends first)\n"
               "  --seed N         seed of the size mix (default 1)\n"
               "  --layers N       layers per step, 5 allocations each (default 24, 1..1000)\n"
               "  --write-bytes N  bytes of each buffer written by cudaMemsetAsync (default\n"
               "                   1048576, at least 4096)\n");
  std::exit(message ? 64 : 0);
}

// Strict number parsing: the whole text must be a number in range.
bool parse_long(const char* text, long lo, long hi, long& out) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return false;
  out = v;
  return true;
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (arg != "--steps" && arg != "--seconds" && arg != "--seed" && arg != "--layers" &&
        arg != "--write-bytes")
      usage(("unknown option " + std::string(arg)).c_str());
    if (i + 1 >= argc) usage(("missing value after " + std::string(arg)).c_str());
    const char* value = argv[++i];
    long v = 0;
    if (arg == "--steps") {
      if (!parse_long(value, 1, 100000000L, v)) usage("--steps wants an integer >= 1");
      opt.steps = v;
    } else if (arg == "--seconds") {
      char* end = nullptr;
      double s = std::strtod(value, &end);
      if (end == value || *end != '\0' || !(s > 0.0) || s > 86400.0)
        usage("--seconds wants a number of seconds > 0");
      opt.seconds = s;
    } else if (arg == "--seed") {
      if (!parse_long(value, 0, 0x7fffffffffffffffL, v)) usage("--seed wants an integer >= 0");
      opt.seed = static_cast<std::uint64_t>(v);
    } else if (arg == "--layers") {
      if (!parse_long(value, 1, 1000, v)) usage("--layers wants an integer in 1..1000");
      opt.layers = static_cast<int>(v);
    } else {  // --write-bytes
      if (!parse_long(value, 4096, 1L << 40, v)) usage("--write-bytes wants an integer >= 4096");
      opt.write_bytes = static_cast<std::size_t>(v);
    }
  }
  if (opt.steps < 0 && opt.seconds < 0) opt.steps = 20;
  return opt;
}

// The stand-in's counter of calls that reached it; absent on a real GPU.
using CounterFn = std::uint64_t (*)(const char*);  // as declared in tests/simcuda/simcuda.h

CounterFn find_counter() {
  return reinterpret_cast<CounterFn>(dlsym(RTLD_DEFAULT, "simcuda_counter"));
}

// One window read back from a buffer: the slot in pinned staging memory it lands in, and what
// it must contain.
constexpr std::size_t kPattern = 256;  // pattern bytes copied into the buffer
constexpr std::size_t kMargin = 64;    // memset bytes read back on either side of the pattern
constexpr std::size_t kSlot = kPattern + 2 * kMargin;

struct Check {
  std::size_t slot;
  unsigned char fill;
  std::size_t pattern_at;  // where the pattern starts inside the slot
  std::size_t length;      // bytes of the slot that were read back
};

class Workload {
 public:
  explicit Workload(const Options& opt) : opt_(opt) {
    Rng rng{opt.seed};
    for (int l = 0; l < opt.layers; ++l) {
      activation_sizes_.push_back(draw_size(rng));
      activation_sizes_.push_back(draw_size(rng));
      workspace_sizes_.push_back(draw_size(rng));
    }
    slots_ = static_cast<std::size_t>(opt.layers) * 5;
    CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    staging_ = static_cast<unsigned char*>(host_alloc(slots_ * kSlot));
    patterns_ = static_cast<unsigned char*>(host_alloc(slots_ * kPattern));
  }

  ~Workload() {
    cudaFreeHost(staging_);
    cudaFreeHost(patterns_);
    cudaStreamDestroy(side_);
  }

  // One training step: forward allocates activations (and a workspace freed at once), backward
  // frees them in a different order, each after a gradient of its size came and went.
  void step(long index) {
    static constexpr double kSeqScale[] = {1.0, 0.875, 0.75, 0.625};
    double scale = kSeqScale[static_cast<std::uint64_t>(index) % 4];
    checks_.clear();
    struct Live {
      void* ptr;
      std::size_t size;
      cudaStream_t stream;
    };
    std::vector<Live> live;
    live.reserve(activation_sizes_.size());
    std::uint64_t tag = static_cast<std::uint64_t>(index) * 1000003ULL;

    for (int l = 0; l < opt_.layers; ++l) {
      for (int a = 0; a < 2; ++a) {
        std::size_t size = scaled(activation_sizes_[2 * l + a], scale);
        cudaStream_t stream = (l + a) % 3 == 2 ? side_ : nullptr;
        void* p = allocate(size);
        fill_and_read_back(p, size, stream, ++tag);
        live.push_back({p, size, stream});
      }
      std::size_t ws = scaled(workspace_sizes_[l], scale);
      void* w = allocate(ws);
      cudaStream_t ws_stream = l % 2 ? side_ : nullptr;
      fill_and_read_back(w, ws, ws_stream, ++tag);
      release(w);
    }

    // Backward: reverse order, with neighbouring pairs swapped so frees never mirror
    // allocations exactly.
    std::reverse(live.begin(), live.end());
    for (std::size_t i = 0; i + 1 < live.size(); i += 2) {
      if ((static_cast<std::uint64_t>(index) + i) % 3 != 0) std::swap(live[i], live[i + 1]);
    }
    for (const Live& act : live) {
      void* g = allocate(act.size);
      fill_and_read_back(g, act.size, act.stream, ++tag);
      release(g);
      release(act.ptr);
    }

    CHECK(cudaStreamSynchronize(nullptr));
    CHECK(cudaStreamSynchronize(side_));
    verify(index);
  }

  std::uint64_t mallocs() const { return mallocs_; }
  std::uint64_t frees() const { return frees_; }
  std::uint64_t checksum() const { return checksum_; }
  std::uint64_t verified() const { return verified_; }
  std::uint64_t failures() const { return failures_; }

 private:
  // Pinned, so that the copies are truly asynchronous on a GPU.
  static void* host_alloc(std::size_t bytes) {
    void* p = nullptr;
    CHECK(cudaMallocHost(&p, bytes));
    return p;
  }

  static std::size_t scaled(std::size_t size, double scale) {
    auto s = static_cast<std::size_t>(static_cast<double>(size) * scale);
    return std::max<std::size_t>(4 * KiB, (s + 15) & ~std::size_t{15});
  }

  void* allocate(std::size_t size) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, size));
    ++mallocs_;
    if (p == nullptr) {
      std::fprintf(stderr, "poolcuda_workload: cudaMalloc(%zu) returned NULL\n", size);
      std::exit(2);
    }
    return p;
  }

  void release(void* p) {
    CHECK(cudaFree(p));
    ++frees_;
  }

  // Writes the buffer's head with a fill byte and a pattern inside it, then queues a copy of
  // the window around the pattern into this buffer's staging slot. All on `stream`, in order.
  void fill_and_read_back(void* p, std::size_t size, cudaStream_t stream, std::uint64_t tag) {
    std::size_t slot = checks_.size();
    if (slot >= slots_) {
      std::fprintf(stderr, "poolcuda_workload: internal error: out of staging slots\n");
      std::exit(2);
    }
    Rng rng{tag ^ (opt_.seed << 32)};
    auto fill = static_cast<unsigned char>(rng.next() | 1);
    std::size_t written = std::min(size, opt_.write_bytes);
    // Pattern position: anywhere inside the written head, 4-byte aligned, leaving margins.
    std::size_t span = written - kSlot;
    std::size_t window = (rng.next() % (span + 1)) & ~std::size_t{3};
    unsigned char* pattern = patterns_ + slot * kPattern;
    for (std::size_t i = 0; i < kPattern; i += 8) {
      std::uint64_t word = rng.next();
      std::memcpy(pattern + i, &word, 8);
    }
    auto* dev = static_cast<unsigned char*>(p);
    CHECK(cudaMemsetAsync(dev, fill, written, stream));
    CHECK(cudaMemcpyAsync(dev + window + kMargin, pattern, kPattern, cudaMemcpyHostToDevice,
                          stream));
    CHECK(cudaMemcpyAsync(staging_ + slot * kSlot, dev + window, kSlot, cudaMemcpyDeviceToHost,
                          stream));
    checks_.push_back({slot, fill, kMargin, kSlot});
  }

  void verify(long index) {
    for (const Check& c : checks_) {
      const unsigned char* got = staging_ + c.slot * kSlot;
      const unsigned char* pattern = patterns_ + c.slot * kPattern;
      bool ok = true;
      for (std::size_t i = 0; i < c.length && ok; ++i) {
        bool in_pattern = i >= c.pattern_at && i < c.pattern_at + kPattern;
        unsigned char want = in_pattern ? pattern[i - c.pattern_at] : c.fill;
        ok = got[i] == want;
      }
      if (!ok && failures_ < 10) {
        std::fprintf(stderr, "poolcuda_workload: step %ld buffer %zu: data read back is wrong\n",
                     index, c.slot);
      }
      failures_ += ok ? 0 : 1;
      verified_ += 1;
      for (std::size_t i = 0; i < c.length; ++i) {
        checksum_ = (checksum_ ^ got[i]) * 0x100000001b3ULL;  // FNV-1a
      }
    }
  }

  Options opt_;
  std::vector<std::size_t> activation_sizes_;
  std::vector<std::size_t> workspace_sizes_;
  std::size_t slots_ = 0;
  cudaStream_t side_ = nullptr;
  unsigned char* staging_ = nullptr;
  unsigned char* patterns_ = nullptr;
  std::vector<Check> checks_;
  std::uint64_t mallocs_ = 0;
  std::uint64_t frees_ = 0;
  std::uint64_t checksum_ = 0xcbf29ce484222325ULL;
  std::uint64_t verified_ = 0;
  std::uint64_t failures_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse_options(argc, argv);
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices < 1) {
    std::fprintf(stderr, "poolcuda_workload: no CUDA device\n");
    return 2;
  }
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // create the context outside the timed loop

  CounterFn counter = find_counter();
  std::uint64_t driver_mallocs0 = counter ? counter("cudaMalloc") : 0;
  std::uint64_t driver_frees0 = counter ? counter("cudaFree") : 0;
  std::uint64_t races = 0;

  long steps = 0;
  double elapsed = 0.0;
  std::uint64_t mallocs = 0, frees = 0, checksum = 0, verified = 0, failures = 0;
  {
    Workload work(opt);
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      work.step(steps);
      ++steps;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (opt.steps > 0 && steps >= opt.steps) break;
      if (opt.seconds > 0 && elapsed >= opt.seconds) break;
    }
    mallocs = work.mallocs();
    frees = work.frees();
    checksum = work.checksum();
    verified = work.verified();
    failures = work.failures();
  }
  cudaError_t sticky = cudaGetLastError();

  std::printf("steps: %ld\n", steps);
  std::printf("seconds: %.3f\n", elapsed);
  std::printf("steps_per_second: %.2f\n", elapsed > 0 ? static_cast<double>(steps) / elapsed : 0);
  std::printf("cuda_malloc_calls: %llu\n", static_cast<unsigned long long>(mallocs));
  std::printf("cuda_free_calls: %llu\n", static_cast<unsigned long long>(frees));
  if (counter) {
    // Counted by the stand-in below any interposer: the calls that really reached "CUDA".
    std::printf("real_cuda_malloc_calls: %llu\n",
                static_cast<unsigned long long>(counter("cudaMalloc") - driver_mallocs0));
    std::printf("real_cuda_free_calls: %llu\n",
                static_cast<unsigned long long>(counter("cudaFree") - driver_frees0));
    // The stand-in's race detector: unordered device accesses to overlapping bytes.
    races = counter("races");
    std::printf("stand_in_races: %llu\n", static_cast<unsigned long long>(races));
  }
  std::printf("verified_buffers: %llu\n", static_cast<unsigned long long>(verified));
  std::printf("checksum: %016llx\n", static_cast<unsigned long long>(checksum));
  if (failures > 0 || races > 0 || sticky != cudaSuccess) {
    std::printf("result: FAILED (%llu buffers with wrong data, %llu races%s%s)\n",
                static_cast<unsigned long long>(failures), static_cast<unsigned long long>(races),
                sticky != cudaSuccess ? ", sticky error " : "",
                sticky != cudaSuccess ? cudaGetErrorName(sticky) : "");
    return 1;
  }
  std::printf("result: OK\n");
  return 0;
}
