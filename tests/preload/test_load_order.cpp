// Preload test 14: a library whose constructor allocates device memory runs before
// libpoolcuda.so's constructor (the loader initialises the program's libraries first). The
// manager that first call creates must already follow POOLCUDA_CONF. Run with free_fence:none:
// then the freed 4 KiB slice is free at once, and the program's next 4 KiB allocation gets the
// same address; under the default free fences it would still be pending and the next
// allocation would get another address.
#include "check.h"

extern "C" {
extern void* early_alloc_address;
extern int early_alloc_error;
}

int main() {
  preload_test::require_preloaded();
  CHECK_MSG(early_alloc_error == 0, "the library's constructor: " +
                                        preload_test::error_text(
                                            static_cast<cudaError_t>(early_alloc_error)));
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 4096));
  CHECK_MSG(ptr == early_alloc_address, "the first manager ignored POOLCUDA_CONF");
  CHECK_CUDA(cudaFree(ptr));
  std::printf("ok\n");
  return 0;
}
