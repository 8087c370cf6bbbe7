// Preload test: graphs whose destruction CUDA reports late do not starve the captures that follow
// (Note [Releases inside a window] in pools/manager_api.cpp). A loop captures, in relaxed mode,
// an allocation of 1/32 of the device, a memset of it and its free, and destroys the graph
// without launching it. The stand-in runs each graph's user-object destructor 5 ms late, one
// after the other (SIMCUDA_DESTRUCTOR_DELAY_US), so the reports fall behind the loop: the library
// keeps each buffer pinned until its report comes, and the device fills with them. Plain CUDA
// frees each buffer at its cudaFree and never fails. Under the library every allocation must
// succeed too: inside a capture, one that finds the device full waits for the reports already
// due, and the memory they release inside the window is reused there once the fence recorded
// before the window opened has passed. The allocations used to fail once the device was full
// (they did not wait inside a window), and on a busy machine also with no delay at all.
// Sizes are fractions of the device; on a GPU the reports come at once and the loop passes.
#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t size = total / 32;
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kRounds = 160;  // five devices' worth
  for (int round = 0; round < kRounds; ++round) {
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    void* buffer = nullptr;
    const cudaError_t allocated = cudaMalloc(&buffer, size);
    CHECK_MSG(allocated == cudaSuccess, "round " + std::to_string(round) + ": cudaMalloc of " +
                                            std::to_string(size) + " B inside the capture: " +
                                            cudaGetErrorName(allocated));
    CHECK_CUDA(cudaMemsetAsync(buffer, round, size, stream));
    CHECK_CUDA(cudaFree(buffer));
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
