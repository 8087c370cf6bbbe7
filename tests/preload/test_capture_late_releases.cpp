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
// Then graphs destroyed together, whose reports come one by one (Note [Graphs dying] in
// interpose/pooling.cpp): four graphs each pin a fifth of the device that the program freed; once
// they are destroyed, a request of 85% must wait for all four reports, not the first only. And
// rounds of four captures that each allocate 3/16 of the device while the previous round's graphs
// (destroyed, then their buffers freed) are still reported: no allocation inside the captures may
// fail. Both used to fail once the first report had come. In a child whose every stream operation
// takes 0.4 s, graph A (2/5 of the device) is launched and graph B (1/10) is not, both are freed
// and destroyed, and a request of 85% must wait for A's report, which comes after its launch:
// B's, which comes at once, used to end the wait.
// Sizes are fractions of the device; on a GPU the reports come at once and the loop passes.
#include <vector>

#include "check.h"

namespace {

// Captures, in relaxed mode on `stream`, an allocation of `size` and a memset of it.
cudaGraph_t capture_allocation(cudaStream_t stream, std::size_t size, void** buffer,
                               const std::string& what) {
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  const cudaError_t allocated = cudaMalloc(buffer, size);
  CHECK_MSG(allocated == cudaSuccess, what + ": cudaMalloc of " + std::to_string(size) +
                                          " B inside the capture: " + cudaGetErrorName(allocated));
  CHECK_CUDA(cudaMemsetAsync(*buffer, 1, size, stream));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  return graph;
}

void graphs_destroyed_together(cudaStream_t stream, std::size_t total) {
  std::vector<cudaGraph_t> graphs;
  std::vector<void*> buffers(4);
  for (void*& buffer : buffers)
    graphs.push_back(capture_allocation(stream, total / 5, &buffer, "together"));
  for (void* buffer : buffers) CHECK_CUDA(cudaFree(buffer));
  for (cudaGraph_t graph : graphs) CHECK_CUDA(cudaGraphDestroy(graph));
  void* large = nullptr;
  CHECK_CUDA(cudaMalloc(&large, total / 20 * 17));
  CHECK_CUDA(cudaFree(large));
}

void rounds_of_graphs(cudaStream_t stream, std::size_t total) {
  for (int round = 0; round < 6; ++round) {
    std::vector<cudaGraph_t> graphs;
    std::vector<cudaGraphExec_t> execs;
    std::vector<void*> buffers(4);
    for (std::size_t k = 0; k < buffers.size(); ++k) {
      graphs.push_back(capture_allocation(stream, total / 16 * 3, &buffers[k],
                                          "round " + std::to_string(round) + ", graph " +
                                              std::to_string(k)));
      cudaGraphExec_t exec = nullptr;
      CHECK_CUDA(cudaGraphInstantiate(&exec, graphs.back(), 0));
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      execs.push_back(exec);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (cudaGraphExec_t exec : execs) CHECK_CUDA(cudaGraphExecDestroy(exec));
    for (cudaGraph_t graph : graphs) CHECK_CUDA(cudaGraphDestroy(graph));
    for (void* buffer : buffers) CHECK_CUDA(cudaFree(buffer));
  }
}

int one_graph_still_running(cudaStream_t stream, std::size_t total) {
  void* a = nullptr;
  void* b = nullptr;
  cudaGraph_t running = capture_allocation(stream, total / 5 * 2, &a, "running");
  cudaGraph_t idle = capture_allocation(stream, total / 10, &b, "idle");
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, running, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(running));
  CHECK_CUDA(cudaGraphDestroy(idle));
  void* large = nullptr;
  CHECK_CUDA(cudaMalloc(&large, total / 20 * 17));
  CHECK_CUDA(cudaFree(large));
  std::printf("running child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t size = total / 32;
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (argc > 1 && std::string(argv[1]) == "running") return one_graph_still_running(stream, total);
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
  graphs_destroyed_together(stream, total);
  rounds_of_graphs(stream, total);
  const preload_test::ChildResult running =
      preload_test::run_self("running", {"SIMCUDA_OP_DELAY_US=400000"}, 60);
  CHECK_MSG(running.status == 0, running.output);
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
