// Preload test: a program that only ever uses device 1 gets no context on device 0 from the
// library. Device 1's idle page goes back to the driver on the device's release thread, whose
// current device starts as 0; plain CUDA never touches device 0 here, so its primary context must
// still be inactive afterwards (an active one holds memory on a GPU the program never chose).
// Skipped with fewer than two devices. Run with two devices of 1 GiB each, under
// free_fence:none and memgetinfo:raw (the driver's own free bytes show the page has gone back).

#include <chrono>
#include <thread>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

using InitFn = int (*)(unsigned flags);
using PrimaryCtxGetStateFn = int (*)(int device, unsigned* flags, int* active);

// Asks the driver directly (cuInit makes no context).
bool primary_context_active(int device) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  CHECK_MSG(driver != nullptr, "cannot open libcuda.so.1");
  auto init = reinterpret_cast<InitFn>(::dlsym(driver, "cuInit"));
  auto get = reinterpret_cast<PrimaryCtxGetStateFn>(::dlsym(driver, "cuDevicePrimaryCtxGetState"));
  CHECK_MSG(init != nullptr && get != nullptr, "no cuInit or cuDevicePrimaryCtxGetState");
  CHECK_MSG(init(0) == 0, "cuInit failed");
  unsigned flags = 0;
  int active = -1;
  CHECK_MSG(get(device, &flags, &active) == 0, "cuDevicePrimaryCtxGetState failed");
  return active != 0;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  preload_test::require_devices(2);
  CHECK_MSG(!primary_context_active(0), "device 0 has a context before the test touched it");

  CHECK_CUDA(cudaSetDevice(1));
  void* keep = nullptr;
  preload_test::hold_an_idle_page(&keep);
  std::size_t free_before = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
  // A growth past the held bound gives the idle 256 MiB page back through the release thread.
  void* grown = nullptr;
  CHECK_CUDA(cudaMalloc(&grown, 320 * kMiB));

  // Wait (5 s at most) until the page has reached the driver: 320 MiB taken, 256 MiB back.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::size_t free_now = 0;
  for (;;) {
    CHECK_CUDA(cudaMemGetInfo(&free_now, &total));
    if (free_now + 64 * kMiB >= free_before) break;
    CHECK_MSG(std::chrono::steady_clock::now() < deadline,
              "the idle page never reached the driver");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK_MSG(!primary_context_active(0),
            "returning device 1's page made a context on device 0");
  CHECK_MSG(primary_context_active(1), "device 1 has no context");

  CHECK_CUDA(cudaFree(grown));
  CHECK_CUDA(cudaFree(keep));
  return 0;
}
