// Preload test: a device's pools are built at cudaFree(NULL) and announced at its first
// allocation (Note [Pools made ahead] in interpose/registry.cpp).
//   first_use  cudaFree(NULL) asks the device its size (the stand-in counts cudaMemGetInfo); the
//              first cudaMalloc then asks nothing more, and its memory is the program's to use.
//              A report taken between the two says no device has pools yet.
//   other      with two devices, a context made on device 0 with cudaFree(NULL) and allocations
//              only on device 1: the report lists device 1 alone, which reuses in stream order
//              (free_fence:auto: its one ordered queue), exactly as when device 0 was never
//              touched.
//   reset      cudaDeviceReset between cudaFree(NULL) and the first allocation: the pools built
//              before it serve the device afterwards (nothing asks the device its size again),
//              and the memory holds what is written.
//   threads    eight threads at once each make the context with cudaFree(NULL) and then
//              allocate, write, check and free: every buffer holds what its thread wrote, and
//              the report lists the one device (run under ThreadSanitizer in its suite).
// The program runs itself as a child with JSON reports into a folder of its own, and raises the
// report signal to read them.
#include <stdlib.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "signal_report.h"

namespace {

constexpr std::size_t kSize = 1 << 20;

std::string report_now() { return preload_test::signal_report("POOLS_AHEAD_REPORTS"); }

// The JSON report's "device" entries, as a list like "1," (in the order written).
std::string devices_of(const std::string& report) {
  std::string devices;
  const std::string key = "\"device\":";
  for (std::size_t at = report.find(key); at != std::string::npos;
       at = report.find(key, at + key.size())) {
    const std::size_t from = at + key.size();
    devices += report.substr(from, report.find_first_not_of("0123456789", from) - from) + ",";
  }
  return devices;
}

// Allocates, writes and reads back a buffer on the current device, and frees it.
void use_memory(unsigned char value) {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, kSize));
  CHECK_CUDA(cudaMemset(ptr, value, kSize));
  CHECK(preload_test::device_bytes_equal(ptr, kSize, value));
  CHECK_CUDA(cudaFree(ptr));
}

// The stand-in's count of cudaMemGetInfo calls (the library asks it when it builds a device's
// pools); 0 on a GPU, where the counts are not checked.
std::uint64_t size_queries() {
  return preload_test::on_stand_in() ? preload_test::counter("cudaMemGetInfo") : 0;
}

void first_use_case() {
  const bool counted = preload_test::on_stand_in();
  const std::uint64_t before = size_queries();
  CHECK_CUDA(cudaFree(nullptr));
  const std::uint64_t prepared = size_queries();
  CHECK_MSG(!counted || prepared > before, "cudaFree(NULL) did not build the device's pools");
  const std::string before_use = report_now();
  CHECK_MSG(before_use.find("\"device\":") == std::string::npos,
            "a device has pools before its first allocation: " + before_use);
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, kSize));
  CHECK_MSG(size_queries() == prepared, "the first cudaMalloc built the pools again");
  CHECK_CUDA(cudaMemset(ptr, 0x5a, kSize));
  CHECK(preload_test::device_bytes_equal(ptr, kSize, 0x5a));
  CHECK_CUDA(cudaFree(ptr));
  CHECK_MSG(devices_of(report_now()) == "0,", "the report should list device 0");
}

void other_device_case() {
  preload_test::require_devices(2);
  CHECK_CUDA(cudaFree(nullptr));  // device 0's context (and its pools, kept aside)
  CHECK_CUDA(cudaSetDevice(1));
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, kSize));
  CHECK_CUDA(cudaFree(first));
  void* again = nullptr;
  CHECK_CUDA(cudaMalloc(&again, kSize));
  CHECK_MSG(again == first, "device 1 alone in use: a freed slice is reused at once");
  CHECK_CUDA(cudaFree(again));
  const std::string report = report_now();
  CHECK_MSG(devices_of(report) == "1,", "the report lists devices " + devices_of(report));
  CHECK_MSG(report.find("\"reuse\":\"ordered\"") != std::string::npos,
            "device 1 should reuse in stream order: " + report);
}

void reset_case() {
  CHECK_CUDA(cudaFree(nullptr));
  const std::uint64_t prepared = size_queries();
  CHECK_CUDA(cudaDeviceReset());
  use_memory(0x3c);
  CHECK_MSG(size_queries() == prepared, "the pools built before the reset were built again");
  CHECK_MSG(devices_of(report_now()) == "0,", "the report should list device 0");
}

void threads_case() {
  constexpr int kThreads = 8;
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ready, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      CHECK_CUDA(cudaFree(nullptr));
      for (int i = 0; i < 50; ++i) use_memory(static_cast<unsigned char>(0x10 + t));
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK_MSG(devices_of(report_now()) == "0,", "the report should list device 0");
}

int run_child(const std::string& which) {
  char dir[] = "/tmp/poolcuda-pools-ahead-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string conf = "report_format:json,report_path:" + std::string(dir) + "/r-%n.json";
  const preload_test::ChildResult child = preload_test::run_self(
      ("child:" + which).c_str(),
      {"POOLCUDA_CONF=" + conf, "POOLS_AHEAD_REPORTS=" + std::string(dir)}, 60);
  std::printf("%s", child.output.c_str());
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
  return child.timed_out ? 1 : child.status;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK(argc == 2);
  std::string which = argv[1];
  if (which.rfind("child:", 0) != 0) return run_child(which);
  which = which.substr(6);
  if (which == "first_use") first_use_case();
  else if (which == "other") other_device_case();
  else if (which == "reset") reset_case();
  else if (which == "threads") threads_case();
  else preload_test::fail(__FILE__, __LINE__, "unknown case " + which);
  CHECK_CUDA(cudaGetLastError());
  std::printf("%s: ok\n", which.c_str());
  return 0;
}
