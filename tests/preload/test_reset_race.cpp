// Preload test: cudaDeviceReset on one thread while others allocate and free on the device.
// CUDA leaves the race undefined, but plain programs survive it, and so must the pools: they
// stay consistent whatever the order, and once the resets are over every allocation is real
// device memory of its own (no page the reset freed is ever handed out again). The allocating
// threads never touch memory during the race (a kernel on memory a reset freed is a fault on a
// real GPU too). Stand-in only: a real runtime may not survive the race itself.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("the race is undefined on a real runtime");
  CHECK_CUDA(cudaFree(nullptr));

  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&stop, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<void*> live;
      while (!stop.load()) {
        if (live.size() < 32 && random() % 3 != 0) {
          void* ptr = nullptr;
          const std::size_t size = std::size_t{1} << (10 + random() % 14);  // 1 KiB - 8 MiB
          if (cudaMalloc(&ptr, size) == cudaSuccess) live.push_back(ptr);
        } else if (!live.empty()) {
          const std::size_t i = random() % live.size();
          cudaFree(live[i]);  // may answer an error: a reset freed it
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      for (void* ptr : live) cudaFree(ptr);
      cudaGetLastError();
    });
  }
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    cudaDeviceReset();
  }
  stop.store(true);
  for (std::thread& thread : threads) thread.join();
  cudaGetLastError();

  // After the resets (the pools keep whatever the race left them): every allocation is live
  // memory of its own, keeping its bytes.
  std::vector<void*> buffers;
  for (int i = 0; i < 400; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, std::size_t{1} << (10 + i % 13)));
    CHECK_MSG(cudaMemset(ptr, i, 1024) == cudaSuccess,
              "allocation " + std::to_string(i) + " is not live device memory");
    buffers.push_back(ptr);
  }
  for (int i = 0; i < 400; ++i)
    CHECK(preload_test::device_bytes_equal(buffers[i], 1024, static_cast<unsigned char>(i)));
  // No two of them share a byte.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (int i = 0; i < 400; ++i) {
    const auto begin = reinterpret_cast<std::uintptr_t>(buffers[i]);
    ranges.emplace_back(begin, begin + (std::size_t{1} << (10 + i % 13)));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    CHECK_MSG(ranges[i - 1].second <= ranges[i].first, "two allocations overlap");
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  std::printf("ok\n");
  return 0;
}
