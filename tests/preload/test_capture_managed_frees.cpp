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
//  - captured-free-async: a cudaFreeAsync of a managed buffer on the stream that captures it,
//    in a relaxed capture: the library took the memory back at once, and the graph's launch
//    wrote over a later allocation there.
//  - free-async-beside-global: a cudaFreeAsync of managed memory on a stream that does not
//    capture, beside the thread's own global capture, round after round: the library kept it
//    for good and ran the device out of memory.
// A free by the capturing thread inside its own global capture is kept still (the library makes
// that free legal; capture_managed_freed checks it).
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

// A cudaFreeAsync of a managed buffer on the stream that captures it, in a relaxed capture: the
// free is part of the graph, after its memset, and the memory must stay the buffer's until then
// (plain CUDA does not free it at the call). Taken back at once, it went to a later allocation
// that the graph's launch then overwrote.
void captured_free_async() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  char* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&managed), 4096));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMemsetAsync(managed, 0x33, 4096, stream));
  CHECK_CUDA(cudaFreeAsync(managed, stream));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, managed));
  CHECK_MSG(attributes.type == cudaMemoryTypeManaged,
            "a buffer the graph still frees was called freed: type " +
                std::to_string(static_cast<int>(attributes.type)));
  std::vector<char*> later;
  for (int i = 0; i < 64; ++i) {
    char* buffer = nullptr;
    CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&buffer), 4096));
    CHECK_MSG(buffer != managed, "the captured buffer was handed out again");
    std::memset(buffer, 0x11, 4096);
    later.push_back(buffer);
  }
  preload_test::launch_once(graph, stream);  // and destroys it
  for (char* buffer : later) {
    CHECK_MSG(buffer[0] == 0x11, "the graph's launch wrote into a later allocation");
    CHECK_CUDA(cudaFree(buffer));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

// A cudaFreeAsync of a managed buffer on a stream that does not capture, while this thread
// holds a global capture on another: no unsafe call (plain CUDA serves it and the capture stays
// valid), so the memory goes back. Kept for good, 4 MiB a round ran the device out of memory
// (the budget is 256 MiB) by the 64th round.
void free_async_beside_global_capture() {
  cudaStream_t freeing = nullptr;
  cudaStream_t capturing = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&freeing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  void* captured = nullptr;
  CHECK_CUDA(cudaMalloc(&captured, 4096));
  constexpr std::size_t kRound = 4 * kMiB;
  for (int round = 0; round < 100; ++round) {
    void* buffer = nullptr;
    const cudaError_t got = cudaMallocManaged(&buffer, kRound);
    CHECK_MSG(got == cudaSuccess, "round " + std::to_string(round) + ": " +
                                      preload_test::error_text(got));
    CHECK_CUDA(cudaMemsetAsync(buffer, 1, kRound, freeing));
    CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal));
    CHECK_CUDA(cudaMemsetAsync(captured, 1, 4096, capturing));
    CHECK_CUDA(cudaFreeAsync(buffer, freeing));
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamSynchronize(freeing));
  }
  CHECK_CUDA(cudaFree(captured));
  CHECK_CUDA(cudaStreamDestroy(freeing));
  CHECK_CUDA(cudaStreamDestroy(capturing));
}

int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  if (name == "other-thread") freed_memory_comes_back(true);
  if (name == "own-relaxed") freed_memory_comes_back(false);
  if (name == "global-malloc") managed_in_global_capture();
  if (name == "captured-free-async") captured_free_async();
  if (name == "free-async-beside-global") free_async_beside_global_capture();
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  preload_test::run_cases_in_children(
      {"other-thread", "own-relaxed", "global-malloc", "captured-free-async",
       "free-async-beside-global"});
  std::printf("ok\n");
  return 0;
}
