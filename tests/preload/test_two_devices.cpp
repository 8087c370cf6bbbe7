// Preload test 10: two devices. Each device's allocations come from its own pools and stay on
// that device (cudaPointerGetAttributes agrees); a pointer of one device may be freed while the
// other is current; cudaDeviceReset on one device leaves the other's memory and pools intact,
// and the reset device allocates again afterwards. Skipped with fewer than two devices.
#include <vector>

#include "check.h"

namespace {

int device_of(const void* ptr) {
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, ptr));
  CHECK(attributes.type == cudaMemoryTypeDevice);
  return attributes.device;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  preload_test::require_devices(2);

  std::vector<void*> on[2];
  for (int device = 0; device < 2; ++device) {
    CHECK_CUDA(cudaSetDevice(device));
    for (int i = 0; i < 8; ++i) {
      void* ptr = nullptr;
      CHECK_CUDA(cudaMalloc(&ptr, 4096u << i));
      CHECK_CUDA(cudaMemset(ptr, 0x40 + device, 4096u << i));
      on[device].push_back(ptr);
    }
  }
  for (int device = 0; device < 2; ++device) {
    for (void* ptr : on[device]) CHECK(device_of(ptr) == device);
  }

  // Cross-device free: device 1 current, a device-0 pointer freed.
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaFree(on[0].back()));
  on[0].pop_back();
  CHECK_CUDA(cudaSetDevice(0));
  void* again = nullptr;
  CHECK_CUDA(cudaMalloc(&again, 4096));
  CHECK(device_of(again) == 0);
  CHECK_CUDA(cudaFree(again));

  // Reset device 1: device 0 keeps everything.
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceReset());
  on[1].clear();  // the reset freed them
  CHECK_CUDA(cudaSetDevice(0));
  for (std::size_t i = 0; i < on[0].size(); ++i) {
    CHECK(preload_test::device_bytes_equal(on[0][i], 4096u << i, 0x40));
  }

  // Device 1 works again from fresh pools.
  CHECK_CUDA(cudaSetDevice(1));
  for (int i = 0; i < 8; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096u << i));
    CHECK(device_of(ptr) == 1);
    CHECK_CUDA(cudaMemset(ptr, 0x99, 4096u << i));
    CHECK(preload_test::device_bytes_equal(ptr, 4096u << i, 0x99));
    on[1].push_back(ptr);
  }
  for (void* ptr : on[1]) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaSetDevice(0));
  for (void* ptr : on[0]) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
