// Preload test: cudaPointerGetAttributes on pooled device memory answers as the plain call does.
// A live allocation, at its start or inside, is device memory of its device; memory the program
// freed is unknown to the runtime (cudaMemoryTypeUnregistered), though the pools keep its page
// allocated; and so is pooled memory never handed out.
#include <cstdio>

#include "check.h"

namespace {

cudaMemoryType type_of(const void* ptr) {
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, ptr));
  return attributes.type;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  void* first = nullptr;
  void* second = nullptr;
  CHECK_CUDA(cudaMalloc(&first, 1024));
  CHECK_CUDA(cudaMalloc(&second, 1024));
  char* a = static_cast<char*>(first);
  char* b = static_cast<char*>(second);
  CHECK(type_of(a) == cudaMemoryTypeDevice);
  CHECK(type_of(b + 1000) == cudaMemoryTypeDevice);
  char* lower = a < b ? a : b;
  char* upper = a < b ? b : a;
  CHECK_CUDA(cudaFree(lower));  // its page stays: `upper` lives in it
  CHECK(type_of(lower) == cudaMemoryTypeUnregistered);
  CHECK(type_of(lower + 512) == cudaMemoryTypeUnregistered);
  CHECK(type_of(upper) == cudaMemoryTypeDevice);
  // Memory the pools never handed out: far below the page's end, past `upper`.
  CHECK(type_of(upper + (64 << 10)) == cudaMemoryTypeUnregistered);
  CHECK_CUDA(cudaFree(upper));
  CHECK(type_of(upper) == cudaMemoryTypeUnregistered);
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
