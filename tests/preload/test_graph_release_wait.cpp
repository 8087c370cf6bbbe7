// Preload test: memory a graph pinned comes back to an allocation made while the graph's last
// launch still runs (Note [Graphs dying] in interpose/pooling.cpp). A relaxed capture allocates
// 100/256 of the device; the graph is instantiated and launched, and while the launch runs (each
// stream operation takes 150 ms on the stand-in) the exec and the graph are destroyed and the
// buffer freed. Then 200/256 of the device is asked for: the plain run's cudaFree waited for the
// launch, so the plain request succeeds. Under the library the buffer's memory stays pinned
// until CUDA runs the graph's destructor after the launch; the request that needs it waited only
// 100 ms for that, and failed. Sizes are fractions of the device: on a GPU the launch is short
// and the check holds as well.
#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t captured = total / 256 * 100;
  const std::size_t after = total / 256 * 200;

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, captured));
  for (int i = 0; i < 4; ++i) CHECK_CUDA(cudaMemsetAsync(buffer, i, 4096, stream));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaFree(buffer));

  void* large = nullptr;
  const cudaError_t answer = cudaMalloc(&large, after);
  CHECK_MSG(answer == cudaSuccess, "the request after the graph: " +
                                       preload_test::error_text(answer));
  CHECK_CUDA(cudaMemset(large, 0x3d, after));
  CHECK(preload_test::device_bytes_equal(large, 4096, 0x3d));
  CHECK_CUDA(cudaFree(large));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
