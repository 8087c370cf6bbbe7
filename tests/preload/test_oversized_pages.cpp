// Preload test: a free page far larger than a request never serves it. After a scratch buffer
// of half the device is freed, 120 requests of 1/160 of the device each (three quarters of it
// in all) must all succeed as they do without the library: none may take the idle scratch page
// (almost all of it padding, and each next request would then need a page of its own on a
// full device), and the idle page goes back to the driver when the device fills. Then, with
// two quarters of the device live, a 3 MiB request takes a few MiB, not a page sized after
// what came before it.
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));

  void* scratch = nullptr;
  CHECK_CUDA(cudaMalloc(&scratch, free_bytes / 2));
  CHECK_CUDA(cudaFree(scratch));
  CHECK_CUDA(cudaDeviceSynchronize());

  const std::size_t piece = free_bytes / 160;
  std::vector<void*> pieces;
  for (int i = 0; i < 120; ++i) {
    void* ptr = nullptr;
    const cudaError_t result = cudaMalloc(&ptr, piece);
    CHECK_MSG(result == cudaSuccess, "request " + std::to_string(i) + " of 120 failed: " +
                                         preload_test::error_text(result));
    pieces.push_back(ptr);
  }
  CHECK_CUDA(cudaMemset(pieces.back(), 9, 4096));
  CHECK(preload_test::device_bytes_equal(pieces.back(), 4096, 9));
  for (void* ptr : pieces) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaDeviceSynchronize());

  void* quarter_a = nullptr;
  void* quarter_b = nullptr;
  CHECK_CUDA(cudaMalloc(&quarter_a, free_bytes / 4));
  CHECK_CUDA(cudaMalloc(&quarter_b, free_bytes / 4));
  std::size_t before = 0, after = 0;
  CHECK_CUDA(cudaMemGetInfo(&before, &total));
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 3 << 20));
  CHECK_CUDA(cudaMemGetInfo(&after, &total));
  CHECK_MSG(before - after <= (8u << 20),
            "a 3 MiB request took " + std::to_string((before - after) >> 20) + " MiB");
  CHECK_CUDA(cudaFree(small));
  CHECK_CUDA(cudaFree(quarter_a));
  CHECK_CUDA(cudaFree(quarter_b));
  std::printf("ok\n");
  return 0;
}
