// poolcuda_capture_bench: the cost of CUDA graph capture as a program sees it. Each round
// captures a graph that allocates `--allocations` temporaries (sizes cycling from 4 KiB to
// 1 MiB), writes each with a captured memset and frees it inside the capture, instantiates it,
// replays it `--replays` times and destroys it. scripts/bench runs it on the CUDA stand-in with
// and without LD_PRELOAD=libpoolcuda.so. Without the library the allocations inside the capture
// go to the driver in relaxed capture mode and the frees are deferred until the capture ends
// (the real cudaFree would invalidate the capture), as a program that cannot rely on the
// library has to do.
//
// Figures (one JSON object on stdout): median and fastest milliseconds per round, and from the
// stand-in's counters the driver allocations made inside each capture window (target under the
// library: 0 from the second capture on).
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void die_on_error(cudaError_t err, const char* what, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "poolcuda_capture_bench: %s failed at line %d: %s\n", what, line,
               cudaGetErrorName(err));
  std::exit(2);
}
#define CHECK(call) die_on_error((call), #call, __LINE__)

using CounterFn = unsigned long long (*)(const char*);

struct Options {
  long rounds = 10;
  long allocations = 200;
  long replays = 1000;
  std::string label;
};

[[noreturn]] void usage(const char* message) {
  if (message) std::fprintf(stderr, "poolcuda_capture_bench: %s\n", message);
  std::fprintf(stderr,
               "usage: poolcuda_capture_bench [--rounds N] [--allocations N] [--replays N] "
               "[--label TEXT]\n");
  std::exit(message ? 64 : 0);
}

long parse_count(const char* text, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 1 || v > hi) usage("counts are positive and bounded");
  return v;
}

// The library (if preloaded) makes cudaFree inside a capture legal; without it the frees wait
// for the end of the capture.
bool library_loaded() {
  Dl_info info{};
  void* address = dlsym(RTLD_DEFAULT, "cudaMalloc");
  return address != nullptr && dladdr(address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "poolcuda") != nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (i + 1 >= argc) usage("missing value");
    const char* value = argv[++i];
    if (arg == "--rounds") opt.rounds = parse_count(value, 10000);
    else if (arg == "--allocations") opt.allocations = parse_count(value, 100000);
    else if (arg == "--replays") opt.replays = parse_count(value, 1000000);
    else if (arg == "--label") opt.label = value;
    else usage("unknown option");
  }
  const auto counter = reinterpret_cast<CounterFn>(dlsym(RTLD_DEFAULT, "simcuda_counter"));
  const bool pooled = library_loaded();
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::vector<double> round_ms;
  std::vector<long long> window_mallocs;
  for (long round = 0; round < opt.rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    const unsigned long long mallocs = counter ? counter("cudaMalloc") : 0;
    std::vector<void*> deferred;
    for (long i = 0; i < opt.allocations; ++i) {
      const std::size_t size = std::size_t{4096} << (i % 9);  // 4 KiB .. 1 MiB
      void* ptr = nullptr;
      CHECK(cudaMalloc(&ptr, size));
      CHECK(cudaMemsetAsync(ptr, static_cast<int>(i), size, stream));
      if (pooled) {
        CHECK(cudaFree(ptr));
      } else {
        deferred.push_back(ptr);
      }
    }
    window_mallocs.push_back(counter ? static_cast<long long>(counter("cudaMalloc") - mallocs)
                                     : -1);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (long i = 0; i < opt.replays; ++i) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    for (void* ptr : deferred) CHECK(cudaFree(ptr));
    round_ms.push_back(std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - start)
                           .count());
  }
  CHECK(cudaStreamDestroy(stream));

  std::vector<double> sorted = round_ms;
  std::sort(sorted.begin(), sorted.end());
  long long later_max = 0;
  for (std::size_t i = 1; i < window_mallocs.size(); ++i)
    later_max = std::max(later_max, window_mallocs[i]);
  std::printf("{\n  \"label\": \"%s\",\n  \"library\": %s,\n", opt.label.c_str(),
              pooled ? "true" : "false");
  std::printf("  \"rounds\": %ld,\n  \"allocations_per_capture\": %ld,\n  \"replays\": %ld,\n",
              opt.rounds, opt.allocations, opt.replays);
  std::printf("  \"median_ms_per_round\": %.3f,\n  \"min_ms_per_round\": %.3f,\n",
              sorted[sorted.size() / 2], sorted.front());
  if (counter) {
    std::printf("  \"first_capture_driver_allocations\": %lld,\n", window_mallocs.front());
    std::printf("  \"later_captures_driver_allocations_max\": %lld\n}\n", later_max);
  } else {
    std::printf("  \"first_capture_driver_allocations\": null,\n");
    std::printf("  \"later_captures_driver_allocations_max\": null\n}\n");
  }
  return 0;
}
