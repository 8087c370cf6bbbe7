// Preload test: each device's pages reach the driver on a release thread of its own. Device 1
// has a stream parked on a host function while one of its idle pages goes back: the driver's
// free of that page waits for every stream of device 1, so it stays under way for as long as
// the park. Device 0 meanwhile needs one of its own idle pages back at the driver before a large
// allocation fits. Plain CUDA's free on device 0 never waits for device 1, so the allocation
// must succeed while device 1 is still parked (with one release thread for both devices it
// waited behind device 1's free until out-of-memory recovery gave up). Skipped with fewer than
// two devices. Run with two devices of 1 GiB each, under free_fence:none and memgetinfo:raw.

#include <chrono>
#include <thread>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

}  // namespace

int main() {
  preload_test::require_preloaded();
  preload_test::require_devices(2);

  // Device 1: a stream parked, then an idle 256 MiB page (a host function gives idle pages back
  // before it parks, so the page is made after the park; free_fence:none makes it idle at once).
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t parked = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  preload_test::Gate gate;
  gate.limit_seconds = 60;
  preload_test::park(parked, gate);
  void* keep1 = nullptr;
  preload_test::hold_an_idle_page(&keep1);

  // A growth past the held bound gives the idle page back: its driver free now waits for the
  // parked stream (the driver's free bytes show it has not come back).
  std::size_t free1_before = 0, total1 = 0;
  CHECK_CUDA(cudaMemGetInfo(&free1_before, &total1));
  void* grown1 = nullptr;
  CHECK_CUDA(cudaMalloc(&grown1, 320 * kMiB));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::size_t free1_after = 0;
  CHECK_CUDA(cudaMemGetInfo(&free1_after, &total1));
  CHECK_MSG(free1_after + 128 * kMiB < free1_before,
            "device 1's idle page did not wait behind its park: the test would prove nothing");

  // Device 0: 600 MiB freed, then 700 MiB asked for. Both fit the device only once the first
  // page has reached the driver.
  CHECK_CUDA(cudaSetDevice(0));
  void* first0 = nullptr;
  CHECK_CUDA(cudaMalloc(&first0, 600 * kMiB));
  CHECK_CUDA(cudaFree(first0));
  CHECK_CUDA(cudaDeviceSynchronize());
  void* second0 = nullptr;
  const cudaError_t result = cudaMalloc(&second0, 700 * kMiB);
  CHECK_CUDA(cudaSetDevice(1));
  const bool still_parked = cudaStreamQuery(parked) == cudaErrorNotReady;
  gate.open.store(true);
  CHECK_CUDA(result);
  CHECK_MSG(still_parked, "device 0's allocation waited for device 1's park");

  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(second0));

  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamSynchronize(parked));
  CHECK_CUDA(cudaFree(grown1));
  CHECK_CUDA(cudaFree(keep1));
  CHECK_CUDA(cudaStreamDestroy(parked));
  return 0;
}
