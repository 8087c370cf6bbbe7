// Preload test: a capture begins while the release thread is inside the driver's free of a page
// (Note [Releases during capture] in interpose/release_worker.cpp). Eight 64 MiB pages, freed,
// go back to the driver before a host function (the pools give idle memory back before a park),
// which waits for them for at most a second; each driver free takes 200 ms here
// (SIMCUDA_FREE_DELAY_US), so frees are still under way when the program begins a global-mode
// capture. Before, a free that began just before the capture invalidated it and its page was
// lost to the pools while the driver still held it. Now the capture ends valid, its graph runs,
// and every page reaches the driver once the capture is over.
#include <chrono>
#include <thread>

#include "check.h"

namespace {

void CUDART_CB nothing(void*) {}

}  // namespace

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's slow frees");
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t kKept = 1 << 20;
  void* kept = nullptr;
  CHECK_CUDA(cudaMalloc(&kept, kKept));
  void* pages[8];
  for (void*& page : pages) CHECK_CUDA(cudaMalloc(&page, 64 << 20));
  for (void* page : pages) CHECK_CUDA(cudaFree(page));
  CHECK_CUDA(cudaLaunchHostFunc(stream, nothing, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemsetAsync(kept, 1, kKept, stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // frees would run meanwhile
  CHECK_CUDA(cudaMemsetAsync(kept, 2, kKept, stream));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK(graph != nullptr);
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(preload_test::device_bytes_equal(kept, kKept, 2));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));

  // Every page reaches the driver once the capture is over: only what the program and the
  // pools still hold is live (the kept buffer's page).
  std::uint64_t live = 0;
  for (int i = 0; i < 500; ++i) {
    live = preload_test::counter("live_bytes");
    if (live < (64u << 20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK_MSG(live < (64u << 20), "pages never reached the driver: " + std::to_string(live));
  CHECK_CUDA(cudaFree(kept));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}
