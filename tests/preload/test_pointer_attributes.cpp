// Preload test: cudaPointerGetAttributes on pooled device memory answers as the plain call does.
// A live allocation, at its start or inside, is device memory of its device; memory the program
// freed is unknown to the runtime (cudaMemoryTypeUnregistered), though the pools keep its page
// allocated; and so is pooled memory never handed out. A page the pools gave back, whose driver
// free waits for a kernel still running (stand-in only), is freed memory too: its pointers are
// unknown to the runtime, and cudaIpcGetMemHandle of them fails with cudaErrorInvalidValue.
#include <unistd.h>

#include <cstdio>

#include "check.h"

namespace {

cudaMemoryType type_of(const void* ptr) {
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, ptr));
  return attributes.type;
}

void run_three_seconds(void*) { ::sleep(3); }
void nothing(void*) {}

// A freed page on its way back to the driver, behind a kernel on another stream longer than a
// host function waits for the pages it gives back (1 s).
void page_on_its_way_back() {
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  if (launch == nullptr) return;  // a GPU: no kernel of the test's own
  cudaStream_t other = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  void* busy = nullptr;
  CHECK_CUDA(cudaMalloc(&busy, 4 << 20));
  void* freed = nullptr;
  CHECK_CUDA(cudaMalloc(&freed, 1000));  // alone in its page
  CHECK_CUDA(cudaFree(freed));
  CHECK(launch(other, busy, 4 << 20, 1, run_three_seconds, nullptr) == 0);
  // Before a host function the library gives its idle pages back (they may wait for the kernel).
  CHECK_CUDA(cudaLaunchHostFunc(nullptr, nothing, nullptr));
  CHECK(type_of(freed) == cudaMemoryTypeUnregistered);
  CHECK(type_of(static_cast<char*>(freed) + 512) == cudaMemoryTypeUnregistered);
  cudaIpcMemHandle_t handle{};
  CHECK(cudaIpcGetMemHandle(&handle, freed) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(type_of(freed) == cudaMemoryTypeUnregistered);
  CHECK_CUDA(cudaFree(busy));
  CHECK_CUDA(cudaStreamDestroy(other));
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  void* first = nullptr;
  void* second = nullptr;
  CHECK_CUDA(cudaMalloc(&first, 1024));
  CHECK_CUDA(cudaMalloc(&second, 1024));
  char* a = static_cast<char*>(first);
  char* b = static_cast<char*>(second);
  CHECK(type_of(a) == cudaMemoryTypeDevice);
  CHECK(type_of(b + 1000) == cudaMemoryTypeDevice);
  char* lower = a < b ? a : b;
  char* upper = a < b ? b : a;
  CHECK_CUDA(cudaFree(lower));  // its page stays: `upper` lives in it
  CHECK(type_of(lower) == cudaMemoryTypeUnregistered);
  CHECK(type_of(lower + 512) == cudaMemoryTypeUnregistered);
  CHECK(type_of(upper) == cudaMemoryTypeDevice);
  // Memory the pools never handed out: far below the page's end, past `upper`.
  CHECK(type_of(upper + (64 << 10)) == cudaMemoryTypeUnregistered);
  CHECK_CUDA(cudaFree(upper));
  CHECK(type_of(upper) == cudaMemoryTypeUnregistered);
  CHECK_CUDA(cudaGetLastError());
  page_on_its_way_back();
  std::printf("ok\n");
  return 0;
}
