// Preload test: a stream-ordered free of pooled memory on a stream handle CUDA does not know
// (never created, or destroyed) fails as the plain call does and frees nothing (Note [Stream
// handles] in interpose/hooks.cpp). Through the runtime: cudaErrorInvalidResourceHandle, left in
// the last-error slot; through the driver: CUDA_ERROR_INVALID_HANDLE. Afterwards the memory is
// still the program's: it keeps its bytes, the next allocations of its size get other memory,
// and freeing it the right way succeeds. Covers a slice of a shared page, a page of its own and
// a managed allocation. Runs on a GPU too (no stand-in check).
#include <cuda.h>

#include <vector>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

// Still the program's after the refused free: its bytes are intact, and allocations of its size
// made now, written all over, neither alias it nor change it.
void still_owned(void* ptr, std::size_t size, unsigned char byte) {
  CHECK_MSG(preload_test::device_bytes_equal(ptr, size, byte), "a refused free lost the bytes");
  std::vector<void*> others;
  for (int i = 0; i < 8; ++i) {
    void* other = nullptr;
    CHECK_CUDA(cudaMalloc(&other, size));
    CHECK_MSG(other != ptr, "a refused free handed the memory out again");
    CHECK_CUDA(cudaMemset(other, 0x5A, size));
    others.push_back(other);
  }
  CHECK_MSG(preload_test::device_bytes_equal(ptr, size, byte), "another allocation overwrote it");
  for (void* other : others) CHECK_CUDA(cudaFree(other));
}

void refused_through_runtime(cudaStream_t bad, std::size_t size, unsigned char byte) {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, size));
  CHECK_CUDA(cudaMemset(ptr, byte, size));
  CHECK_RESULT(cudaFreeAsync(ptr, bad), cudaErrorInvalidResourceHandle);
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  still_owned(ptr, size, byte);
  CHECK_CUDA(cudaFree(ptr));
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  const auto never_created = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234});
  cudaStream_t destroyed = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&destroyed, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamDestroy(destroyed));

  for (cudaStream_t bad : {never_created, destroyed}) {
    refused_through_runtime(bad, 4096, 0xAB);     // a slice of a shared page
    refused_through_runtime(bad, 3 << 20, 0xCD);  // a page of its own
  }

  // Managed memory: refused the same way, and still readable from the host.
  void* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&managed, 4096));
  std::memset(managed, 0x3C, 4096);
  CHECK_RESULT(cudaFreeAsync(managed, never_created), cudaErrorInvalidResourceHandle);
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CHECK(static_cast<unsigned char*>(managed)[4095] == 0x3C);
  void* next_managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&next_managed, 4096));
  CHECK_MSG(next_managed != managed, "a refused free handed managed memory out again");
  CHECK_CUDA(cudaFree(next_managed));
  CHECK_CUDA(cudaFree(managed));

  // The driver: CUDA_ERROR_INVALID_HANDLE, and cuMemFree succeeds afterwards.
  CUdeviceptr dptr = 0;
  CHECK_CU(cuMemAlloc_v2(&dptr, 4096));
  CHECK_CU(cuMemsetD8_v2(dptr, 0xEF, 4096));
  CHECK_MSG(cuMemFreeAsync(dptr, reinterpret_cast<CUstream>(never_created)) ==
                CUDA_ERROR_INVALID_HANDLE,
            "cuMemFreeAsync on an unknown stream");
  still_owned(reinterpret_cast<void*>(dptr), 4096, 0xEF);
  CHECK_CU(cuMemFree_v2(dptr));

  std::printf("ok\n");
  return 0;
}
