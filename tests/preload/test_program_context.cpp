// Preload test: the runtime's allocations while a context of the program's own (cuCtxCreate) is
// current are the driver's, not the pools' (Note [Contexts of the program's] in
// interpose/driver_context.cpp), as PyCUDA programs whose cuBLAS allocates in PyCUDA's context
// need: each cudaMalloc and cudaMallocManaged there is one real allocation (they used to get
// slices of the primary context's pages, or grow a page inside the program's context, which its
// cuCtxDestroy then freed under the pools). A pooled buffer made in the primary context and freed
// while the program's context is current goes back to the pools (a second free is a double free),
// and after cuCtxDestroy the primary context's allocations are pooled again.
#include <cuda.h>

#include <vector>

#include "check.h"

#define CHECK_CU(expr) CHECK((expr) == CUDA_SUCCESS)

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("counts real calls on the stand-in");
  CHECK_CUDA(cudaFree(nullptr));  // the primary context, current
  CUcontext primary = nullptr;
  CHECK_CU(cuCtxGetCurrent(&primary));
  void* pooled = nullptr;
  CHECK_CUDA(cudaMalloc(&pooled, 1000));

  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, 0));
  const std::uint64_t mallocs = preload_test::counter("cudaMalloc");
  const std::uint64_t managed = preload_test::counter("cudaMallocManaged");
  std::vector<void*> theirs(20);
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    if (i % 2 == 0)
      CHECK_CUDA(cudaMalloc(&theirs[i], 1000));
    else
      CHECK_CUDA(cudaMallocManaged(&theirs[i], 1000));
  }
  CHECK_MSG(preload_test::counter("cudaMalloc") - mallocs == 10 &&
                preload_test::counter("cudaMallocManaged") - managed == 10,
            "real allocations in the program's context: " +
                std::to_string(preload_test::counter("cudaMalloc") - mallocs) + " and " +
                std::to_string(preload_test::counter("cudaMallocManaged") - managed));
  for (void* p : theirs) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(pooled));
  CHECK_CU(cuCtxDestroy(own));
  CHECK_CU(cuCtxSetCurrent(primary));
  CHECK_RESULT(cudaFree(pooled), cudaErrorInvalidValue);  // already back in the pools
  const std::uint64_t before = preload_test::counter("cudaMalloc");
  void* again = nullptr;
  CHECK_CUDA(cudaMalloc(&again, 1000));
  CHECK(preload_test::counter("cudaMalloc") == before);  // a slice of a page the pools hold
  CHECK_CUDA(cudaFree(again));
  std::printf("ok\n");
  return 0;
}
