// Preload test 13: the pools return idle pages while a capture is open (Note [Releases during
// capture] in interpose/release_worker.cpp). Three quarters of the device are allocated and
// freed, so the pools hold them as idle pages; then, inside a capture, half the device is asked
// for, which only those pages can give: out-of-memory recovery returns them to the driver (the
// library's own frees run in relaxed capture mode, which a capture allows) and the request
// succeeds, as it does without the library. The capture ends valid and its graph runs. Three
// times: the request made on the capturing thread inside a relaxed capture, on another thread
// beside a thread-local one (where plain CUDA allows it too), and on the capturing thread inside
// a global one (legal under the library only). The release used to wait for the capture's end,
// and the request failed.
//
// Run with free_fence:none so the freed pages are idle at once (no fence to wait for).
// Sizes are fractions of the device: the same program runs on the stand-in and on a GPU.
#include <thread>
#include <vector>

#include "check.h"

namespace {

void capture_beside_idle_pages(cudaStreamCaptureMode mode, bool other_thread) {
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
  CHECK_CUDA(cudaStreamBeginCapture(stream, mode));
  CHECK_CUDA(cudaMemsetAsync(target, 0x6b, 4096, stream));
  // Half the device: only possible by returning the idle pieces to the driver.
  void* half = nullptr;
  cudaError_t during = cudaErrorUnknown;
  if (other_thread) {
    std::thread([&] { during = cudaMalloc(&half, total / 2); }).join();
  } else {
    during = cudaMalloc(&half, total / 2);
  }
  CHECK_MSG(during == cudaSuccess,
            "cudaMalloc during the capture: " + preload_test::error_text(during));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  preload_test::launch_once(graph, stream);
  CHECK(preload_test::device_bytes_equal(target, 4096, 0x6b));

  CHECK_CUDA(cudaMemset(half, 0x5c, total / 2));
  CHECK(preload_test::device_bytes_equal(half, 4096, 0x5c));
  CHECK_CUDA(cudaFree(half));
  CHECK_CUDA(cudaFree(target));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  capture_beside_idle_pages(cudaStreamCaptureModeRelaxed, false);
  capture_beside_idle_pages(cudaStreamCaptureModeThreadLocal, true);
  capture_beside_idle_pages(cudaStreamCaptureModeGlobal, false);
  std::printf("ok\n");
  return 0;
}
