// Preload test 13: the pools never call cudaFree while a capture is open. cudaFree synchronizes
// the device, which fails and invalidates any capture open on it; the pools return idle pages on
// their own schedule (here: out-of-memory recovery trims the pages the program freed), possibly
// while the program captures. The release is deferred until the capture is over: the capture
// ends valid and its graph runs, the allocation that needed the trimmed memory either succeeds
// or fails cleanly with cudaErrorMemoryAllocation, and once the capture is over the same
// allocation succeeds.
//
// Run with free_fence:none so the freed pages are idle at once (no fence to wait for).
// Sizes are fractions of the device: the same program runs on the stand-in and on a GPU.
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const bool counted = preload_test::on_stand_in();

  void* target = nullptr;
  CHECK_CUDA(cudaMalloc(&target, 4096));
  // Three quarters of the device in sixteenths, freed: the pools keep them as idle pages.
  const std::size_t piece = total / 16;
  std::vector<void*> pieces;
  for (int i = 0; i < 12; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, piece));
    pieces.push_back(ptr);
  }
  for (void* ptr : pieces) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (counted) {
    CHECK_MSG(preload_test::counter("live_bytes") >= total / 2,
              "pools released the pieces: " + std::to_string(preload_test::counter("live_bytes")));
  }

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMemsetAsync(target, 0x6b, 4096, stream));
  // Half the device: only possible by trimming the idle pieces, which must wait.
  void* half = nullptr;
  cudaError_t during = cudaMalloc(&half, total / 2);
  CHECK_MSG(during == cudaSuccess || during == cudaErrorMemoryAllocation,
            "cudaMalloc during the capture: " + preload_test::error_text(during));
  if (during != cudaSuccess) {
    CHECK_RESULT(cudaGetLastError(), cudaErrorMemoryAllocation);
    half = nullptr;
  }
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  preload_test::launch_once(graph, stream);
  CHECK(preload_test::device_bytes_equal(target, 4096, 0x6b));

  // Capture over: the deferred release happens and the same request succeeds.
  if (half == nullptr) CHECK_CUDA(cudaMalloc(&half, total / 2));
  CHECK_CUDA(cudaMemset(half, 0x5c, total / 2));
  CHECK(preload_test::device_bytes_equal(half, 4096, 0x5c));
  CHECK_CUDA(cudaFree(half));
  CHECK_CUDA(cudaFree(target));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("capture during=%s ok\n", during == cudaSuccess ? "allocated" : "refused");
  return 0;
}
