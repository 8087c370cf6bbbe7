// Preload test: allocations the pools do not serve find the room plain CUDA would have left them
// (Note [Room for what the pools do not serve] in interpose/pooling.cpp). On a 1 GiB device the
// program frees a 700 MiB buffer, whose page the pools keep idle, then asks for 700 MiB through
// each allocator that goes to the driver: cudaMallocPitch, cudaMallocManaged past the managed
// slab, cuMemAllocPitch, cuMemAllocManaged and cuMemAllocAsync. Each succeeds, as it does
// without the library, and the runtime's leave the last-error slot as the plain call does: clean
// when it was clean, the program's own error when it held one. A child whose layout has no pool
// for 700 MiB does the same with cudaMalloc and cuMemAlloc, which the pools then pass to the
// driver, and with cuMemAlloc in a context of cuCtxCreate, whose memory is never pooled. And a
// cudaMallocAsync larger than a budget's limit (which does not charge it) but not than the
// device gets the idle pages back too.
// Runs on a GPU too, where 700 MiB only needs to fit next to nothing else.
#include <cuda.h>

#include <cstdio>
#include <functional>
#include <string>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

constexpr std::size_t kBig = 700u << 20;

// A 700 MiB pooled buffer, freed: its page stays with the pools, idle.
void leave_an_idle_page() {
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, kBig));
  CHECK_CUDA(cudaFree(buffer));
}

void runtime_allocation(const char* what, const std::function<cudaError_t(void**)>& allocate,
                        bool dirty_slot) {
  leave_an_idle_page();
  if (dirty_slot) CHECK(cudaSetDevice(1 << 20) == cudaErrorInvalidDevice);  // the program's own
  void* ptr = nullptr;
  CHECK_MSG(allocate(&ptr) == cudaSuccess, std::string(what) + " failed beside idle pages");
  CHECK_MSG(cudaGetLastError() == (dirty_slot ? cudaErrorInvalidDevice : cudaSuccess),
            std::string(what) + " changed the last-error slot");
  CHECK_CUDA(cudaFree(ptr));
}

void driver_allocation(const char* what, const std::function<CUresult(CUdeviceptr*)>& allocate,
                       bool stream_ordered) {
  leave_an_idle_page();
  CUdeviceptr ptr = 0;
  CHECK_MSG(allocate(&ptr) == CUDA_SUCCESS, std::string(what) + " failed beside idle pages");
  CHECK_CU(stream_ordered ? cuMemFreeAsync(ptr, nullptr) : cuMemFree_v2(ptr));
  CHECK_CU(cuCtxSynchronize());
}

// Under a layout whose largest pool takes 512 MiB: two 400 MiB pooled buffers, freed.
void leave_idle_pages_beside_no_pool() {
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 400u << 20));
  CHECK_CUDA(cudaMalloc(&b, 400u << 20));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
}

int passed_through_child() {
  CHECK_CUDA(cudaFree(nullptr));
  leave_idle_pages_beside_no_pool();
  void* ptr = nullptr;
  CHECK_MSG(cudaMalloc(&ptr, kBig) == cudaSuccess,
            "a cudaMalloc no pool serves failed beside idle pages");
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFree(ptr));
  leave_idle_pages_beside_no_pool();
  CUdeviceptr dptr = 0;
  CHECK_MSG(cuMemAlloc_v2(&dptr, kBig) == CUDA_SUCCESS,
            "a cuMemAlloc no pool serves failed beside idle pages");
  CHECK_CU(cuMemFree_v2(dptr));
  leave_idle_pages_beside_no_pool();
  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, 0));
  CHECK_MSG(cuMemAlloc_v2(&dptr, kBig) == CUDA_SUCCESS,
            "a cuMemAlloc in a context of cuCtxCreate failed beside idle pages");
  CHECK_CU(cuMemFree_v2(dptr));
  CHECK_CU(cuCtxDestroy_v2(own));
  std::printf("passed-through child ok\n");
  return 0;
}

// Under limit:650M on the 1 GiB device: a 400 MiB pooled buffer, freed, then 700 MiB through
// cudaMallocAsync, which the budget does not charge: more than the limit, less than the device.
int beside_budget_child() {
  void* pooled = nullptr;
  CHECK_CUDA(cudaMalloc(&pooled, 400u << 20));
  CHECK_CUDA(cudaFree(pooled));
  void* ptr = nullptr;
  CHECK_MSG(cudaMallocAsync(&ptr, kBig, nullptr) == cudaSuccess,
            "a cudaMallocAsync above the budget's limit failed beside idle pages");
  CHECK_CUDA(cudaFreeAsync(ptr, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("beside-budget child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "passed-through") return passed_through_child();
  if (argc > 1 && std::string(argv[1]) == "beside-budget") return beside_budget_child();
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  for (const bool dirty : {false, true}) {
    runtime_allocation("cudaMallocPitch", [](void** p) {
      std::size_t pitch = 0;
      return cudaMallocPitch(p, &pitch, 1 << 20, kBig >> 20);
    }, dirty);
    runtime_allocation("cudaMallocManaged", [](void** p) {
      return cudaMallocManaged(p, kBig);
    }, dirty);
  }
  driver_allocation("cuMemAllocPitch", [](CUdeviceptr* p) {
    std::size_t pitch = 0;
    return cuMemAllocPitch_v2(p, &pitch, 1 << 20, kBig >> 20, 4);
  }, false);
  driver_allocation("cuMemAllocManaged", [](CUdeviceptr* p) {
    return cuMemAllocManaged(p, kBig, CU_MEM_ATTACH_GLOBAL);
  }, false);
  driver_allocation("cuMemAllocAsync", [](CUdeviceptr* p) {
    return cuMemAllocAsync(p, kBig, nullptr);
  }, true);
  const preload_test::ChildResult passed = preload_test::run_self(
      "passed-through", {"POOLCUDA_CONF=pools:[sliced(page=2M,slice=512K);exclusive(max=512M)]"});
  CHECK_MSG(passed.status == 0, passed.output);
  const preload_test::ChildResult beside =
      preload_test::run_self("beside-budget", {"POOLCUDA_CONF=limit:650M"});
  CHECK_MSG(beside.status == 0, beside.output);
  std::printf("ok\n");
  return 0;
}
