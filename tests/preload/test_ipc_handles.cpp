// Preload test: IPC handles of pooled memory (Note [IPC handles] in interpose/pooling.cpp). A
// handle the other process would open at another address than the allocation's is refused with
// cudaErrorInvalidValue (CUDA_ERROR_INVALID_VALUE through the driver), a log line that names the
// layout to use, and no change to the allocation; a handle of an allocation that starts its page,
// or of a page's start while anything in the page lives, is the driver's; freed memory has
// none, and a refusal through the driver answers as the driver would (no current context). Under pools:exclusive (the child) every allocation
// starts its page, so every handle passes. On the stand-in a handle names its allocation's base,
// so the test also checks which memory a passed handle opens.
#include <cuda.h>

#include <cstring>
#include <string>
#include <thread>

#include "check.h"

namespace {

using IpcGetFn = CUresult (*)(CUipcMemHandle*, CUdeviceptr);

IpcGetFn driver_ipc_get() {
  return preload_test::driver_entry<IpcGetFn>("cuIpcGetMemHandle", 4010);
}

// On the stand-in: the base of the allocation a handle opens (Note in tests/simcuda/core.h).
std::uintptr_t opened_base(const unsigned char* handle) {
  CHECK(std::memcmp(handle, "simipc", 6) == 0);
  std::uint64_t base = 0;
  std::memcpy(&base, handle + 8, sizeof base);
  return static_cast<std::uintptr_t>(base);
}

void check_passes(void* ptr, IpcGetFn driver_get) {
  cudaIpcMemHandle_t handle{};
  CHECK_CUDA(cudaIpcGetMemHandle(&handle, ptr));
  CUipcMemHandle driver_handle{};
  CHECK(driver_get(&driver_handle, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS);
  if (preload_test::on_stand_in()) {
    CHECK(opened_base(reinterpret_cast<unsigned char*>(handle.reserved)) ==
          reinterpret_cast<std::uintptr_t>(ptr));
    CHECK(opened_base(reinterpret_cast<unsigned char*>(driver_handle.reserved)) ==
          reinterpret_cast<std::uintptr_t>(ptr));
  }
}

int exclusive_child() {
  IpcGetFn driver_get = driver_ipc_get();
  void* small[3] = {};
  for (void*& p : small) CHECK_CUDA(cudaMalloc(&p, 4096));
  for (void* p : small) check_passes(p, driver_get);
  for (void* p : small) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaGetLastError());
  std::printf("exclusive child ok\n");
  return 0;
}

// One refused handle, for the parent to read the log line.
int refused_child() {
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 4096));
  CHECK_CUDA(cudaMalloc(&b, 4096));
  cudaIpcMemHandle_t handle{};
  CHECK(cudaIpcGetMemHandle(&handle, b) == cudaErrorInvalidValue);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "exclusive") return exclusive_child();
  if (argc > 1 && std::string(argv[1]) == "refused") return refused_child();
  IpcGetFn driver_get = driver_ipc_get();

  // Two small buffers share a sliced page, and neither starts it.
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 4096));
  CHECK_CUDA(cudaMalloc(&b, 4096));
  CHECK_CUDA(cudaMemset(a, 0x11, 4096));
  cudaIpcMemHandle_t handle;
  std::memset(&handle, 0xee, sizeof handle);
  CHECK(cudaIpcGetMemHandle(&handle, b) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // left in the slot, as the driver's would be
  CHECK(cudaGetLastError() == cudaSuccess);
  CUipcMemHandle driver_handle{};
  CHECK(driver_get(&driver_handle, reinterpret_cast<CUdeviceptr>(b)) == CUDA_ERROR_INVALID_VALUE);
  CHECK(driver_get(&driver_handle, reinterpret_cast<CUdeviceptr>(b) + 16) ==
        CUDA_ERROR_INVALID_VALUE);
  // A thread with no current context gets the driver's own answer to that, as plainly.
  std::thread([&] {
    CUipcMemHandle no_context{};
    CHECK(driver_get(&no_context, reinterpret_cast<CUdeviceptr>(b)) ==
          CUDA_ERROR_INVALID_CONTEXT);
  }).join();
  // Nothing changed: the buffers are still live and whole.
  CHECK(preload_test::device_bytes_equal(a, 4096, 0x11));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(a));
  // Freed pooled memory has no handle either.
  CHECK(cudaIpcGetMemHandle(&handle, a) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);

  // A page's start passes: libraries export (base, offset) pairs, the base from
  // cuMemGetAddressRange.
  CHECK_CUDA(cudaMalloc(&a, 4096));
  using RangeFn = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  const auto range = preload_test::driver_entry<RangeFn>("cuMemGetAddressRange", 3020);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  CHECK(range(&base, &size, reinterpret_cast<CUdeviceptr>(a)) == CUDA_SUCCESS);
  CHECK(base != reinterpret_cast<CUdeviceptr>(a));
  CHECK(base + size > reinterpret_cast<CUdeviceptr>(a));
  check_passes(reinterpret_cast<void*>(base), driver_get);
  CHECK_CUDA(cudaFree(a));
  // With nothing live in the page, its start is freed memory: no handle.
  CHECK(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(driver_get(&driver_handle, base) == CUDA_ERROR_INVALID_VALUE);

  // A large buffer has a page of its own, starting at the buffer.
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, std::size_t{64} << 20));
  check_passes(big, driver_get);
  CHECK_CUDA(cudaFree(big));
  CHECK(cudaIpcGetMemHandle(&handle, big) == cudaErrorInvalidValue);  // freed: no handle
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(driver_get(&driver_handle, reinterpret_cast<CUdeviceptr>(big)) ==
        CUDA_ERROR_INVALID_VALUE);

  // The refusal says why and what to do; under pools:exclusive every handle passes.
  const preload_test::ChildResult refused = preload_test::run_self("refused", {});
  CHECK_MSG(refused.status == 0 &&
                refused.output.find("cudaIpcGetMemHandle(") != std::string::npos &&
                refused.output.find("into a pooled page") != std::string::npos &&
                refused.output.find("POOLCUDA_CONF=pools:exclusive") != std::string::npos,
            refused.output);
  const preload_test::ChildResult exclusive =
      preload_test::run_self("exclusive", {"POOLCUDA_CONF=pools:exclusive"});
  CHECK_MSG(exclusive.status == 0 && exclusive.output.find("exclusive child ok") !=
                                         std::string::npos,
            exclusive.output);
  CHECK_MSG(exclusive.output.find("refused") == std::string::npos, exclusive.output);
  std::printf("ok\n");
  return 0;
}
