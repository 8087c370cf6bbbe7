// Preload test: a capped pool never refuses memory the program already freed. Under
// pools:[sliced(page=1M,slice=1M,cap=2M)] (four 512 KiB slices at most), a loop that keeps one
// buffer live and frees the previous one after writing the new one on a stream must succeed
// every time: freed slices wait for their free fence, and at the cap the pool reclaims them
// (reaping, or waiting briefly for, their fences) before it refuses. A request the cap really
// cannot hold (a fifth live slice) is refused with cudaErrorMemoryAllocation, and the log says
// that it refuses (no later pool accepts the size), not that it spills.
#include <string>

#include "check.h"

namespace {

int loop_child() {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* previous = nullptr;
  int failed = 0;
  for (int i = 0; i < 1000; ++i) {
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, 512 << 10) != cudaSuccess) {
      ++failed;
      cudaGetLastError();
      continue;
    }
    CHECK_CUDA(cudaMemsetAsync(ptr, i, 4096, stream));
    if (previous != nullptr) CHECK_CUDA(cudaFree(previous));
    previous = ptr;
  }
  CHECK_MSG(failed == 0, std::to_string(failed) + " of 1000 allocations refused");
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(previous));
  CHECK_CUDA(cudaDeviceSynchronize());

  // Four live slices fill the cap; a fifth is refused.
  void* live[4];
  for (void*& ptr : live) CHECK_CUDA(cudaMalloc(&ptr, 512 << 10));
  void* fifth = live[0];  // the refusal sets it as the plain one does (the stand-in: to NULL)
  CHECK_RESULT(cudaMalloc(&fifth, 512 << 10), cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK(fifth == preload_test::pointer_after_refusal(live[0]));
  for (void* ptr : live) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "child") return loop_child();
  const preload_test::ChildResult child =
      preload_test::run_self("child", {"POOLCUDA_CONF=pools:[sliced(page=1M,slice=1M,cap=2M)]"});
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "child exited with " + std::to_string(child.status));
  CHECK(child.output.find("refusing: no later pool accepts this size") != std::string::npos);
  CHECK(child.output.find("spilling") == std::string::npos);
  return 0;
}
