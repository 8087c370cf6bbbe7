// Preload test: cudaPointerGetAttributes on pooled device memory answers as the plain call does.
// A live allocation, at its start or inside, is device memory of its device; memory the program
// freed is unknown to the runtime (cudaMemoryTypeUnregistered), though the pools keep its page
// allocated; and so is pooled memory never handed out, an allocation's padding included. A page the pools gave back, whose driver
// free waits for a kernel still running (stand-in only), is freed memory too: its pointers are
// unknown to the runtime, cudaIpcGetMemHandle of them fails with cudaErrorInvalidValue, and a
// second free of a pointer at its start is a double free.
#include <unistd.h>

#include <cstdio>

#include "check.h"

namespace {

cudaMemoryType type_of(const void* ptr) {
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, ptr));
  return attributes.type;
}

// Longer than a host function waits for the pages it gives back (1 s).
void run_long(void*) { ::usleep(1300 * 1000); }
void nothing(void*) {}

// Freed pages on their way back to the driver, behind a kernel on another stream: a slice alone
// in its page, and a page of its own whose second free races the driver's free of the page (the
// program's free must not overtake it: it once did in a fifth of the runs, and freed the page
// itself). Rounds, since the race is the scheduler's.
void pages_on_their_way_back() {
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  if (launch == nullptr) return;  // a GPU: no kernel of the test's own
  cudaStream_t other = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  void* busy = nullptr;
  CHECK_CUDA(cudaMalloc(&busy, 4 << 20));
  // A slice alone in its page.
  void* slice = nullptr;
  CHECK_CUDA(cudaMalloc(&slice, 1000));
  CHECK_CUDA(cudaFree(slice));
  CHECK(launch(other, busy, 4 << 20, 1, run_long, nullptr) == 0);
  // Before a host function the library gives its idle pages back; their driver frees wait for
  // the kernel.
  CHECK_CUDA(cudaLaunchHostFunc(nullptr, nothing, nullptr));
  CHECK(type_of(slice) == cudaMemoryTypeUnregistered);
  CHECK(type_of(static_cast<char*>(slice) + 512) == cudaMemoryTypeUnregistered);
  cudaIpcMemHandle_t handle{};
  CHECK(cudaIpcGetMemHandle(&handle, slice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK(type_of(slice) == cudaMemoryTypeUnregistered);
  // A page of its own, the only one given back, freed again while its driver free waits.
  for (int round = 0; round < 5; ++round) {
    void* page = nullptr;
    CHECK_CUDA(cudaMalloc(&page, 100 << 20));
    CHECK_CUDA(cudaFree(page));
    CHECK(launch(other, busy, 4 << 20, 1, run_long, nullptr) == 0);
    CHECK_CUDA(cudaLaunchHostFunc(nullptr, nothing, nullptr));
    CHECK(cudaFree(page) == cudaErrorInvalidValue);  // a double free, as the plain run's
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
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
  // An allocation's padding is not the program's: 1000 bytes take a slice of 1024 in a shared
  // page, and 3,000,000 a page of 3 MiB of their own.
  for (const std::size_t size : {std::size_t{1000}, std::size_t{3000000}}) {
    void* padded = nullptr;
    CHECK_CUDA(cudaMalloc(&padded, size));
    char* p = static_cast<char*>(padded);
    CHECK(type_of(p + size - 1) == cudaMemoryTypeDevice);
    CHECK(type_of(p + size) == cudaMemoryTypeUnregistered);
    CHECK(type_of(p + size + 23) == cudaMemoryTypeUnregistered);
    CHECK_CUDA(cudaFree(padded));
  }
  CHECK_CUDA(cudaGetLastError());
  pages_on_their_way_back();
  std::printf("ok\n");
  return 0;
}
