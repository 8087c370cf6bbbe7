// Preload test: a stream-ordered free waits for its own stream only, however other streams
// stand (Note [Stream-ordered frees]). Run on a 1 GiB device; every park opens by itself after a
// minute, so a failure never hangs.
//   per_thread  Thread X parks its per-thread default stream and frees on it; the main thread
//               frees 600 MiB on its own per-thread default stream, synchronizes it, and
//               allocates 600 MiB again: that must succeed while X's stream is still parked.
//   oldest      A free on a parked stream is the oldest fence waiting; 600 MiB freed after it on
//               a stream that runs again 300 ms later must serve the next 600 MiB while the
//               first stream is still parked (waits for the oldest fence take back what other
//               streams returned meanwhile). The brief park comes first and the long one is
//               queued after it: CUDA may run all host functions on one thread, and then the
//               long park begins only when the brief one ends (on the stand-in, at once).
// The budget (limit:1G in meson.build) gives a GPU the stand-in's 1 GiB.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "check.h"

namespace {

constexpr std::size_t kBig = std::size_t{600} << 20;

void per_thread() {
  cudaStream_t other = nullptr;  // a created stream: the device leaves one-queue reuse
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 1 << 20));
  preload_test::Gate gate;
  gate.limit_seconds = 60;
  std::atomic<int> step{0};  // 1: X freed; 2: the main thread asks; 3: X answered
  std::atomic<bool> x_parked{false};
  std::thread x([&] {
    preload_test::park(cudaStreamPerThread, gate);
    CHECK_CUDA(cudaFreeAsync(small, cudaStreamPerThread));
    step.store(1);
    while (step.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Only X can ask about its own per-thread stream.
    x_parked.store(cudaStreamQuery(cudaStreamPerThread) == cudaErrorNotReady);
    step.store(3);
  });
  while (step.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, kBig));
  CHECK_CUDA(cudaMemsetAsync(big, 7, kBig, cudaStreamPerThread));
  CHECK_CUDA(cudaFreeAsync(big, cudaStreamPerThread));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  const cudaError_t result = cudaMalloc(&big, kBig);
  step.store(2);
  while (step.load() != 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gate.open.store(true);
  x.join();
  CHECK_CUDA(result);
  CHECK_MSG(x_parked.load(), "the allocation waited for another thread's parked stream");
  CHECK_CUDA(cudaFree(big));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(other));
}

void oldest() {
  cudaStream_t parked = nullptr;
  cudaStream_t later = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&later, cudaStreamNonBlocking));
  void* small = nullptr;
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 64 << 20));
  CHECK_CUDA(cudaMalloc(&big, kBig));
  preload_test::Gate held;
  preload_test::Gate brief;
  held.limit_seconds = 60;
  brief.limit_seconds = 60;
  preload_test::park(later, brief);
  CHECK_CUDA(cudaLaunchHostFunc(parked, &preload_test::wait_at_gate, &held));
  CHECK_CUDA(cudaFreeAsync(small, parked));
  CHECK_CUDA(cudaFreeAsync(big, later));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    brief.open.store(true);
  });
  const cudaError_t result = cudaMalloc(&big, kBig);
  const bool still_parked = cudaStreamQuery(parked) == cudaErrorNotReady;
  opener.join();
  held.open.store(true);
  CHECK_CUDA(result);
  CHECK(still_parked);
  CHECK_CUDA(cudaFree(big));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(parked));
  CHECK_CUDA(cudaStreamDestroy(later));
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const char* which = argc > 1 ? argv[1] : "";
  if (std::strcmp(which, "per_thread") == 0) {
    per_thread();
  } else if (std::strcmp(which, "oldest") == 0) {
    oldest();
  } else {
    preload_test::fail(__FILE__, __LINE__, std::string("unknown case '") + which + "'");
  }
  return 0;
}
