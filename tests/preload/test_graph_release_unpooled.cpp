// Preload test: memory a destroyed graph pinned comes back for requests the pools do not serve.
// A relaxed capture allocates 40 MiB of the 64 MiB device (meson.build) and writes it; the graph
// is launched, destroyed, and the buffer freed; then 50 MiB are asked for through a call that the
// pools pass to CUDA. Plain CUDA serves it. The library took a dead graph's releases only at a
// pooled call, so the 40 MiB stayed held and CUDA refused the request (cudaErrorMemoryAllocation,
// however long the program waited). Each case runs in a child of its own:
//   async    cudaMallocAsync;
//   pitch    cudaMallocPitch;
//   managed  cudaMallocManaged (larger than the slabs);
//   freed-first  cudaMallocAsync, the buffer freed before the graph's destroy.
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

void run(const std::string& name) {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* buffer = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMalloc(&buffer, 40 * kMiB));
  CHECK_CUDA(cudaMemsetAsync(buffer, 7, 40 * kMiB, stream));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  if (name == "freed-first") CHECK_CUDA(cudaFree(buffer));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  if (name != "freed-first") CHECK_CUDA(cudaFree(buffer));
  void* large = nullptr;
  cudaError_t answer = cudaErrorInvalidValue;
  if (name == "async" || name == "freed-first") {
    answer = cudaMallocAsync(&large, 50 * kMiB, stream);
  } else if (name == "pitch") {
    std::size_t pitch = 0;
    answer = cudaMallocPitch(&large, &pitch, kMiB, 50);
  } else if (name == "managed") {
    answer = cudaMallocManaged(&large, 50 * kMiB);
  }
  CHECK_MSG(answer == cudaSuccess, name + " after the graph's destroy: " +
                                       preload_test::error_text(answer));
  if (name == "async" || name == "freed-first") {
    CHECK_CUDA(cudaFreeAsync(large, stream));
  } else {
    CHECK_CUDA(cudaFree(large));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    CHECK_CUDA(cudaFree(nullptr));
    run(argv[1]);
    std::printf("case done\n");
    return 0;
  }
  preload_test::require_preloaded();
  preload_test::run_cases_in_children({"async", "pitch", "managed", "freed-first"});
  std::printf("ok\n");
  return 0;
}
