// A GPU check (scripts/gpu-check): a kernel's first launch, which loads the kernel's module
// (lazy loading, CUDA's default since 12.2), right after the program filled the device with
// cudaMalloc and freed it all. Plain CUDA has the memory back at the frees; under the library
// the pools keep it as idle pages, and the launch must find room anyway: the library gives idle
// memory back to a launch or module load the driver refuses for lack of memory (Note [Launches
// short of memory] in interpose/hooks.cpp). Built twice, with nvcc's default static runtime
// (only the driver hooks see it) and with the shared one. Prints "filled: N MiB" and "ok".
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__global__ void answer(int* out) { *out = 42; }

int main() {
  CHECK(cudaFree(nullptr));
  int* out = nullptr;
  CHECK(cudaMalloc(&out, sizeof(int)));
  // Everything the device gives, largest pieces first.
  std::vector<void*> held;
  size_t filled = 0;
  for (size_t piece = size_t{1} << 30; piece >= (size_t{2} << 20); piece /= 2) {
    for (;;) {
      void* ptr = nullptr;
      if (cudaMalloc(&ptr, piece) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      held.push_back(ptr);
      filled += piece;
    }
  }
  for (void* ptr : held) CHECK(cudaFree(ptr));
  answer<<<1, 1>>>(out);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  int host = 0;
  CHECK(cudaMemcpy(&host, out, sizeof host, cudaMemcpyDeviceToHost));
  if (host != 42) {
    std::fprintf(stderr, "the kernel wrote %d\n", host);
    return 1;
  }
  CHECK(cudaFree(out));
  std::printf("filled: %zu MiB\nok\n", filled >> 20);
  return 0;
}
