// Preload test: memory a destroyed graph pinned, freed by the program, then a stream parked on a
// host function. A relaxed capture allocates half the device; the graph is launched,
// synchronized and destroyed, the buffer freed, and a stream parked on a host function that the
// program opens only after its next call, a small cudaMalloc: plain CUDA's returns at once. The
// graph's release reaches the library on CUDA's thread and is taken at that call, which frees the
// buffer then; under free_fence:sync (the second run) that free synchronized the device, behind
// the park, and the call hung. A free a graph's release makes waits for a fence event in every
// mode (Note [Frees a graph's release makes] in pools/manager_api.cpp): the call must return
// while the stream is still parked.
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
  gate.limit_seconds = 5;  // a call that waits for the park returns when it ends, too late
  preload_test::park(parked, gate);
  void* small = nullptr;
  const cudaError_t answer = cudaMalloc(&small, 4096);
  const bool still_parked = cudaStreamQuery(parked) == cudaErrorNotReady;
  gate.open.store(true);
  CHECK_CUDA(cudaStreamSynchronize(parked));
  CHECK_MSG(still_parked, "the request waited for the parked stream");
  CHECK_MSG(answer == cudaSuccess, "4 KiB beside the park: " + preload_test::error_text(answer));
  CHECK_CUDA(cudaFree(small));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  CHECK_CUDA(cudaStreamDestroy(parked));
  std::printf("ok\n");
  return 0;
}
