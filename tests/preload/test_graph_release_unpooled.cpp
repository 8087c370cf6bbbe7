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
// And no wait where no release comes:
//   exec-lives  the graph (8 MiB pinned) is destroyed while its exec lives on, so no release
//               comes; the pools hold an idle 40 MiB page; a 40 MiB cudaMallocAsync, which the
//               driver refuses until that page goes back, is served at once, as the plain call
//               is (a wait for the release there once took 10 seconds a call).
#include <chrono>
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// A graph whose relaxed capture allocated `bytes` (*buffer, pinned) and wrote them, launched
// once on `stream` and finished.
struct Captured {
  void* buffer = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

Captured capture_and_launch(cudaStream_t stream, std::size_t bytes) {
  Captured c;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMalloc(&c.buffer, bytes));
  CHECK_CUDA(cudaMemsetAsync(c.buffer, 7, bytes, stream));
  CHECK_CUDA(cudaStreamEndCapture(stream, &c.graph));
  CHECK_CUDA(cudaGraphInstantiate(&c.exec, c.graph, 0));
  CHECK_CUDA(cudaGraphLaunch(c.exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return c;
}

void exec_lives() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Captured c = capture_and_launch(stream, 8 * kMiB);
  CHECK_CUDA(cudaGraphDestroy(c.graph));  // the exec lives on: no release comes
  void* idle = nullptr;
  CHECK_CUDA(cudaMalloc(&idle, 40 * kMiB));
  CHECK_CUDA(cudaFree(idle));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto start = std::chrono::steady_clock::now();
  void* large = nullptr;
  CHECK_CUDA(cudaMallocAsync(&large, 40 * kMiB, stream));
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK_MSG(took < std::chrono::seconds(5),
            "cudaMallocAsync waited " +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
                " ms for a release that never comes");
  CHECK_CUDA(cudaFreeAsync(large, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGraphExecDestroy(c.exec));
  CHECK_CUDA(cudaFree(c.buffer));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void run(const std::string& name) {
  if (name == "exec-lives") return exec_lives();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Captured c = capture_and_launch(stream, 40 * kMiB);
  if (name == "freed-first") CHECK_CUDA(cudaFree(c.buffer));
  CHECK_CUDA(cudaGraphExecDestroy(c.exec));
  CHECK_CUDA(cudaGraphDestroy(c.graph));
  if (name != "freed-first") CHECK_CUDA(cudaFree(c.buffer));
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
  preload_test::run_cases_in_children({"async", "pitch", "managed", "freed-first", "exec-lives"});
  std::printf("ok\n");
  return 0;
}
