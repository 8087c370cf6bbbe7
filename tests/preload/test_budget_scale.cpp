// Preload test: under a budget the pools size themselves from the budget, not from the device
// (CudaDevice::memory_info). With limit:256M on the stand-in's 16 GiB device, four 60 MiB
// buffers are allocated and freed, then eight of 31 MiB must all succeed, as on a 256 MiB device.
// Before, the padding allowed to a request was a share of the 16 GiB device: each 31 MiB
// request took an idle 60 MiB page whole, and the fifth was refused with 124 MiB live.
#include <string>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  constexpr std::size_t kMiB = 1 << 20;
  void* big[4];
  for (void*& ptr : big) CHECK_CUDA(cudaMalloc(&ptr, 60 * kMiB));
  for (void* ptr : big) CHECK_CUDA(cudaFree(ptr));
  void* small[8];
  for (int i = 0; i < 8; ++i) {
    CHECK_MSG(cudaMalloc(&small[i], 31 * kMiB) == cudaSuccess,
              "31 MiB allocation " + std::to_string(i + 1) + " of 8 refused");
  }
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  CHECK(total == 256 * kMiB);
  for (void* ptr : small) CHECK_CUDA(cudaFree(ptr));
  std::printf("ok\n");
  return 0;
}
