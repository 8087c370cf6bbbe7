// Preload test: after a graph's destroy, a request that the pools cannot serve but the driver can
// is answered at once, while another graph keeps pinned memory (Note [Graphs dying] in
// interpose/pooling.cpp). The 1 GiB device (meson.build) is filled by cudaMallocAsync but for
// 1 MiB, less than a page of the pools'; then each of three rounds captures a 4 KiB allocation,
// and while that graph lives asks for 4 KiB more (the driver serves it, as it serves the plain
// call), then destroys the graph. From the second round on the request waited for the destroyed
// graph's memory to come back, the whole 10 s, though the driver had room for it.
#include <chrono>
#include <string>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  void* filler = nullptr;
  CHECK_CUDA(cudaMallocAsync(&filler, free_bytes - (std::size_t{1} << 20), stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (int round = 0; round < 3; ++round) {
    void* captured = nullptr;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    CHECK_CUDA(cudaMalloc(&captured, 4096));
    CHECK_CUDA(cudaMemsetAsync(captured, 1, 4096, stream));
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    const auto start = std::chrono::steady_clock::now();
    void* beside = nullptr;
    CHECK_CUDA(cudaMalloc(&beside, 4096));
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK_MSG(took < std::chrono::seconds(2),
              "round " + std::to_string(round) + ": 4 KiB beside a live graph took " +
                  std::to_string(std::chrono::duration<double>(took).count()) + " s");
    CHECK_CUDA(cudaFree(beside));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaFree(captured));
  }
  CHECK_CUDA(cudaFreeAsync(filler, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}
