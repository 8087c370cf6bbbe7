// Preload test: under a budget (limit:1G in meson.build, on a 4 GiB stand-in device), what the
// runtime allocates in a context of the program's own (cuCtxCreate) is passed to CUDA and
// charged, and must be uncharged when it goes:
//  - destroy: 256 MiB allocated with cudaMalloc there, then the context destroyed, which frees
//    its memory (on a GPU; the stand-in keeps it, hence the larger device): the charge stayed,
//    and cudaMemGetInfo reported 768 MiB of the budget free for good.
//  - free: 20 rounds of a context made, 256 MiB allocated with cudaMalloc there and freed with
//    cuMemFree, the context destroyed: the driver's free never uncharged it, so the fourth round
//    was refused (the budget full of memory freed long ago), and every allocation after it.
#include <cuda.h>

#include <string>

#include "check.h"

#define CHECK_CU(expr) CHECK((expr) == CUDA_SUCCESS)

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Makes a context of the program's, allocates 256 MiB there with the runtime, frees it with the
// driver when `free_it`, destroys the context and makes `primary` current again.
void round_in_own_context(CUcontext primary, bool free_it, int round) {
  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, 0));
  void* p = nullptr;
  const cudaError_t got = cudaMalloc(&p, 256 * kMiB);
  CHECK_MSG(got == cudaSuccess, "round " + std::to_string(round) + ": " +
                                    preload_test::error_text(got));
  if (free_it) CHECK_CU(cuMemFree(reinterpret_cast<CUdeviceptr>(p)));
  CHECK_CU(cuCtxDestroy(own));
  CHECK_CU(cuCtxSetCurrent(primary));
}

void expect_budget_free(const char* when) {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  CHECK_MSG(total == 1024 * kMiB && free_bytes == total,
            std::string(when) + ": " + std::to_string(free_bytes) + " of " +
                std::to_string(total) + " B of the budget free");
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));  // the primary context, current
  CUcontext primary = nullptr;
  CHECK_CU(cuCtxGetCurrent(&primary));
  round_in_own_context(primary, false, 0);
  expect_budget_free("after the destroy");
  for (int round = 1; round <= 20; ++round) round_in_own_context(primary, true, round);
  expect_budget_free("after 20 rounds");
  void* half = nullptr;
  CHECK_CUDA(cudaMalloc(&half, 512 * kMiB));
  CHECK_CUDA(cudaFree(half));
  std::printf("ok\n");
  return 0;
}
