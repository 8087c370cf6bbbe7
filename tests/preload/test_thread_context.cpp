// Preload test: a thread whose first CUDA call is a cudaMalloc the pools serve (no driver
// allocation) can go on with the driver API, as after the plain cudaMalloc, which leaves the
// device's primary context current on the thread (Note [A thread's first call] in
// interpose/hooks.cpp), and so does the process's first call, which brings the primary context
// to life. The driver API then writes and reads the buffer in that context. Run
// also with SIMCUDA_GET_DEVICE_BINDS=0, where the stand-in's cudaGetDevice binds no context.
// Runs on a GPU too (the driver-allocation count only on the stand-in).
#include <cuda.h>

#include <cstring>
#include <thread>
#include <vector>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

constexpr std::size_t kSize = 1 << 20;

}  // namespace

int main() {
  preload_test::require_preloaded();
  // The process's first call: the primary context comes alive only as the pools take their
  // first page, and the main thread has it current afterwards, as after the plain call. The
  // pools keep this buffer's memory once it is freed, so the thread's cudaMalloc is served from
  // it.
  void* warm = nullptr;
  CHECK_CUDA(cudaMalloc(&warm, kSize));
  CUcontext main_current = nullptr;
  CHECK_CU(cuCtxGetCurrent(&main_current));
  CHECK_MSG(main_current != nullptr, "the process's first cudaMalloc left no context current");
  CUdeviceptr driver_buffer = 0;
  CHECK_CU(cuMemAlloc(&driver_buffer, 4096));
  CHECK_CU(cuMemFree(driver_buffer));
  CHECK_CUDA(cudaFree(warm));

  const bool counted = preload_test::on_stand_in();
  std::thread worker([&] {
    CUcontext none = nullptr;
    CHECK_CU(cuCtxGetCurrent(&none));
    CHECK(none == nullptr);  // a new thread has no context

    const std::uint64_t mallocs_before = counted ? preload_test::counter("cudaMalloc") : 0;
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, kSize));
    if (counted) CHECK(preload_test::counter("cudaMalloc") == mallocs_before);  // pooled

    CUcontext current = nullptr;
    CHECK_CU(cuCtxGetCurrent(&current));
    CHECK(current != nullptr);
    CUcontext primary = nullptr;
    CHECK_CU(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(current == primary);
    CHECK_CU(cuDevicePrimaryCtxRelease(0));

    const auto device = reinterpret_cast<CUdeviceptr>(buffer);
    CHECK_CU(cuMemsetD8(device, 0x5a, kSize));
    std::vector<unsigned char> host(kSize);
    CHECK_CU(cuMemcpyDtoH(host.data(), device, kSize));
    std::vector<unsigned char> expected(kSize, 0x5a);
    CHECK(std::memcmp(host.data(), expected.data(), kSize) == 0);
    CHECK_CUDA(cudaFree(buffer));
  });
  worker.join();
  std::printf("ok\n");
  return 0;
}
