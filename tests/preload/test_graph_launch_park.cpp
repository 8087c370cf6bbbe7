// Preload test: a graph whose host node parks its stream, launched right after the program
// freed memory with cudaFree. Plain CUDA's frees had the memory back with the driver before
// the launch, so requests during the park are served at once; under the library that memory
// waits in an open batch, whose fence must be recorded before the launch, not behind the park.
// Each case runs in a child of its own, on a 32 MiB device:
//   runtime  cudaGraphLaunch;
//   driver   the driver's cuGraphLaunch, which the library did not hook: the batch's fence was
//            recorded after the launch, on the parked stream, and a 1 MiB request was refused
//            after the out-of-memory bound (10 seconds).
#include <cuda.h>

#include <chrono>
#include <string>
#include <vector>

#include "check.h"

namespace {

int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  preload_test::Gate gate;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaLaunchHostFunc(stream, &preload_test::wait_at_gate, &gate));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<void*> freed(12);
  for (void*& buffer : freed) {
    CHECK_CUDA(cudaMalloc(&buffer, 1 << 20));
    CHECK_CUDA(cudaMemset(buffer, 1, 1 << 20));
  }
  for (void* buffer : freed) CHECK_CUDA(cudaFree(buffer));
  if (name == "driver") {
    CHECK_MSG(cuGraphLaunch(exec, stream) == CUDA_SUCCESS, "cuGraphLaunch");
  } else {
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
  }
  while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  const auto began = std::chrono::steady_clock::now();
  std::vector<void*> during(1 + 6);
  CHECK_CUDA(cudaMalloc(&during[0], std::size_t{16} << 20));
  for (std::size_t i = 1; i < during.size(); ++i) CHECK_CUDA(cudaMalloc(&during[i], 1 << 20));
  const auto took = std::chrono::steady_clock::now() - began;
  CHECK_MSG(took < std::chrono::seconds(2), "the requests during the park waited for it");

  gate.open.store(true);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (void* buffer : during) CHECK_CUDA(cudaFree(buffer));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1) return run_case(argv[1]);
  preload_test::run_cases_in_children({"runtime", "driver"});
  std::printf("ok\n");
  return 0;
}
