// A GPU check (scripts/gpu-check): a program built with plain nvcc, so with nvcc's default
// static runtime, whose cudaMalloc no LD_PRELOAD can interpose: only the library's driver-level
// hooks see its allocations. A real kernel writes every buffer it allocates, the host checks
// every byte, and the buffers are freed again, 1,000 times over a few sizes, on the legacy
// stream and on a non-blocking stream of the program's own (freed memory may be reused only
// once that stream has passed the free). Prints "allocations: N" and "ok". Run under the
// library with an exit report, the report must show the allocations pooled.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__global__ void fill(unsigned* data, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = seed * 2654435761u + static_cast<unsigned>(i);
  }
}

int main() {
  constexpr int kRounds = 1000;
  CHECK(cudaFree(nullptr));
  cudaStream_t side = nullptr;
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::vector<unsigned> host;
  int allocations = 0;
  for (int round = 0; round < kRounds; ++round) {
    const size_t n = size_t{1024} << (round % 6);  // 4 KiB .. 128 KiB
    cudaStream_t stream = round % 2 ? side : nullptr;
    unsigned* data = nullptr;
    CHECK(cudaMalloc(&data, n * sizeof(unsigned)));
    ++allocations;
    fill<<<32, 128, 0, stream>>>(data, n, static_cast<unsigned>(round));
    CHECK(cudaGetLastError());
    host.assign(n, 0);
    CHECK(cudaMemcpyAsync(host.data(), data, n * sizeof(unsigned), cudaMemcpyDeviceToHost,
                          stream));
    CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < n; ++i) {
      if (host[i] != static_cast<unsigned>(round) * 2654435761u + static_cast<unsigned>(i)) {
        std::fprintf(stderr, "round %d: element %zu is %u\n", round, i, host[i]);
        return 1;
      }
    }
    CHECK(cudaFree(data));
  }
  CHECK(cudaStreamDestroy(side));
  std::printf("allocations: %d\nok\n", allocations);
  return 0;
}
