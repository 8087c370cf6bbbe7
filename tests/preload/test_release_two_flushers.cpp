// Preload test: two allocations wait for the pages of a device whose release thread cannot be
// created (Note [Release worker]): thread creation fails (refuse_threads.h), and every driver
// free takes 300 ms (SIMCUDA_FREE_DELAY_US). The main thread grows past the held bound: eight
// idle 64 MiB pages go back, and its wait, 20 ms at most, frees them itself until its time is
// up, one free at least. Meanwhile another thread asks for 500 MiB, which fits only once enough
// of those pages have reached the driver: its out-of-memory recovery must free the pages the
// first wait left queued, not sleep its whole bound (10 s) beside them and fail. Run under
// free_fence:none, thread_cache:off and shards:1 on a 1 GiB device.

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "check.h"
#include "refuse_threads.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::atomic<bool> go{false};
  cudaError_t second_result = cudaErrorUnknown;
  double second_ms = -1;
  std::thread second([&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first free is under way
    void* p = nullptr;
    const double start = now_ms();
    second_result = cudaMalloc(&p, 500 * kMiB);
    second_ms = now_ms() - start;
    if (second_result == cudaSuccess) CHECK_CUDA(cudaFree(p));
  });

  preload_test::refuse_threads.store(true);  // every thread the test and CUDA need exists by now
  void* keep = nullptr;
  CHECK_CUDA(cudaMalloc(&keep, 64 * kMiB));
  std::vector<void*> pages(8);
  for (void*& p : pages) CHECK_CUDA(cudaMalloc(&p, 64 * kMiB));
  for (void* p : pages) CHECK_CUDA(cudaFree(p));  // 512 MiB idle
  go.store(true);
  void* grown = nullptr;
  CHECK_CUDA(cudaMalloc(&grown, 420 * kMiB));  // past the held bound
  second.join();
  preload_test::refuse_threads.store(false);

  CHECK_CUDA(second_result);
  CHECK_MSG(second_ms < 5000, "the second allocation waited " + std::to_string(second_ms) +
                                  " ms beside pages left queued");
  CHECK_CUDA(cudaFree(grown));
  CHECK_CUDA(cudaFree(keep));
  return 0;
}
