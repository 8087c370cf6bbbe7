// Preload test: cudaFreeAsync of pooled memory returns it to its pool. The real cudaFreeAsync
// knows nothing of pooled pointers: it would free a whole page the pool still hands out (3 MiB
// requests get pages of their own) or refuse a slice inside a page. Under the library the
// pointer goes back to its pool, fenced like a cudaFree, and every later allocation is usable
// with its data intact; a second cudaFreeAsync of it is refused and changes nothing; memory
// from cudaMallocAsync still goes to the real call. A stream-ordered free waits for its own
// stream only: with another stream parked on a host function, memory freed on a running stream
// (or the legacy one) serves an allocation that needs it, as in the plain run. Run on a 1 GiB
// device.
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Pages of their own (3 MiB) and slices of a shared page (4 KiB), freed on the stream.
  for (int round = 0; round < 400; ++round) {
    void* page = nullptr;
    void* slice = nullptr;
    CHECK_CUDA(cudaMalloc(&page, 3 << 20));
    CHECK_CUDA(cudaMalloc(&slice, 4096));
    CHECK_CUDA(cudaMemsetAsync(page, round, 4096, stream));
    CHECK_CUDA(cudaMemsetAsync(slice, round, 4096, stream));
    CHECK_CUDA(cudaFreeAsync(page, stream));
    CHECK_CUDA(cudaFreeAsync(slice, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));

  // Every later allocation is real, usable memory that keeps its own bytes.
  std::vector<void*> kept;
  for (int i = 0; i < 200; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, i % 2 == 0 ? (3 << 20) : 4096));
    CHECK_CUDA(cudaMemset(ptr, i, 4096));
    kept.push_back(ptr);
  }
  for (int i = 0; i < 200; ++i)
    CHECK_MSG(preload_test::device_bytes_equal(kept[i], 4096, static_cast<unsigned char>(i)),
              "allocation " + std::to_string(i) + " lost its bytes");

  // A second free of the same pointer is refused and changes nothing.
  void* twice = kept.back();
  kept.pop_back();
  CHECK_CUDA(cudaFreeAsync(twice, stream));
  CHECK_RESULT(cudaFreeAsync(twice, stream), cudaErrorInvalidValue);
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidValue);
  for (std::size_t i = 0; i < kept.size(); ++i)
    CHECK(preload_test::device_bytes_equal(kept[i], 4096, static_cast<unsigned char>(i)));
  for (void* ptr : kept) CHECK_CUDA(cudaFreeAsync(ptr, stream));

  // Another stream parked: 600 MiB freed on `stream`, then on the legacy stream, must serve the
  // next 600 MiB each time (the device holds 1 GiB), while the park lasts.
  cudaStream_t parked = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  preload_test::Gate gate;
  gate.limit_seconds = 60;
  preload_test::park(parked, gate);
  constexpr std::size_t kBig = std::size_t{600} << 20;
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, kBig));
  for (cudaStream_t on : {stream, cudaStream_t{nullptr}}) {
    CHECK_CUDA(cudaMemsetAsync(big, 7, kBig, on));
    CHECK_CUDA(cudaFreeAsync(big, on));
    CHECK_CUDA(cudaStreamSynchronize(on));
    CHECK_CUDA(cudaMalloc(&big, kBig));
    CHECK_MSG(cudaStreamQuery(parked) == cudaErrorNotReady,
              "the allocation waited for the parked stream");
  }
  gate.open.store(true);
  CHECK_CUDA(cudaMemsetAsync(big, 9, kBig, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(big));
  CHECK_CUDA(cudaStreamSynchronize(parked));
  CHECK_CUDA(cudaStreamDestroy(parked));

  // Stream-ordered memory is the runtime's own: its free goes to the real call.
  void* async = nullptr;
  CHECK_CUDA(cudaMallocAsync(&async, 1 << 20, stream));
  CHECK_CUDA(cudaMemsetAsync(async, 3, 1 << 20, stream));
  CHECK_CUDA(cudaFreeAsync(async, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
