// Preload test: the runtime and the driver share the pools. A pointer from cudaMalloc freed
// with cuMemFree_v2, and one from cuMemAlloc_v2 freed with cudaFree, return to the pools (no
// real free reaches the stand-in; freeing them again through either layer is a refused double
// free), and their memory is handed out again without new driver allocations. The driver entry
// points come from cudaGetDriverEntryPointByVersion, which hands out the library's hooks.
#include <cuda.h>

#include <cstring>
#include <string>

#include "check.h"

namespace {

// The entry point the runtime resolves, which must be the library's hook.
template <typename Fn>
Fn hooked_entry(const char* name, unsigned int version) {
  const auto fn = preload_test::driver_entry<Fn>(name, version);
  Dl_info info{};
  CHECK_MSG(::dladdr(reinterpret_cast<void*>(fn), &info) != 0 &&
                std::strstr(info.dli_fname, "poolcuda") != nullptr,
            std::string(name) + " is not the library's hook");
  return fn;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  auto mem_alloc = hooked_entry<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020);
  auto mem_free = hooked_entry<decltype(&cuMemFree_v2)>("cuMemFree", 3020);
  const bool counted = preload_test::on_stand_in();
  auto count = [&](const char* name) { return counted ? preload_test::counter(name) : 0; };

  // Warm up both sizes, so that every later allocation is a pool hit.
  void* warm = nullptr;
  CHECK_CUDA(cudaMalloc(&warm, 1 << 20));
  CHECK_CUDA(cudaFree(warm));
  const std::uint64_t frees = count("cudaFree") + count("cuMemFree");
  const std::uint64_t allocs = count("cudaMalloc") + count("cuMemAlloc");

  void* from_runtime = nullptr;
  CHECK_CUDA(cudaMalloc(&from_runtime, 1 << 20));
  CHECK_CUDA(cudaMemset(from_runtime, 0x11, 1 << 20));
  CHECK(mem_free(reinterpret_cast<CUdeviceptr>(from_runtime)) == CUDA_SUCCESS);

  CUdeviceptr from_driver = 0;
  CHECK(mem_alloc(&from_driver, 1 << 20) == CUDA_SUCCESS);
  CHECK_CUDA(cudaMemset(reinterpret_cast<void*>(from_driver), 0x22, 1 << 20));
  CHECK(preload_test::device_bytes_equal(reinterpret_cast<void*>(from_driver), 1 << 20, 0x22));
  CHECK_CUDA(cudaFree(reinterpret_cast<void*>(from_driver)));

  if (counted) {
    CHECK_MSG(count("cudaFree") + count("cuMemFree") == frees, "a free reached the driver");
    CHECK_MSG(count("cudaMalloc") + count("cuMemAlloc") == allocs,
              "an allocation reached the driver");
  }
  // Both are back in the pools: freeing them again, through either layer, is a double free.
  CHECK(cudaFree(from_runtime) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(mem_free(from_driver) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
