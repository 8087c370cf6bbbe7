// Preload test: a stream created with the handle value of a destroyed stream is another stream.
// Stream S is parked on a host function and a buffer is freed in its order (cudaFreeAsync), then
// S is destroyed (its queued work still runs) and the next stream, S2, gets the same handle
// (the stand-in reuses handle values under SIMCUDA_REUSE_STREAM_HANDLES=1, as a real driver may).
// A buffer freed in S2's order, which runs, must be reusable once S2 passes the free, as under
// plain CUDA: keyed by the handle, the library queued it behind S's park, and an allocation that
// needs its memory failed after the recovery's bound. Run on a 128 MiB device.

#include <chrono>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

}  // namespace

int main() {
  preload_test::require_preloaded();
  cudaStream_t first = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  preload_test::Gate gate;
  gate.limit_seconds = 30;
  preload_test::park(first, gate);
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 4096));
  CHECK_CUDA(cudaFreeAsync(small, first));  // waits for the park
  CHECK_CUDA(cudaStreamDestroy(first));

  cudaStream_t second = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  if (second != first) {
    gate.open.store(true);
    preload_test::skip("the runtime gave the new stream a handle of its own");
  }
  // 80 MiB twice does not fit a 128 MiB device: the second needs the first's memory back.
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, 80 * kMiB));
  CHECK_CUDA(cudaFreeAsync(big, second));
  CHECK_CUDA(cudaStreamSynchronize(second));
  const auto start = std::chrono::steady_clock::now();
  void* again = nullptr;
  const cudaError_t result = cudaMalloc(&again, 80 * kMiB);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const bool still_parked = !gate.open.load();
  gate.open.store(true);
  CHECK_CUDA(result);
  CHECK_MSG(still_parked, "the allocation returned only after the park ran out");
  CHECK_MSG(ms < 5000, "the allocation waited " + std::to_string(ms) + " ms");
  CHECK_CUDA(cudaFree(again));
  CHECK_CUDA(cudaStreamSynchronize(second));
  CHECK_CUDA(cudaStreamDestroy(second));
  CHECK_CUDA(cudaDeviceSynchronize());
  return 0;
}
