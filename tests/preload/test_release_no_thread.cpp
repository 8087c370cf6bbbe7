// Preload test: when the library cannot start a device's release thread, the pages it gives up
// still reach the driver, and never while it holds a lock of the pools. The test makes every
// thread creation fail (refuse_threads.h), parks a stream, and makes a growth past the held bound
// give an idle page back. The driver's free of that page waits for the park. Meanwhile another thread reuses
// a freed slice: it must not wait behind that free (freed at the release itself, under the
// shard's lock, it waited until the park ran out). The page must still reach the driver before
// the growth returns (the growth's wait for it frees it on the growing thread). Run under
// free_fence:none, thread_cache:off (the other thread's reuse takes the shard's lock) and
// memgetinfo:raw, on a 1 GiB device.

#include <atomic>
#include <chrono>
#include <thread>

#include "check.h"
#include "refuse_threads.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

}  // namespace

int main() {
  preload_test::require_preloaded();
  cudaStream_t parked = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  // A 1 MiB slice the other thread will reuse, freed once the stream is parked (a host function
  // gives idle pages back before it parks: this one's must not start the release thread).
  void* slot = nullptr;
  CHECK_CUDA(cudaMalloc(&slot, kMiB));

  preload_test::Gate gate;
  gate.limit_seconds = 5;
  std::atomic<bool> go{false};
  std::atomic<double> reuse_ms{-1};
  std::thread neighbour([&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the free is under way
    const auto start = std::chrono::steady_clock::now();
    void* p = nullptr;
    const bool ok = cudaMalloc(&p, kMiB) == cudaSuccess && cudaFree(p) == cudaSuccess;
    reuse_ms.store(ok ? std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - start).count()
                      : -2);
    gate.open.store(true);
  });
  preload_test::park(parked, gate);
  preload_test::refuse_threads.store(true);  // every thread the test and CUDA need exists by now
  CHECK_CUDA(cudaFree(slot));
  void* keep = nullptr;
  preload_test::hold_an_idle_page(&keep);
  std::size_t free_before = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
  go.store(true);
  // Past the held bound: the idle page goes back, with no thread to free it.
  void* grown = nullptr;
  CHECK_CUDA(cudaMalloc(&grown, 320 * kMiB));
  neighbour.join();
  preload_test::refuse_threads.store(false);

  CHECK_MSG(reuse_ms.load() >= 0, "the neighbour's reuse failed");
  CHECK_MSG(reuse_ms.load() < 1000, "the neighbour's reuse waited " +
                                        std::to_string(reuse_ms.load()) + " ms behind the free");
  // The growth waited for the idle page to reach the driver (320 MiB taken, 256 MiB back).
  std::size_t free_now = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_now, &total));
  CHECK_MSG(free_now + 64 * kMiB >= free_before, "the idle page never reached the driver");
  CHECK_CUDA(cudaStreamSynchronize(parked));
  CHECK_CUDA(cudaFree(grown));
  CHECK_CUDA(cudaFree(keep));
  CHECK_CUDA(cudaStreamDestroy(parked));
  return 0;
}
