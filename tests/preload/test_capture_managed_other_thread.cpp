// Preload test: managed memory that one thread allocates and frees while another thread's
// capture is open on the device goes back to its slabs (Note [Managed frees during a capture] in
// interpose/pooling.cpp). The main thread holds a relaxed capture open while a worker allocates,
// writes and frees 100 managed buffers of 1 MiB; after the capture, 200 MiB are asked for on the
// 256 MiB device. Plain CUDA freed the worker's buffers at once. The library kept every managed
// allocation freed while any capture was open for the life of the process, so the request failed
// for the 100 MiB the worker had freed. A free by the capturing thread itself is kept still
// (capture_managed_freed). The budget (limit:256M in meson.build) sizes a GPU as the stand-in.
#include <cstring>
#include <thread>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  std::thread worker([&] {
    for (int i = 0; i < 100; ++i) {
      void* buffer = nullptr;
      CHECK_CUDA(cudaMallocManaged(&buffer, kMiB));
      std::memset(buffer, i, kMiB);
      CHECK_CUDA(cudaFree(buffer));
    }
  });
  worker.join();
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphDestroy(graph));

  void* large = nullptr;
  const cudaError_t answer = cudaMalloc(&large, 200 * kMiB);
  CHECK_MSG(answer == cudaSuccess, "200 MiB after the capture: " +
                                       preload_test::error_text(answer));
  CHECK_CUDA(cudaMemset(large, 0x2e, 200 * kMiB));
  CHECK(preload_test::device_bytes_equal(large, 4096, 0x2e));
  CHECK_CUDA(cudaFree(large));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}
