// A shared library of the load_order test: its constructor allocates and frees device memory,
// like a library with a global device buffer. The dynamic loader runs it before the constructor
// of a preloaded libpoolcuda.so, so the library's first hook runs before its own constructor.
#include <cuda_runtime_api.h>

extern "C" {

// What the constructor saw: the address it allocated (and freed), and the error if any.
void* early_alloc_address = nullptr;
int early_alloc_error = -1;

__attribute__((constructor)) static void early_alloc() {
  void* ptr = nullptr;
  cudaError_t result = cudaMalloc(&ptr, 4096);
  if (result == cudaSuccess) result = cudaFree(ptr);
  early_alloc_address = ptr;
  early_alloc_error = static_cast<int>(result);
}

}  // extern "C"
