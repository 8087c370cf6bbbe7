// Preload test 2: memory the pools did not hand out (cudaMallocAsync, cudaMallocPitch) freed
// with cudaFree reaches the real cudaFree, and so does cudaFree(NULL); a pooled pointer does not.
#include "check.h"

namespace {

// Real cudaFree calls made by `action` (on the stand-in), or 1 on a GPU where they cannot be
// counted (the result code was already checked).
template <typename Action>
std::uint64_t real_frees(Action action) {
  if (!preload_test::on_stand_in()) {
    action();
    return 1;
  }
  std::uint64_t before = preload_test::counter("cudaFree");
  action();
  return preload_test::counter("cudaFree") - before;
}

}  // namespace

int main() {
  preload_test::require_preloaded();

  CHECK(real_frees([] { CHECK_CUDA(cudaFree(nullptr)); }) == 1);

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  void* async_ptr = nullptr;
  CHECK_CUDA(cudaMallocAsync(&async_ptr, 1 << 16, stream));
  CHECK_CUDA(cudaMemsetAsync(async_ptr, 0x5a, 1 << 16, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(preload_test::device_bytes_equal(async_ptr, 1 << 16, 0x5a));
  CHECK(real_frees([&] { CHECK_CUDA(cudaFree(async_ptr)); }) == 1);

  void* pitched = nullptr;
  std::size_t pitch = 0;
  CHECK_CUDA(cudaMallocPitch(&pitched, &pitch, 1000, 37));
  CHECK(pitch >= 1000);
  CHECK_CUDA(cudaMemset(pitched, 0x33, pitch * 37));
  CHECK(real_frees([&] { CHECK_CUDA(cudaFree(pitched)); }) == 1);

  // A pooled pointer is kept by the pools: no real free.
  void* pooled = nullptr;
  CHECK_CUDA(cudaMalloc(&pooled, 4096));
  std::uint64_t pooled_frees = real_frees([&] { CHECK_CUDA(cudaFree(pooled)); });
  if (preload_test::on_stand_in()) CHECK(pooled_frees == 0);

  // Mixed: a pooled allocation alive around a foreign free is not disturbed.
  CHECK_CUDA(cudaMalloc(&pooled, 8192));
  CHECK_CUDA(cudaMemset(pooled, 0x77, 8192));
  CHECK_CUDA(cudaMallocAsync(&async_ptr, 8192, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(async_ptr));
  CHECK(preload_test::device_bytes_equal(pooled, 8192, 0x77));
  CHECK_CUDA(cudaFree(pooled));

  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
