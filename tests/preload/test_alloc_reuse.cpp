// Preload test 1: allocations come from the pools, contents survive memset/memcpy round trips,
// every address is at least 256-byte aligned, and freed memory is reused instead of reaching
// the driver again.
#include <cstdint>
#include <set>
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));  // creates the context, as programs do

  // Mixed sizes, odd ones included; each buffer gets its own pattern.
  const std::size_t sizes[] = {1, 255, 256, 257, 4096, 10000, 65536, 1 << 20, 3 << 20, 77777};
  std::vector<void*> buffers;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, sizes[i]));
    CHECK(ptr != nullptr);
    CHECK_MSG(reinterpret_cast<std::uintptr_t>(ptr) % 256 == 0, "address not 256-byte aligned");
    CHECK_CUDA(cudaMemset(ptr, static_cast<int>(0x10 + i), sizes[i]));
    buffers.push_back(ptr);
  }
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    CHECK(preload_test::device_bytes_equal(buffers[i], sizes[i],
                                           static_cast<unsigned char>(0x10 + i)));
  }

  // A host -> device -> device -> host round trip through two pooled buffers.
  const std::size_t n = 1 << 20;
  std::vector<std::uint32_t> source(n / 4);
  for (std::size_t i = 0; i < source.size(); ++i) {
    source[i] = static_cast<std::uint32_t>(i * 2654435761u);
  }
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, n));
  CHECK_CUDA(cudaMalloc(&b, n));
  CHECK_CUDA(cudaMemcpy(a, source.data(), n, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  std::vector<std::uint32_t> back(n / 4);
  CHECK_CUDA(cudaMemcpy(back.data(), b, n, cudaMemcpyDeviceToHost));
  CHECK(back == source);
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));

  // Neighbours were untouched by all of that.
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    CHECK(preload_test::device_bytes_equal(buffers[i], sizes[i],
                                           static_cast<unsigned char>(0x10 + i)));
    CHECK_CUDA(cudaFree(buffers[i]));
  }

  // Reuse: a thousand alloc/free pairs of a few sizes are served by a few driver allocations
  // (counted on the stand-in) and do not make the device's free memory shrink (on a GPU). The
  // addresses themselves may wander through a page while free fences are pending. The loop
  // synchronizes every 100 pairs, as a program does between steps: how soon a fence passes
  // otherwise depends on how busy the machine is, and this test is about reuse, not timing.
  CHECK_CUDA(cudaDeviceSynchronize());
  const bool counted = preload_test::on_stand_in();
  std::uint64_t mallocs_before = counted ? preload_test::counter("cudaMalloc") : 0;
  using MemGetInfoFn = cudaError_t (*)(std::size_t*, std::size_t*);
  auto real_info = preload_test::real<MemGetInfoFn>("cudaMemGetInfo");
  std::size_t free_before = 0;
  std::size_t total = 0;
  CHECK_CUDA(real_info(&free_before, &total));
  std::set<void*> addresses;
  for (int round = 0; round < 1000; ++round) {
    void* ptr = nullptr;
    std::size_t size = 4096u << (round % 4);
    CHECK_CUDA(cudaMalloc(&ptr, size));
    CHECK(reinterpret_cast<std::uintptr_t>(ptr) % 256 == 0);
    addresses.insert(ptr);
    CHECK_CUDA(cudaFree(ptr));
    if (round % 100 == 99) CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::size_t free_after = 0;
  CHECK_CUDA(real_info(&free_after, &total));
  // 1000 pairs without reuse would take 15 MiB; the pools stay within a few pages.
  CHECK_MSG(free_after + (8u << 20) >= free_before,
            "device free memory fell by " + std::to_string(free_before - free_after));
  if (counted) {
    std::uint64_t made = preload_test::counter("cudaMalloc") - mallocs_before;
    CHECK_MSG(made <= 4, std::to_string(made) + " driver allocations for 1000 pairs");
  }
  std::printf("ok: %zu distinct addresses over 1000 alloc/free pairs\n", addresses.size());
  return 0;
}
