// Preload test: threads allocate managed memory and free it, while the main thread
// resets the device every few milliseconds, so that some frees are of pointers from before a
// reset. Requests made while a reset freezes the chain pass through to the driver; their stale
// frees may still be on their way to the driver when the reset ends. A slab made then could sit
// at such a free's address, and the free freed it under the chain's allocations, whose next
// zeroing faulted (four runs of five). The chain makes no slab until those frees are over (Note
// [Foreign frees] in interpose/foreign_frees.cpp). Plain CUDA survives the race. Stand-in only.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("the race is undefined on a real runtime");
  CHECK_CUDA(cudaFree(nullptr));
  std::atomic<bool> stop{false};
  std::atomic<long> served{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const std::size_t size = static_cast<std::size_t>(t + 1) * 700000;
      while (!stop.load()) {
        void* ptr = nullptr;
        if (cudaMallocManaged(&ptr, size) != cudaSuccess) {
          (void)cudaGetLastError();
          continue;
        }
        // No write: a stale free of another thread may have freed it, in the plain run too.
        ++served;
        // A free of a pointer from before a reset is refused or frees what the driver put
        // there since, as in the plain run.
        if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
      }
    });
  }
  for (int round = 0; round < 100; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CHECK_CUDA(cudaDeviceReset());
  }
  stop.store(true);
  for (std::thread& thread : threads) thread.join();
  CHECK(served.load() > 0);
  // The chain serves again, and its memory reads as zero.
  for (int i = 0; i < 100; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMallocManaged(&ptr, 3000));
    const auto* bytes = static_cast<const unsigned char*>(ptr);
    for (int b = 0; b < 3000; ++b) CHECK(bytes[b] == 0);
    std::memset(ptr, 1, 3000);
    CHECK_CUDA(cudaFree(ptr));
  }
  std::printf("ok\n");
  return 0;
}
