// Preload test: managed slabs with nothing live in them count as free memory, as plain CUDA's
// freed managed allocations do. On a 256 MiB device, after a small managed allocation is freed
// (its slab, 4 MiB here, stays the lane's current one), cudaMemGetInfo reports the whole device
// free, and a 254 MiB request of every kind the library sees succeeds: pooled cudaMalloc,
// pitched, stream-ordered, managed past the slabs, and pitched while a stream is parked (Note
// [Room for what the pools do not serve] in interpose/pooling.cpp). Under a budget
// (limit:128M), the same slab and an idle pooled page give way to requests the budget could
// otherwise not take. On a 64 MiB device a slab is a 64th of it, so one small live managed
// allocation leaves room for a 32 MiB cudaMalloc. Managed requests over half a slab (2.2 MiB of
// 4 MiB slabs) until the device refuses one get as many as the device holds, as plain CUDA does
// (Note [Large managed requests] in pools/managed_bound.cpp): a slab each, they filled the
// device's 64 slabs with 141 MiB live. With the budget full of an idle page, a small managed
// request gets a slab once the page has gone back (it passed through to CUDA before).
#include <cstdio>
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kMiB = 1 << 20;

// A small managed allocation, freed: its slab now holds nothing live.
void leave_an_empty_slab() {
  void* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&managed, 1000));
  CHECK_CUDA(cudaFree(managed));
}

void whole_device() {
  leave_an_empty_slab();
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  CHECK_MSG(free_bytes == total, std::to_string(free_bytes) + " of " + std::to_string(total));

  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 254 * kMiB));
  CHECK_CUDA(cudaFree(ptr));

  leave_an_empty_slab();
  std::size_t pitch = 0;
  CHECK_CUDA(cudaMallocPitch(&ptr, &pitch, kMiB, 254));
  CHECK_CUDA(cudaFree(ptr));

  leave_an_empty_slab();
  CHECK_CUDA(cudaMallocAsync(&ptr, 254 * kMiB, nullptr));
  CHECK_CUDA(cudaFreeAsync(ptr, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(nullptr));

  leave_an_empty_slab();
  CHECK_CUDA(cudaMallocManaged(&ptr, 254 * kMiB));
  CHECK_CUDA(cudaFree(ptr));

  // While a stream is parked on a host function: the slab went back before the park began.
  leave_an_empty_slab();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  preload_test::Gate gate;
  preload_test::park(stream, gate);
  const cudaError_t parked = cudaMallocPitch(&ptr, &pitch, kMiB, 254);
  gate.open.store(true);
  CHECK_CUDA(parked);
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

int under_budget() {
  leave_an_empty_slab();
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 100 * kMiB));  // the slab's 64 MiB would leave 64 of 128
  CHECK_CUDA(cudaFree(ptr));                 // an idle page of at least 100 MiB now
  CHECK_CUDA(cudaMallocManaged(&ptr, 100 * kMiB));  // past the slabs: passed through
  CHECK_CUDA(cudaFree(ptr));
  std::printf("child ok\n");
  return 0;
}

// The budget full of an idle page when a managed request needs a slab: the page goes back and
// the request gets its slab, as does the next one, rather than passing through to CUDA.
int budget_full_for_a_slab() {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 127 * kMiB));
  CHECK_CUDA(cudaFree(ptr));
  const std::uint64_t before = preload_test::counter("cudaMallocManaged");
  void* first = nullptr;
  void* second = nullptr;
  CHECK_CUDA(cudaMallocManaged(&first, 1000));
  CHECK_CUDA(cudaMallocManaged(&second, 1000));
  const std::uint64_t made = preload_test::counter("cudaMallocManaged") - before;
  CHECK_MSG(made == 1, std::to_string(made) + " managed allocations of CUDA's for two requests");
  CHECK_CUDA(cudaFree(first));
  CHECK_CUDA(cudaFree(second));
  std::printf("child ok\n");
  return 0;
}

int small_device() {
  void* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&managed, 1000));  // stays live
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 32 * kMiB));
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(managed));
  std::printf("child ok\n");
  return 0;
}

// Large managed requests until one is refused, then all freed: nearly the device's worth.
void large_managed_fill() {
  constexpr std::size_t kSize = 2200 * 1024;
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  std::vector<void*> held;
  for (;;) {
    void* ptr = nullptr;
    const cudaError_t answer = cudaMallocManaged(&ptr, kSize);
    if (answer != cudaSuccess) {
      CHECK_MSG(answer == cudaErrorMemoryAllocation, preload_test::error_text(answer));
      CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
      break;
    }
    held.push_back(ptr);
  }
  // The stand-in maps whole 4 KiB pages: 119 such requests fit in the free 256 MiB.
  const std::size_t most = free_bytes / ((kSize + 4095) / 4096 * 4096);
  CHECK_MSG(held.size() + 2 >= most,
            std::to_string(held.size()) + " of the " + std::to_string(most) + " the device holds");
  for (void* ptr : held) CHECK_CUDA(cudaFree(ptr));
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 200 * kMiB));
  CHECK_CUDA(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs a 256 MiB device (the stand-in)");
  if (argc == 2 && std::string(argv[1]) == "budget") return under_budget();
  if (argc == 2 && std::string(argv[1]) == "small") return small_device();
  if (argc == 2 && std::string(argv[1]) == "slab") return budget_full_for_a_slab();
  whole_device();
  large_managed_fill();
  const preload_test::ChildResult small =
      preload_test::run_self("small", {"SIMCUDA_DEVICE_MEMORY=64M"}, 60);
  std::printf("%s", small.output.c_str());
  CHECK_MSG(small.status == 0, "small-device child exited with " + std::to_string(small.status));
  const preload_test::ChildResult child = preload_test::run_self(
      "budget", {"POOLCUDA_CONF=limit:128M", "SIMCUDA_DEVICE_MEMORY=1G"}, 60);
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "budget child exited with " + std::to_string(child.status));
  const preload_test::ChildResult slab = preload_test::run_self(
      "slab", {"POOLCUDA_CONF=limit:128M", "SIMCUDA_DEVICE_MEMORY=1G"}, 60);
  std::printf("%s", slab.output.c_str());
  CHECK_MSG(slab.status == 0, "budget-slab child exited with " + std::to_string(slab.status));
  std::printf("ok\n");
  return 0;
}
