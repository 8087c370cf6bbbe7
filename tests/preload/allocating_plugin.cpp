// A plugin for test_dlopen_allocating: a global device buffer, allocated by its constructor
// (which runs while dlopen holds the dynamic loader's lock) and freed by its destructor.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace {

struct GlobalBuffer {
  void* ptr = nullptr;
  GlobalBuffer() {
    if (cudaMalloc(&ptr, 4096) != cudaSuccess) {
      std::fprintf(stderr, "plugin: cudaMalloc in the constructor failed\n");
      std::abort();
    }
  }
  ~GlobalBuffer() {
    if (cudaFree(ptr) != cudaSuccess) {
      std::fprintf(stderr, "plugin: cudaFree in the destructor failed\n");
      std::abort();
    }
  }
} g_buffer;

}  // namespace
