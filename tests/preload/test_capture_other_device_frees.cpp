// Preload test: memory of device 0 freed while a stream capture is open on device 1, whose graph
// writes that memory (peer or managed memory). Plain CUDA refuses a cudaFree there in global
// mode, and in thread-local mode on the capturing thread (cudaErrorStreamCaptureUnsupported),
// and frees nothing; a cudaFreeAsync on the capturing stream becomes a node of the graph, after
// its memset. The library answered each free with success and took the memory back at once, as
// no capture was open on device 0: the next allocation there got the same bytes, and the
// graph's launch wrote over them. Each case runs in a child of its own:
//  - global, thread-local: cudaMalloc memory freed by the capturing thread;
//  - other-thread: freed by another thread (global mode) beside a global capture;
//  - managed: cudaMallocManaged memory freed by the capturing thread, global mode;
//  - free-async: a cudaFreeAsync on the capturing stream (relaxed mode), device 0 current;
//  - managed-free-async: the same with managed memory;
//  - both-devices: as global, with a relaxed capture open on device 0 as well, whose graph is
//    destroyed at once (its window pins the memory only until then).
// After the free, 20,000 allocations and frees of the same size on device 0 must never get the
// freed address, and 64 allocations made then must hold their own bytes after the graph's launch.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kSize = 4096;

struct Case {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  bool managed = false;
  bool other_thread = false;
  bool stream_ordered = false;
  bool own_device_captures = false;  // a capture open on device 0 too, ended before the loop
};

char* allocate_on_device_0(bool managed) {
  CHECK_CUDA(cudaSetDevice(0));
  char* p = nullptr;
  if (managed) {
    CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&p), kSize));
  } else {
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), kSize));
  }
  CHECK_CUDA(cudaMemset(p, 0x11, kSize));
  CHECK_CUDA(cudaDeviceSynchronize());  // lets the fences of earlier frees pass
  return p;
}

void run(const Case& c) {
  char* freed = allocate_on_device_0(c.managed);
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(stream, c.mode));
  CHECK_CUDA(cudaMemsetAsync(freed, 0xee, kSize, stream));
  cudaStream_t own_stream = nullptr;
  if (c.own_device_captures) {
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(own_stream, cudaStreamCaptureModeRelaxed));
    CHECK_CUDA(cudaSetDevice(1));
  }
  cudaError_t answer = cudaSuccess;
  if (c.stream_ordered) {
    CHECK_CUDA(cudaSetDevice(0));  // the memory's device current, the stream device 1's
    answer = cudaFreeAsync(freed, stream);
    CHECK_CUDA(cudaSetDevice(1));
  } else if (c.other_thread) {
    std::thread([&] { answer = cudaFree(freed); }).join();
  } else {
    answer = cudaFree(freed);
  }
  // The library makes the free legal; whatever it answers, the graph's memory must stay put.
  (void)cudaGetLastError();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  (void)cudaGetLastError();
  std::printf("free: %s, end: %s\n", preload_test::error_text(answer).c_str(),
              preload_test::error_text(ended).c_str());
  if (own_stream != nullptr) {  // its graph gone at once: device 0's pins with it
    CHECK_CUDA(cudaSetDevice(0));
    cudaGraph_t own_graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(own_stream, &own_graph));
    CHECK_CUDA(cudaGraphDestroy(own_graph));
    CHECK_CUDA(cudaStreamDestroy(own_stream));
  }
  // Allocations and frees of the same size until the freed address would come round again
  // (a managed slab rewinds only once its fence passed: a synchronize now and then).
  for (int i = 0; i < 20000; ++i) {
    char* buffer = allocate_on_device_0(c.managed);
    CHECK_MSG(buffer != freed, "memory the capture writes was handed out again");
    if (buffer == freed) break;
    CHECK_CUDA(cudaFree(buffer));
  }
  std::vector<char*> later;
  for (int i = 0; i < 64; ++i) {
    char* buffer = allocate_on_device_0(c.managed);
    CHECK_CUDA(cudaMemset(buffer, 0x22, kSize));
    later.push_back(buffer);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  if (graph != nullptr) {
    CHECK_CUDA(cudaSetDevice(1));
    preload_test::launch_once(graph, stream);  // and destroys it
  }
  for (char* buffer : later) {
    CHECK_MSG(preload_test::device_bytes_equal(buffer, kSize, 0x22),
              "the graph's launch wrote into a later allocation");
    CHECK_CUDA(cudaFree(buffer));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  Case c;
  if (name == "thread-local") c.mode = cudaStreamCaptureModeThreadLocal;
  if (name == "other-thread") c.other_thread = true;
  if (name == "both-devices") c.own_device_captures = true;
  if (name == "managed" || name == "managed-free-async") c.managed = true;
  if (name == "free-async" || name == "managed-free-async") {
    c.stream_ordered = true;
    c.mode = cudaStreamCaptureModeRelaxed;
  }
  run(c);
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  preload_test::require_devices(2);
  preload_test::run_cases_in_children({"global", "thread-local", "other-thread", "managed",
                                       "free-async", "managed-free-async", "both-devices"});
  std::printf("ok\n");
  return 0;
}
