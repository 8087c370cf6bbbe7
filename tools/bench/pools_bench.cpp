// pools_bench: the cost of the hit path. Measures the median nanoseconds per allocate+free pair
// through a MemoryManager (default subslices layout) on a HostDevice, single thread, with
// free_fence none and events, while 0, 1k, 10k, 100k and 1M other slices are held live.
// Prints one JSON object. Not a test: run it from a release build.
//
//   pools_bench [--pairs N] [--size BYTES]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pools/host_device.h"
#include "pools/memory_manager.h"

namespace {

using namespace poolcuda;
using Clock = std::chrono::steady_clock;

struct Result {
  const char* fence;
  std::uint64_t live;
  double median_ns;
  double p90_ns;
};

Result measure(FreeFence fence, const char* fence_name, std::uint64_t live, std::uint64_t pairs,
               std::uint64_t size) {
  HostDevice device(256 * GiB, 512);  // host pages are reserved, never touched
  ManagerOptions options;
  options.free_fence = fence;
  MemoryManager manager(device, options);

  // The held slices: mixed small sizes, as a framework's live tensors would be.
  std::vector<DevicePtr> held;
  held.reserve(live);
  const std::uint64_t shapes[] = {256, 512, 1024, 4096, 768, 2048};
  for (std::uint64_t i = 0; i < live; ++i) {
    const Reservation r = manager.allocate(shapes[i % std::size(shapes)]);
    if (r.ptr == 0) {
      std::fprintf(stderr, "pools_bench: could not hold %llu slices: %s\n",
                   static_cast<unsigned long long>(live), describe(r.error).c_str());
      std::exit(1);
    }
    held.push_back(r.ptr);
  }

  // Warm up: the page the pairs use exists and the fence batch has cycled.
  for (int i = 0; i < 2000; ++i) manager.free(manager.allocate(size).ptr);

  constexpr std::uint64_t kBatch = 1000;
  std::vector<double> per_pair;
  for (std::uint64_t done = 0; done < pairs; done += kBatch) {
    const auto start = Clock::now();
    for (std::uint64_t i = 0; i < kBatch; ++i) {
      const DevicePtr p = manager.allocate(size).ptr;
      manager.free(p);
    }
    const auto ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    per_pair.push_back(ns / kBatch);
  }
  std::sort(per_pair.begin(), per_pair.end());
  const Result result{fence_name, live, per_pair[per_pair.size() / 2],
                      per_pair[per_pair.size() * 9 / 10]};
  for (DevicePtr p : held) manager.free(p);
  manager.drain_fences();
  manager.cleanup(true);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t pairs = 200000;
  std::uint64_t size = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--pairs") == 0) pairs = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--size") == 0) size = std::strtoull(argv[i + 1], nullptr, 10);
  }
  pairs = std::max<std::uint64_t>(pairs, 1000);
  std::vector<Result> results;
  for (auto [fence, name] : {std::pair{FreeFence::none, "none"}, {FreeFence::events, "events"}})
    for (std::uint64_t live : {0ull, 1000ull, 10000ull, 100000ull, 1000000ull})
      results.push_back(measure(fence, name, live, pairs, size));

  std::string out = "{\"benchmark\":\"pools_bench\",\"unit\":\"ns per allocate+free pair\",";
  out += "\"size\":" + std::to_string(size) + ",\"pairs\":" + std::to_string(pairs) + ",";
  out += "\"targets\":{\"hit_path_ns\":100,\"ratio_1M_over_1k\":1.5},\"results\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    char row[200];
    std::snprintf(row, sizeof row, "%s{\"free_fence\":\"%s\",\"live\":%llu,\"median_ns\":%.1f,"
                  "\"p90_ns\":%.1f}", i ? "," : "", results[i].fence,
                  static_cast<unsigned long long>(results[i].live), results[i].median_ns,
                  results[i].p90_ns);
    out += row;
  }
  out += "],\"ratio_1M_over_1k\":{";
  for (std::size_t base = 0; base < results.size(); base += 5) {
    char row[80];
    std::snprintf(row, sizeof row, "%s\"%s\":%.2f", base ? "," : "", results[base].fence,
                  results[base + 4].median_ns / results[base + 1].median_ns);
    out += row;
  }
  out += "}}\n";
  std::fputs(out.c_str(), stdout);
  return 0;
}
