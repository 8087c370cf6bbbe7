// Preload test: captures whose end the library must match to the right begin. Each case runs
// in a child on a 64 MiB device and ends with 100 rounds of a 24 MiB allocation, a write and a
// free, which succeed only if no capture window was left open (an open window holds every free).
//  - threads: two threads capture on their own per-thread default streams (the same handle);
//    the second one's capture is invalidated and ended. It used to close the first thread's
//    window as failed, and its own stayed open for good: round 2 ran out of memory.
//  - reset: cudaDeviceReset while a capture on the per-thread default stream is open, then a
//    capture there that is invalidated and ended. The reset left the first capture's entry, which
//    the end found, and the second window stayed open.
#include <atomic>
#include <thread>

#include "check.h"

namespace {

constexpr std::size_t kRound = std::size_t{24} << 20;

void churn() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  for (int round = 0; round < 100; ++round) {
    void* ptr = nullptr;
    const cudaError_t result = cudaMalloc(&ptr, kRound);
    CHECK_MSG(result == cudaSuccess, "round " + std::to_string(round) + ": " +
                                         cudaGetErrorName(result));
    CHECK(launch(stream, ptr, kRound, 1, nullptr, nullptr) == 0);
    CHECK_CUDA(cudaFree(ptr));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

// Begins a relaxed capture on this thread's per-thread stream, invalidates it and ends it.
void invalidated_capture() {
  CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
  CHECK(cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess);
  cudaGraph_t graph = nullptr;
  CHECK_RESULT(cudaStreamEndCapture(cudaStreamPerThread, &graph),
               cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
}

int threads_child() {
  CHECK_CUDA(cudaFree(nullptr));
  std::atomic<int> step{0};
  cudaGraph_t graph = nullptr;
  void* buffer = nullptr;
  std::thread first([&] {
    CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    CHECK_CUDA(cudaMalloc(&buffer, 1 << 20));
    CHECK_CUDA(cudaMemsetAsync(buffer, 0x5a, 1 << 20, cudaStreamPerThread));
    CHECK_CUDA(cudaStreamEndCapture(cudaStreamPerThread, &graph));
  });
  std::thread second([&] {
    while (step.load() != 1) std::this_thread::yield();
    invalidated_capture();
    step = 2;
  });
  first.join();
  second.join();
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(preload_test::device_bytes_equal(buffer, 1 << 20, 0x5a));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaFree(buffer));
  churn();
  std::printf("case done\n");
  return 0;
}

int reset_child() {
  CHECK_CUDA(cudaFree(nullptr));
  CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaDeviceReset());
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(cudaStreamPerThread, &graph) != cudaSuccess);
  (void)cudaGetLastError();
  invalidated_capture();
  churn();
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's timed operations");
  if (argc > 1 && std::string(argv[1]) == "threads") return threads_child();
  if (argc > 1 && std::string(argv[1]) == "reset") return reset_child();
  for (const char* which : {"threads", "reset"}) {
    const preload_test::ChildResult result = preload_test::run_self(which, {}, 120);
    CHECK_MSG(result.status == 0 && result.output.find("case done") != std::string::npos,
              std::string(which) + ": " + result.output);
    std::printf("%s: ok\n", which);
  }
  return 0;
}
