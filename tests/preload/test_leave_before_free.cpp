// Preload test: a device that leaves stream-ordered reuse before any free makes no stream wait
// (Note [Leaving before any free] in interpose/stream_order.cpp). A kernel that runs until the
// host releases it is on the legacy stream when the program, which has only allocated, creates
// a non-blocking stream: the new stream is idle at once, as under plain CUDA; it used to wait
// for the kernel, and a program that fed the kernel from it hung. The stand-in's kernel runs a
// host function (simcuda_access_kernel); elsewhere the test skips.
#include <dlfcn.h>

#include <chrono>
#include <thread>

#include "../simcuda/simcuda.h"
#include "check.h"

int main() {
  preload_test::require_preloaded();
  const void* kernel = ::dlsym(RTLD_DEFAULT, "simcuda_access_kernel");
  if (kernel == nullptr) preload_test::skip("needs the stand-in's kernel that runs a function");
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, 4096));
  preload_test::Gate gate;
  simcuda_access access{buffer, 256, 1, preload_test::wait_at_gate, &gate};
  void* args[] = {&access};
  CHECK_CUDA(cudaLaunchKernel(kernel, dim3(1), dim3(1), args, 0, nullptr));
  while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cudaError_t idle = cudaStreamQuery(stream);
  gate.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(idle == cudaSuccess, std::string("the new stream waited for the kernel: ") +
                                     cudaGetErrorName(idle));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(buffer));
  std::printf("ok\n");
  return 0;
}
