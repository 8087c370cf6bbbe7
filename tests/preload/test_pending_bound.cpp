// Preload test: memory waiting for free fences stays bounded while the host runs far ahead of
// the device (Note [Pending far over the bound] in pools/memory_manager.cpp). On a 256 MiB
// stand-in device, a workspace loop like a math library's: cudaMalloc of 1 to 1.75 MiB, a 5 ms
// kernel that writes it on a non-blocking stream, cudaFree, 300 times. The plain program's
// cudaFree waits for each kernel and holds one workspace; under the library the frees wait for
// fences instead, and the host used to queue kernels faster than the device ran them, each
// workspace a new one, until the pools held the whole device waiting (a request of most of the
// device then waited for seconds of queued kernels, or failed after 10). Now the pools hold at
// most about an eighth of the device waiting (twice the fence bound) before the loop waits for
// the device: the device's peak stays well below its size, and a request of half the device
// right after the loop succeeds.
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kMiB = 1 << 20;

void five_milliseconds(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); }

}  // namespace

int main() {
  preload_test::require_preloaded();
  const preload_test::LaunchAccessFn launch_access = preload_test::launch_access_function();
  if (launch_access == nullptr) preload_test::skip("needs the stand-in's kernels");
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaFree(nullptr));
  using ResetFn = void (*)();
  const auto reset = reinterpret_cast<ResetFn>(::dlsym(RTLD_DEFAULT, "simcuda_reset_counters"));
  CHECK(reset != nullptr);
  reset();
  for (int i = 0; i < 300; ++i) {
    void* workspace = nullptr;
    CHECK_CUDA(cudaMalloc(&workspace, kMiB + static_cast<std::size_t>(i % 7) * (128 << 10)));
    CHECK(launch_access(stream, workspace, kMiB, 1, &five_milliseconds, nullptr) == cudaSuccess);
    CHECK_CUDA(cudaFree(workspace));
  }
  const std::uint64_t peak = preload_test::counter("live_bytes_peak");
  CHECK_MSG(peak <= 200 * kMiB,
            "the device held " + std::to_string(peak >> 20) + " MiB at its peak for 1.75 MiB live");
  void* half = nullptr;
  CHECK_CUDA(cudaMalloc(&half, 128 * kMiB));
  CHECK_CUDA(cudaFree(half));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok: peak %llu MiB\n", static_cast<unsigned long long>(peak >> 20));
  return 0;
}
