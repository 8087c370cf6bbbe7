// Preload test: a request the driver refuses for lack of memory, retried across a stop of the
// whole process (Note [Stopped processes] in pools/wait_bound.h), as a batch scheduler's suspend
// or Ctrl-Z make one. The suite runs it on a 64 MiB stand-in device whose driver free takes 12 s
// before it looks the pointer up (SIMCUDA_FREE_DELAY_US: a free waiting for the device, which
// goes on during a stop). A 40 MiB buffer is allocated and freed, so its page stays idle in the
// pools; a 48 MiB cudaMallocAsync, which the pools do not serve, is then refused by the driver,
// and the pools give their idle page back and wait for it to reach the driver (10 s at most)
// before it is tried again. The process is stopped 1.5 s into that wait for 10 s, in which the
// bound passes; the page reaches the driver 0.5 s after the resume. Plain CUDA serves the
// request (the program's own cudaFree had given the memory back); so must the library, which
// once tried again at the resume, before the page had arrived, and answered
// cudaErrorMemoryAllocation.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>

#include "check.h"
#include "stop_process.h"

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's free delay");
  CHECK_CUDA(cudaFree(nullptr));
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, 40u << 20));
  CHECK_CUDA(cudaFree(first));
  const pid_t stopper = preload_test::stop_this_process(1500, 10000);
  const auto began = std::chrono::steady_clock::now();
  void* second = nullptr;
  const cudaError_t result = cudaMallocAsync(&second, 48u << 20, cudaStreamLegacy);
  const auto took = std::chrono::steady_clock::now() - began;
  int status = 0;
  CHECK_MSG(waitpid(stopper, &status, 0) == stopper, "waitpid failed");
  CHECK_MSG(took > std::chrono::seconds(10), "the process was not stopped during the request");
  CHECK_MSG(result == cudaSuccess, "a request the device had room for after a stop of the "
                                   "process failed: " + preload_test::error_text(result));
  CHECK_CUDA(cudaFreeAsync(second, cudaStreamLegacy));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  std::printf("a refused cudaMallocAsync retried across a stop of the process: served\n");
  return 0;
}
