// Preload test 3: bad input gets CUDA's own error codes and changes nothing. A double free and
// an interior pointer answer cudaErrorInvalidValue, leave it as the last error as the real
// cudaFree does, and leave the pools intact; cudaMalloc(NULL)
// answers cudaErrorInvalidValue (and the library's own CUDA calls leave that last error alone);
// size 0 behaves as the real call; a request larger than the
// device answers cudaErrorMemoryAllocation, sets the last error as the real call does, and
// leaks nothing; a refused cudaSetDevice leaves allocations on the current device's pools.
#include <vector>

#include "check.h"

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));

  // Two neighbours, so that a corrupted pool would show in the survivor's data.
  void* keep = nullptr;
  void* victim = nullptr;
  CHECK_CUDA(cudaMalloc(&keep, 4096));
  CHECK_CUDA(cudaMalloc(&victim, 4096));
  CHECK_CUDA(cudaMemset(keep, 0x42, 4096));

  // What the real cudaFree leaves in the last-error slot for a pointer that starts no
  // allocation: a refused free through the library must leave the same.
  using FreeFn = cudaError_t (*)(void*);
  auto real_free = preload_test::real<FreeFn>("cudaFree");
  char host_byte = 0;
  CHECK_RESULT(real_free(&host_byte), cudaErrorInvalidValue);
  const cudaError_t real_last = cudaGetLastError();

  // Interior pointer of a live allocation: refused, the allocation stays live and usable.
  CHECK_RESULT(cudaFree(static_cast<char*>(victim) + 512), cudaErrorInvalidValue);
  CHECK_RESULT(cudaGetLastError(), real_last);
  CHECK_RESULT(cudaGetLastError(), cudaSuccess);
  CHECK_CUDA(cudaMemset(victim, 0x24, 4096));
  CHECK(preload_test::device_bytes_equal(victim, 4096, 0x24));

  // Double free: the second is refused.
  CHECK_CUDA(cudaFree(victim));
  CHECK_RESULT(cudaFree(victim), cudaErrorInvalidValue);
  CHECK_RESULT(cudaGetLastError(), real_last);
  CHECK_RESULT(cudaGetLastError(), cudaSuccess);
  CHECK(preload_test::device_bytes_equal(keep, 4096, 0x42));

  // The pool is intact: allocations still work, never overlap the survivor, data holds.
  for (int i = 0; i < 16; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));
    CHECK(ptr != keep);
    CHECK_CUDA(cudaMemset(ptr, i, 4096));
    CHECK(preload_test::device_bytes_equal(ptr, 4096, static_cast<unsigned char>(i)));
    CHECK_CUDA(cudaFree(ptr));
  }
  CHECK(preload_test::device_bytes_equal(keep, 4096, 0x42));

  // cudaMalloc(NULL, n). Its error stays the program's last error while the pools work on the
  // program's behalf (new pages, fence events, reuse): their own calls never touch it.
  CHECK_RESULT(cudaMalloc(nullptr, 4096), cudaErrorInvalidValue);
  std::vector<void*> pages;
  for (int i = 0; i < 600; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 64 * 1024));
    pages.push_back(ptr);
  }
  for (void* ptr : pages) CHECK_CUDA(cudaFree(ptr));
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_RESULT(cudaGetLastError(), cudaSuccess);

  // Size 0: the same answer as the real runtime's, and its pointer frees the same way.
  using MallocFn = cudaError_t (*)(void**, std::size_t);
  auto real_malloc = preload_test::real<MallocFn>("cudaMalloc");
  void* real_zero = reinterpret_cast<void*>(1);
  cudaError_t real_result = real_malloc(&real_zero, 0);
  void* zero = reinterpret_cast<void*>(1);
  CHECK_RESULT(cudaMalloc(&zero, 0), real_result);
  CHECK(zero == real_zero);
  if (real_result == cudaSuccess) {
    CHECK_RESULT(cudaFree(zero), real_free(real_zero));
  }
  (void)cudaGetLastError();

  // Larger than the device: cudaErrorMemoryAllocation, last error set once, nothing leaked.
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const bool counted = preload_test::on_stand_in();
  std::uint64_t live_before = counted ? preload_test::counter("live_allocations") : 0;
  void* huge = nullptr;
  CHECK_RESULT(cudaMalloc(&huge, total_bytes + (std::size_t{1} << 30)), cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaSuccess);
  if (counted) CHECK(preload_test::counter("live_allocations") == live_before);

  // A device that does not exist: cudaSetDevice refuses it and changes nothing, so the next
  // allocations still come from the current device's pools (with one device visible the library
  // does not ask the runtime which device is current: Note [One visible device] in hooks.cpp).
  int current = -1;
  int devices = 0;
  CHECK_CUDA(cudaGetDevice(&current));
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  CHECK_RESULT(cudaSetDevice(devices), cudaErrorInvalidDevice);
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidDevice);
  const std::uint64_t mallocs_before = counted ? preload_test::counter("cudaMalloc") : 0;
  for (int i = 0; i < 4; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));
    cudaPointerAttributes attributes{};
    CHECK_CUDA(cudaPointerGetAttributes(&attributes, ptr));
    CHECK(attributes.device == current);
    CHECK_CUDA(cudaMemset(ptr, 0x5a, 4096));
    CHECK(preload_test::device_bytes_equal(ptr, 4096, 0x5a));
    CHECK_CUDA(cudaFree(ptr));
  }
  if (counted) CHECK_MSG(preload_test::counter("cudaMalloc") == mallocs_before, "pooled");

  CHECK_CUDA(cudaFree(keep));
  std::printf("ok\n");
  return 0;
}
