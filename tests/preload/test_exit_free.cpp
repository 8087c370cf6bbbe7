// Preload test 15: frees that arrive while the process exits. Programs free device memory from
// atexit handlers and static destructors, after main and possibly after the CUDA runtime began
// tearing down. Pooled pointers must still be recognised (cudaSuccess; a second free of one is
// still cudaErrorInvalidValue) and nothing may crash, including a free that closes a fence epoch
// and the exit report (report_at_exit:1), which runs after them. A failure exits with status 1
// from inside the exit sequence.
#include <cstdlib>
#include <vector>

#include "check.h"

namespace {

// More than one fence epoch of frees (256), so exit-time frees also record fences.
constexpr int kBuffers = 300;

std::vector<void*>* g_for_destructor = nullptr;
std::vector<void*>* g_for_atexit = nullptr;

// A free at exit gets what a pooled free gets: success. On a real GPU the runtime may already
// be unloading; a pointer it no longer knows then answers cudaErrorCudartUnloading, which is
// also what the real library would answer.
void free_all(const char* when, std::vector<void*>* buffers) {
  for (void* ptr : *buffers) {
    cudaError_t result = cudaFree(ptr);
    if (result != cudaSuccess && result != cudaErrorCudartUnloading) {
      std::fprintf(stderr, "%s: cudaFree(%p) returned %s\n", when, ptr,
                   preload_test::error_text(result).c_str());
      std::_Exit(1);
    }
  }
  cudaError_t again = cudaFree(buffers->front());
  if (again != cudaErrorInvalidValue && again != cudaErrorCudartUnloading) {
    std::fprintf(stderr, "%s: a second free returned %s\n", when,
                 preload_test::error_text(again).c_str());
    std::_Exit(1);
  }
  std::fprintf(stderr, "%s: %zu late frees ok\n", when, buffers->size());
}

struct LateFree {
  ~LateFree() {
    if (g_for_destructor != nullptr) free_all("static destructor", g_for_destructor);
  }
};
LateFree g_late_free;

void at_exit() { free_all("atexit handler", g_for_atexit); }

std::vector<void*>* allocate_buffers() {
  auto* buffers = new std::vector<void*>;  // leaked on purpose: used during exit
  for (int i = 0; i < kBuffers; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096 + 512 * static_cast<std::size_t>(i % 7)));
    buffers->push_back(ptr);
  }
  return buffers;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  g_for_destructor = allocate_buffers();
  g_for_atexit = allocate_buffers();
  CHECK(std::atexit(&at_exit) == 0);
  std::printf("ok\n");
  return 0;
}
