// Preload test: stream-ordered frees through the driver and on invalidated captures.
//  - cuMemFreeAsync of pooled memory returns it to its pool, as cudaFreeAsync does. The real call
//    knows only the pools' pages: it would free a whole page under the other allocations still
//    in it, or refuse a slice inside one. Neighbours keep their bytes, later allocations are
//    usable, a second free is refused with CUDA_ERROR_INVALID_VALUE, and the per-thread variant
//    the driver's resolver hands out does the same.
//  - On a stream whose capture an earlier call invalidated, cudaFreeAsync and cuMemFreeAsync of
//    pooled memory fail as the plain calls do (the runtime's error left in the last-error slot)
//    and free nothing: the memory is still the program's, and freeing it afterwards succeeds.
// Runs on a GPU too (no stand-in check).
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

void* as_pointer(CUdeviceptr d) { return reinterpret_cast<void*>(d); }

using FreeAsyncFn = CUresult (*)(CUdeviceptr, CUstream);

// Four 512 KiB allocations share one pooled page; the one at its start is freed first.
void free_beside_live_neighbours(FreeAsyncFn free_async, CUstream stream, int round) {
  constexpr std::size_t kSize = 512 << 10;
  CUdeviceptr parts[4] = {};
  for (int i = 0; i < 4; ++i) {
    CHECK_CU(cuMemAlloc_v2(&parts[i], kSize));
    CHECK_CU(cuMemsetD8_v2(parts[i], static_cast<unsigned char>(round + i), kSize));
  }
  const int lowest = static_cast<int>(std::min_element(parts, parts + 4) - parts);
  CHECK_CU(free_async(parts[lowest], stream));
  CHECK_CU(cuStreamSynchronize(stream));
  for (int i = 0; i < 4; ++i) {
    if (i == lowest) continue;
    CHECK_MSG(preload_test::device_bytes_equal(as_pointer(parts[i]), kSize,
                                               static_cast<unsigned char>(round + i)),
              "an allocation beside the freed one lost its bytes");
    CHECK_CU(free_async(parts[i], stream));
  }
  CUdeviceptr own_page = 0;  // 3 MiB: a page of its own
  CHECK_CU(cuMemAlloc_v2(&own_page, 3 << 20));
  CHECK_CU(cuMemsetD8_v2(own_page, 1, 3 << 20));
  CHECK_CU(free_async(own_page, stream));
  CHECK_CU(cuStreamSynchronize(stream));
}

void driver_frees(CUstream stream) {
  for (int round = 0; round < 100; ++round) free_beside_live_neighbours(&cuMemFreeAsync, stream, round);

  void* resolved = nullptr;
  CUdriverProcAddressQueryResult status{};
  CHECK_CU(cuGetProcAddress_v2("cuMemFreeAsync", &resolved, 12000,
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  CHECK(resolved != nullptr);
  for (int round = 0; round < 20; ++round)
    free_beside_live_neighbours(reinterpret_cast<FreeAsyncFn>(resolved), stream, round);

  // Every later allocation is usable memory that keeps its own bytes.
  std::vector<CUdeviceptr> kept(64);
  for (std::size_t i = 0; i < kept.size(); ++i) {
    CHECK_CU(cuMemAlloc_v2(&kept[i], i % 2 == 0 ? (3 << 20) : (512 << 10)));
    CHECK_CU(cuMemsetD8_v2(kept[i], static_cast<unsigned char>(i), 4096));
  }
  for (std::size_t i = 0; i < kept.size(); ++i)
    CHECK(preload_test::device_bytes_equal(as_pointer(kept[i]), 4096,
                                           static_cast<unsigned char>(i)));

  // A second free of the same pointer is refused and changes nothing.
  CHECK_CU(cuMemFreeAsync(kept.back(), stream));
  CHECK(cuMemFreeAsync(kept.back(), stream) == CUDA_ERROR_INVALID_VALUE);
  kept.pop_back();
  for (std::size_t i = 0; i < kept.size(); ++i) {
    CHECK(preload_test::device_bytes_equal(as_pointer(kept[i]), 4096,
                                           static_cast<unsigned char>(i)));
    CHECK_CU(cuMemFreeAsync(kept[i], stream));
  }
  CHECK_CU(cuStreamSynchronize(stream));
}

void frees_on_an_invalidated_capture() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));  // blocking: it synchronizes with the legacy stream
  void* written = nullptr;
  void* runtime_freed = nullptr;
  CUdeviceptr driver_freed = 0;
  CHECK_CUDA(cudaMalloc(&written, 4096));
  CHECK_CUDA(cudaMalloc(&runtime_freed, 4096));
  CHECK_CU(cuMemAlloc_v2(&driver_freed, 4096));

  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemsetAsync(written, 0, 16, stream));
  // Work on the legacy stream, which a blocking capturing stream synchronizes with, invalidates
  // the capture.
  CHECK(cudaMemsetAsync(written, 0, 16, nullptr) != cudaSuccess);
  (void)cudaGetLastError();
  // As the plain call, the free fails and leaves its error in the last-error slot.
  CHECK_RESULT(cudaFreeAsync(runtime_freed, stream), cudaErrorStreamCaptureInvalidated);
  CHECK_RESULT(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  CHECK(cuMemFreeAsync(driver_freed, reinterpret_cast<CUstream>(stream)) ==
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) != cudaSuccess);
  (void)cudaGetLastError();

  // Neither free happened: the memory is the program's to use and free.
  CHECK_CUDA(cudaMemset(runtime_freed, 7, 4096));
  CHECK(preload_test::device_bytes_equal(runtime_freed, 4096, 7));
  CHECK_CUDA(cudaFree(runtime_freed));
  CHECK_CU(cuMemFree_v2(driver_freed));
  CHECK_CUDA(cudaFree(written));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));  // the primary context, current
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  driver_frees(stream);
  CHECK_CU(cuStreamDestroy_v2(stream));
  frees_on_an_invalidated_capture();
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
