// Host memory refused to the library inside a CUDA call: the call fails as the runtime fails for
// lack of memory (cudaErrorMemoryAllocation, left in the thread's last-error slot, as the plain
// runtime's own refusals are), changes nothing, and the same call succeeds once host memory is
// there again. This program replaces operator new and refuses, while `refusing` is set, every
// allocation whose caller lies in libpoolcuda.so (the runtime's own allocations go on: the
// program asks what the library does, not what a runtime without memory does). Cases: the
// process's first call (the library's lazy set-up), a pool's growth, cudaMallocManaged's first
// slab, and frees (stream-ordered ones on new streams too), which either free or leave the
// allocation live and freeable.
#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <new>

#include "check.h"

namespace {

std::atomic<bool> refusing{false};
std::atomic<int> refused{0};

bool from_library(const void* caller) {
  Dl_info info{};
  return ::dladdr(caller, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libpoolcuda") != nullptr;
}

void* take(std::size_t size, std::size_t align, const void* caller) {
  if (refusing.load() && from_library(caller)) {
    refused.fetch_add(1);
    throw std::bad_alloc();
  }
  void* block = align <= alignof(std::max_align_t)
                    ? std::malloc(size == 0 ? 1 : size)
                    : std::aligned_alloc(align, (size + align - 1) / align * align);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

}  // namespace

void* operator new(std::size_t n) { return take(n, 0, __builtin_return_address(0)); }
void* operator new[](std::size_t n) { return take(n, 0, __builtin_return_address(0)); }
void* operator new(std::size_t n, std::align_val_t a) {
  return take(n, static_cast<std::size_t>(a), __builtin_return_address(0));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return take(n, static_cast<std::size_t>(a), __builtin_return_address(0));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

// A refused call's answer and the slot it leaves; `refused` counts the library's refusals, so
// a case the library served without host memory is told apart (and fails the test).
void expect_refused(cudaError_t answer, const char* what) {
  CHECK_MSG(refused.load() > 0, std::string(what) + ": the library allocated nothing");
  CHECK_MSG(answer == cudaErrorMemoryAllocation,
            std::string(what) + " answered " + preload_test::error_text(answer));
  const cudaError_t slot = cudaGetLastError();
  CHECK_MSG(slot == cudaErrorMemoryAllocation,
            std::string(what) + " left " + preload_test::error_text(slot) + " in the slot");
  CHECK(cudaGetLastError() == cudaSuccess);
}

void fill(void* ptr, std::size_t size, int byte) {
  CHECK(cudaMemset(ptr, byte, size) == cudaSuccess);
}

bool holds(const void* ptr, std::size_t size, unsigned char byte) {
  std::vector<unsigned char> host(size);
  CHECK(cudaMemcpy(host.data(), ptr, size, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (unsigned char b : host)
    if (b != byte) return false;
  return true;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  // The process's first call through the library: its lazy set-up is refused.
  void* first = reinterpret_cast<void*>(0x1);
  refusing = true;
  expect_refused(cudaMalloc(&first, 1000), "the first cudaMalloc");
  refusing = false;
  CHECK(cudaMalloc(&first, 1000) == cudaSuccess);
  fill(first, 1000, 0x5a);

  // Small allocations until the library needs host memory (a larger index or node slab): the
  // refused one takes no device memory, and the ones before it keep their bytes.
  std::vector<void*> kept;
  kept.reserve(20000);
  refused = 0;
  for (int i = 0; i < 20000 && refused.load() == 0; ++i) {
    std::size_t free_before = 0, free_after = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
    void* ptr = nullptr;
    refusing = true;
    const cudaError_t answer = cudaMalloc(&ptr, 1000);
    refusing = false;
    if (answer == cudaSuccess) {
      fill(ptr, 1000, i & 0xff);
      kept.push_back(ptr);
      continue;
    }
    expect_refused(answer, "a small allocation");
    CHECK(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
    CHECK_MSG(free_after == free_before, "the refused allocation kept device memory: " +
                                             std::to_string(free_before - free_after) + " B");
  }
  CHECK_MSG(refused.load() > 0, "20,000 allocations needed no host memory");
  CHECK(holds(first, 1000, 0x5a));
  for (std::size_t i = 0; i < kept.size(); ++i) {
    CHECK(holds(kept[i], 1000, static_cast<unsigned char>(i & 0xff)));
    CHECK(cudaFree(kept[i]) == cudaSuccess);
  }
  void* grown = nullptr;
  CHECK(cudaMalloc(&grown, 24u << 20) == cudaSuccess);
  fill(grown, 24u << 20, 0x21);

  // Managed memory's first slab.
  refused = 0;
  refusing = true;
  void* managed = nullptr;
  expect_refused(cudaMallocManaged(&managed, 4096), "the first cudaMallocManaged");
  refusing = false;
  CHECK(cudaMallocManaged(&managed, 4096) == cudaSuccess);
  std::memset(managed, 0x33, 4096);

  // Frees: a refused free leaves the allocation live, and a second try frees it; a free that
  // needed nothing frees it. Either way a third free is a double free.
  for (void* ptr : {grown, first, managed}) {
    refused = 0;
    refusing = true;
    const cudaError_t answer = cudaFree(ptr);
    refusing = false;
    if (answer != cudaSuccess) {
      expect_refused(answer, "a free");
      CHECK(cudaFree(ptr) == cudaSuccess);
    }
    CHECK(cudaFree(ptr) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  }
  // Stream-ordered frees on new streams (a fence recorded, a lane's list grown): each frees, or
  // is refused and frees on the next try; either way the memory is not lost and a second free
  // is a double free.
  for (int round = 0; round < 4; ++round) {
    cudaStream_t stream = nullptr;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    void* ptr = nullptr;
    CHECK(cudaMalloc(&ptr, 3000) == cudaSuccess);
    refused = 0;
    refusing = true;
    const cudaError_t answer = cudaFreeAsync(ptr, stream);
    refusing = false;
    if (answer != cudaSuccess) {
      expect_refused(answer, "a stream-ordered free");
      CHECK(cudaFreeAsync(ptr, stream) == cudaSuccess);
    }
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(cudaFree(ptr) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  }
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  std::printf("ok\n");
  return 0;
}
