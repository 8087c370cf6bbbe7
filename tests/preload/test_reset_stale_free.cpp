// Preload test: after a device reset, some threads free pointers from before it (stale: the
// reset freed them) while others allocate, so that the pools grow pages at exactly those
// addresses (the stand-in, like a driver, hands freed addresses out again, and with one page
// per allocation every stale pointer is a page's base). A stale free must never free a page
// the pools hold: plain CUDA answers it cudaErrorInvalidValue, or frees whatever the driver put
// there, and the pools must stay consistent either way. The stand-in's free latency
// (SIMCUDA_FREE_DELAY_US) makes the race likely on every round. Stand-in only.
#include <atomic>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr int kThreads = 4;
constexpr int kBuffers = 8;
constexpr std::size_t kSize = std::size_t{1} << 20;

}  // namespace

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("the race is undefined on a real runtime");
  CHECK_CUDA(cudaFree(nullptr));

  for (int round = 0; round < 12; ++round) {
    std::vector<std::vector<void*>> stale(kThreads);
    for (auto& buffers : stale) {
      for (int i = 0; i < kBuffers; ++i) {
        void* ptr = nullptr;
        CHECK_CUDA(cudaMalloc(&ptr, kSize));
        buffers.push_back(ptr);
      }
    }
    CHECK_CUDA(cudaDeviceReset());

    std::atomic<int> ready{0};
    std::vector<std::vector<void*>> fresh(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {  // frees the stale pointers
        ready.fetch_add(1);
        while (ready.load() < 2 * kThreads) {
        }
        for (void* ptr : stale[t]) cudaFree(ptr);  // an error, or whatever is there now
        cudaGetLastError();
      });
      threads.emplace_back([&, t] {  // grows pages at the same addresses
        ready.fetch_add(1);
        while (ready.load() < 2 * kThreads) {
        }
        for (int i = 0; i < kBuffers; ++i) {
          void* ptr = nullptr;
          if (cudaMalloc(&ptr, kSize) == cudaSuccess) fresh[t].push_back(ptr);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    cudaGetLastError();

    // Every fresh buffer is live device memory of its own (a stale free may only have freed
    // one of them as a whole, as plain CUDA would: then its own free says so).
    for (int t = 0; t < kThreads; ++t) {
      for (void* ptr : fresh[t]) {
        if (cudaMemset(ptr, t, kSize) != cudaSuccess) {
          cudaGetLastError();
          continue;  // freed by a stale free; plain CUDA does the same
        }
        CHECK(preload_test::device_bytes_equal(ptr, kSize, static_cast<unsigned char>(t)));
      }
    }
    for (auto& buffers : fresh)
      for (void* ptr : buffers) cudaFree(ptr);
    cudaGetLastError();
  }

  // The pools are sound: new allocations are live, disjoint and keep their bytes.
  std::vector<void*> buffers;
  for (int i = 0; i < 64; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, kSize));
    CHECK_CUDA(cudaMemset(ptr, i, kSize));
    buffers.push_back(ptr);
  }
  for (int i = 0; i < 64; ++i)
    CHECK(preload_test::device_bytes_equal(buffers[i], kSize, static_cast<unsigned char>(i)));
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  std::printf("ok\n");
  return 0;
}
