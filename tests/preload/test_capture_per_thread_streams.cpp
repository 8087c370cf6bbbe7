// Preload test: captures on per-thread default streams and invalidated captures, with two
// devices of 256 MiB (meson.build). Each case runs in a child of its own:
//  - thread-exit: a worker begins a capture on its per-thread stream and exits without ending
//    it; its stream, and the capture, go with it (Note [Per-thread captures at thread exit] in
//    interpose/capture_hooks.cpp). The library kept the capture as open: the device's window
//    never closed, every later free was held, and the fourth of 40 allocations of 64 MiB, each
//    freed before the next, ran out of memory.
//  - thread-exit-after-free: the same, twenty times, with a buffer allocated, written and freed
//    inside the capture. Closing the abandoned capture released the buffer and recorded a free
//    fence, which asked whether the exiting thread's per-thread stream was capturing: the
//    stand-in had destroyed that stream already, and the process died of a segmentation fault.
//  - two-devices: one thread captures on its per-thread streams of device 0 and of device 1 at
//    once; device 1's capture is invalidated and ended. CUDA names no id for an invalidated
//    capture, and the library took device 0's for it: device 1's window stayed open (20
//    allocations of 64 MiB there ran out of memory after 4), device 0's closed while its capture
//    went on. A buffer allocated and freed in device 0's capture must not be handed out again
//    while its graph lives.
//  - invalidated-elsewhere: a cudaFreeAsync on a device-1 stream whose capture an earlier call
//    invalidated, with device 0 current: plain CUDA fails it with
//    cudaErrorStreamCaptureInvalidated and frees nothing; the library, looking for captures on
//    the current device only, answered success.
//  - legacy-beside-capture: a stream-ordered free of pooled memory (device or managed) on the
//    legacy stream while a blocking stream captures, by cudaFreeAsync (stream 0 and
//    cudaStreamLegacy) and cuMemFreeAsync: plain CUDA refuses it with
//    cudaErrorStreamCaptureImplicit, invalidates the capture and frees nothing; the library
//    freed it, the capture made a graph, and the program's later cudaFree was refused as a
//    double free (Note [The legacy stream beside a capture] in interpose/hooks.cpp).
#include <cuda.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Allocates and frees 64 MiB `rounds` times on the current device; all must succeed.
void churn(int rounds, const char* where) {
  for (int i = 0; i < rounds; ++i) {
    void* p = nullptr;
    const cudaError_t got = cudaMalloc(&p, 64 * kMiB);
    CHECK_MSG(got == cudaSuccess, std::string(where) + ", round " + std::to_string(i) + ": " +
                                      preload_test::error_text(got));
    CHECK_CUDA(cudaFree(p));
  }
}

void thread_exit() {
  std::thread([] {
    void* x = nullptr;
    CHECK_CUDA(cudaMalloc(&x, 4096));
    CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
    CHECK_CUDA(cudaMemsetAsync(x, 1, 4096, cudaStreamPerThread));
  }).join();
  churn(40, "after the thread's exit");
}

void thread_exit_after_free() {
  for (int round = 0; round < 20; ++round) {
    std::thread([] {
      CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, kMiB));
      CHECK_CUDA(cudaMemsetAsync(p, 1, kMiB, cudaStreamPerThread));
      CHECK_CUDA(cudaFree(p));  // legal in a relaxed capture
      // A pause before the exit: without it the crash showed in no run (timing).
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }).join();
  }
  churn(40, "after the threads' exits");
}

void two_devices() {
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaFree(nullptr));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
  (void)cudaStreamSynchronize(cudaStreamPerThread);  // invalidates device 1's capture
  (void)cudaGetLastError();
  cudaGraph_t failed = nullptr;
  CHECK(cudaStreamEndCapture(cudaStreamPerThread, &failed) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  CHECK_CUDA(cudaSetDevice(0));
  char* captured = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&captured), kMiB));
  CHECK_CUDA(cudaMemsetAsync(captured, 0x5a, kMiB, cudaStreamPerThread));
  CHECK_CUDA(cudaFree(captured));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(cudaStreamPerThread, &graph));
  std::vector<void*> later;
  for (int i = 0; i < 16; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, kMiB));
    CHECK_MSG(p != captured, "a buffer the graph writes was handed out again");
    CHECK_CUDA(cudaMemset(p, 0x22, kMiB));
    later.push_back(p);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  preload_test::launch_once(graph, cudaStreamPerThread);  // and destroys it
  for (void* p : later) {
    CHECK_MSG(preload_test::device_bytes_equal(p, kMiB, 0x22),
              "the graph's launch wrote into a later allocation");
    CHECK_CUDA(cudaFree(p));
  }
  CHECK_CUDA(cudaSetDevice(1));
  churn(20, "device 1");
}

void invalidated_elsewhere() {
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaFree(nullptr));
  CHECK_CUDA(cudaSetDevice(0));
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMemsetAsync(p, 1, 4096, stream));
  (void)cudaStreamSynchronize(stream);  // invalidates the capture
  (void)cudaGetLastError();
  CHECK_CUDA(cudaSetDevice(0));
  const cudaError_t freed = cudaFreeAsync(p, stream);
  const cudaError_t last = cudaGetLastError();
  CHECK_MSG(freed == cudaErrorStreamCaptureInvalidated && last == freed,
            "cudaFreeAsync: " + preload_test::error_text(freed) + ", last error " +
                preload_test::error_text(last));
  CHECK_CUDA(cudaSetDevice(1));
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(p));  // the refused free freed nothing
}

void legacy_beside_capture() {
  using FreeAsyncFn = CUresult (*)(CUdeviceptr, CUstream);
  const auto driver_free_async = preload_test::driver_entry<FreeAsyncFn>("cuMemFreeAsync", 11020);
  cudaStream_t blocking = nullptr;
  CHECK_CUDA(cudaStreamCreate(&blocking));
  for (const char* how : {"stream 0", "cudaStreamLegacy", "cuMemFreeAsync", "managed"}) {
    const std::string name = how;
    void* p = nullptr;
    if (name == "managed") {
      CHECK_CUDA(cudaMallocManaged(&p, 4096));
    } else {
      CHECK_CUDA(cudaMalloc(&p, 4096));
    }
    CHECK_CUDA(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal));
    int freed = 0;
    if (name == "cuMemFreeAsync") {
      freed = driver_free_async(reinterpret_cast<CUdeviceptr>(p), CU_STREAM_LEGACY);
      CHECK_MSG(freed == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, name + ": " + std::to_string(freed));
    } else {
      freed = cudaFreeAsync(p, name == "cudaStreamLegacy" ? cudaStreamLegacy : nullptr);
      const cudaError_t last = cudaGetLastError();
      CHECK_MSG(freed == cudaErrorStreamCaptureImplicit && last == freed,
                name + ": " + preload_test::error_text(static_cast<cudaError_t>(freed)) +
                    ", last error " + preload_test::error_text(last));
    }
    cudaGraph_t graph = nullptr;
    CHECK_MSG(cudaStreamEndCapture(blocking, &graph) == cudaErrorStreamCaptureInvalidated,
              name + ": the capture was not invalidated");
    (void)cudaGetLastError();
    CHECK_MSG(cudaFree(p) == cudaSuccess, name + ": the refused free freed the memory");
  }
  CHECK_CUDA(cudaStreamDestroy(blocking));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string name = argv[1];
    CHECK_CUDA(cudaFree(nullptr));
    if (name == "thread-exit") thread_exit();
    if (name == "thread-exit-after-free") thread_exit_after_free();
    if (name == "two-devices") two_devices();
    if (name == "invalidated-elsewhere") invalidated_elsewhere();
    if (name == "legacy-beside-capture") legacy_beside_capture();
    std::printf("case done\n");
    return 0;
  }
  preload_test::require_preloaded();
  preload_test::require_devices(2);
  preload_test::run_cases_in_children(
      {"thread-exit", "thread-exit-after-free", "two-devices", "invalidated-elsewhere",
       "legacy-beside-capture"});
  std::printf("ok\n");
  return 0;
}
