// Preload test: the library's own CUDA calls leave the thread's driver context as they found it
// (Note [Own calls] in interpose/own_call.h). They switch devices with cudaSetDevice, which
// binds a primary context, and every runtime call binds one on a thread that has none; the
// program's own context (cuCtxCreate) used to be replaced by a primary one, and a thread with
// no context got one, so its later driver calls ran where plain CUDA would have used its own
// context or refused them. Each case runs in a child of its own, on two devices: device 0's
// pooled memory and streams are used while a context of the program's own on device 1 is
// current (a free, a stream-ordered free, stream destroys, a host function), or from a thread
// with no context at all (a driver host function and a stream destroy, with idle pool memory
// to give back); afterwards the thread's context is the one it had.
#include <cuda.h>

#include <string>
#include <thread>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

void CUDART_CB nothing(void*) {}

CUcontext current_context() {
  CUcontext current = nullptr;
  CHECK_CU(cuCtxGetCurrent(&current));
  return current;
}

// Device 0's pooled buffer, idle pool memory and a stream, and a context of the program's own
// on device 1 made current.
void own_context_case(const std::string& name) {
  CHECK_CUDA(cudaSetDevice(0));
  void* idle = nullptr;
  CHECK_CUDA(cudaMalloc(&idle, 3 << 20));
  CHECK_CUDA(cudaFree(idle));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, 1000));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, 1));
  CHECK(current_context() == own);
  if (name == "free") CHECK_CUDA(cudaFree(buffer));
  if (name == "driver-free") CHECK_CU(cuMemFree(reinterpret_cast<CUdeviceptr>(buffer)));
  if (name == "free-async") CHECK_CUDA(cudaFreeAsync(buffer, stream));
  if (name == "stream-destroy") CHECK_CUDA(cudaStreamDestroy(stream));
  if (name == "driver-stream-destroy") CHECK_CU(cuStreamDestroy(reinterpret_cast<CUstream>(stream)));
  if (name == "host-function") CHECK_CUDA(cudaLaunchHostFunc(stream, nothing, nullptr));
  CHECK_MSG(current_context() == own, name + ": the program's own context is no longer current");
  CHECK_CU(cuCtxDestroy(own));
}

// A thread with no context calls a driver function on device 0's stream while the pools hold
// idle memory (a host function gives it back first).
void no_context_case(const std::string& name) {
  CHECK_CUDA(cudaSetDevice(0));
  void* idle = nullptr;
  CHECK_CUDA(cudaMalloc(&idle, 3 << 20));
  CHECK_CUDA(cudaFree(idle));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  std::thread contextless([&] {
    CHECK(current_context() == nullptr);
    if (name == "no-context-host-function")
      (void)cuLaunchHostFunc(reinterpret_cast<CUstream>(stream), nothing, nullptr);
    if (name == "no-context-stream-destroy")
      (void)cuStreamDestroy(reinterpret_cast<CUstream>(stream));
    CHECK_MSG(current_context() == nullptr, name + ": the thread got a context");
  });
  contextless.join();
  CHECK_CUDA(cudaDeviceSynchronize());
}

int run_case(const std::string& name) {
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) preload_test::skip("needs two devices");
  if (name.rfind("no-context", 0) == 0) {
    no_context_case(name);
  } else {
    own_context_case(name);
  }
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  preload_test::run_cases_in_children({"free", "driver-free", "free-async", "stream-destroy",
                                       "driver-stream-destroy", "host-function",
                                       "no-context-host-function", "no-context-stream-destroy"});
  std::printf("ok\n");
  return 0;
}
