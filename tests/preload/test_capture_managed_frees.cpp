// Preload test: managed memory and stream captures (Note [Managed frees during a capture] in
// interpose/pooling.cpp, Note [Unsafe calls in a capture] in interpose/capture_hooks.cpp). Each
// case runs in a child of its own on the 256 MiB device (the budget, limit:256M in meson.build,
// sizes a GPU as the stand-in):
//  - other-thread: the main thread holds a relaxed capture open while a worker allocates,
//    writes and frees 100 managed buffers of 1 MiB; after the capture, 200 MiB are asked for.
//    Plain CUDA freed the worker's buffers at once; the library kept every managed allocation
//    freed while any capture was open, for the life of the process, and the request failed.
//  - own-relaxed: the same, the capturing thread freeing inside its own relaxed capture, which
//    CUDA allows too (the library kept that memory for good as well).
//  - global-malloc: cudaMallocManaged on the thread of a global-mode capture: plain CUDA refuses
//    it (cudaErrorStreamCaptureUnsupported) and invalidates the capture, whose end then fails;
//    the library served it from a slab and the capture went on.
// A free by the capturing thread inside its own global capture is kept still (the library makes
// that free legal; capture_managed_freed checks it).
#include <cstring>
#include <string>
#include <thread>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

void churn_managed() {
  for (int i = 0; i < 100; ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMallocManaged(&buffer, kMiB));
    std::memset(buffer, i, kMiB);
    CHECK_CUDA(cudaFree(buffer));
  }
}

void freed_memory_comes_back(bool other_thread) {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  if (other_thread) {
    std::thread(churn_managed).join();
  } else {
    churn_managed();
  }
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
}

void managed_in_global_capture() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  void* managed = nullptr;
  CHECK_RESULT(cudaMallocManaged(&managed, kMiB), cudaErrorStreamCaptureUnsupported);
  CHECK_RESULT(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  CHECK_RESULT(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  CHECK(graph == nullptr);
  CHECK_CUDA(cudaStreamDestroy(stream));
}

int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  if (name == "other-thread") freed_memory_comes_back(true);
  if (name == "own-relaxed") freed_memory_comes_back(false);
  if (name == "global-malloc") managed_in_global_capture();
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  preload_test::run_cases_in_children({"other-thread", "own-relaxed", "global-malloc"});
  std::printf("ok\n");
  return 0;
}
