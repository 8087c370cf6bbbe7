// Preload test: memory a destroyed graph pinned, freed by the program, then a stream parked on a
// host function (Note [Graph releases before host work] in interpose/pooling.cpp). A relaxed
// capture allocates half the device; the graph is launched, synchronized and destroyed, the
// buffer freed, and a stream (created before the capture's) parked on a host function that the
// program opens only after its next call. Plain CUDA freed the buffer at once, so that call, a
// request of 220/256 of the device, succeeds at once. Under the library the graph's release
// arrives on CUDA's thread and was taken only at that call, after the park: its free waited
// behind the park, and the request failed after 10 s; under free_fence:sync (the second run) its
// synchronize hung. The call must return while the stream is still parked, and succeed.
#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  cudaStream_t parked = nullptr;
  cudaStream_t capturing = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));

  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, total / 2));
  CHECK_CUDA(cudaMemsetAsync(workspace, 1, 4096, capturing));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
  preload_test::launch_once(graph, capturing);  // and destroys it
  CHECK_CUDA(cudaFree(workspace));

  preload_test::Gate gate;
  gate.limit_seconds = 20;  // past the library's 10 s bound: a wait for the park shows as such
  preload_test::park(parked, gate);
  void* large = nullptr;
  const cudaError_t answer = cudaMalloc(&large, total / 256 * 220);
  const bool still_parked = cudaStreamQuery(parked) == cudaErrorNotReady;
  gate.open.store(true);
  CHECK_CUDA(cudaStreamSynchronize(parked));
  CHECK_MSG(still_parked, "the request waited for the parked stream");
  CHECK_MSG(answer == cudaSuccess,
            "220/256 of the device after the workspace was freed: " +
                preload_test::error_text(answer));
  CHECK_CUDA(cudaFree(large));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  CHECK_CUDA(cudaStreamDestroy(parked));
  std::printf("ok\n");
  return 0;
}
