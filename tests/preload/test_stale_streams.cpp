// Preload test: streams destroyed behind the hooks' back. A non-blocking stream the program
// created through the runtime is destroyed with the runtime's own cudaStreamDestroy (as
// cuStreamDestroy or a primary-context reset would), so it stays in the library's stream table
// with a handle that no longer exists. Free fences must not stall on it: a thousand
// allocate/free pairs must still be served by a few driver allocations, and the device's free
// memory must not shrink. A stream destroyed properly afterwards, and a new one created after
// the stale one (the runtime may hand out the same handle value), keep working.
// Stand-in only: it answers a destroyed handle with cudaErrorInvalidResourceHandle, as the
// library expects; on a real runtime using a destroyed handle is undefined, so the test skips.
#include <string>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kSize = 1 << 20;
// Stalled fences make nearly every pair a driver allocation (hundreds per 1000 pairs). Working
// fences need a handful, more when the stand-in's stream threads lag (sanitizer builds, a loaded
// machine) and the fence bound lets the pools grow instead of waiting: 64 separates the two.
constexpr std::uint64_t kMaxDriverAllocations = 64;

// The driver's view of free memory, bypassing the library's pooled accounting.
std::size_t real_free_bytes() {
  using MemGetInfo = cudaError_t (*)(std::size_t*, std::size_t*);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK_CUDA(preload_test::real<MemGetInfo>("cudaMemGetInfo")(&free_bytes, &total_bytes));
  return free_bytes;
}

void churn(int pairs, cudaStream_t stream) {
  for (int i = 0; i < pairs; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, kSize + static_cast<std::size_t>(i % 7) * 4096));
    CHECK_CUDA(cudaMemsetAsync(ptr, i & 0xff, kSize, stream));
    CHECK_CUDA(cudaFree(ptr));
    if (i % 100 == 99) CHECK_CUDA(cudaDeviceSynchronize());
  }
  CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  if (!preload_test::on_stand_in()) preload_test::skip("destroyed handles are undefined on a GPU");
  using StreamDestroy = cudaError_t (*)(cudaStream_t);
  auto real_destroy = preload_test::real<StreamDestroy>("cudaStreamDestroy");

  // Tracked by the library, then destroyed where it cannot see.
  cudaStream_t stale = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stale, cudaStreamNonBlocking));
  CHECK_CUDA(real_destroy(stale));

  cudaStream_t live = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&live, cudaStreamNonBlocking));
  churn(50, live);  // the pools' working set

  const std::uint64_t mallocs_before = preload_test::counter("cudaMalloc");
  const std::size_t free_before = real_free_bytes();
  churn(1000, live);
  const std::uint64_t mallocs = preload_test::counter("cudaMalloc") - mallocs_before;
  const std::size_t free_after = real_free_bytes();
  const std::size_t shrunk = free_before > free_after ? free_before - free_after : 0;
  std::printf("after a stale stream: %llu driver allocations, free memory shrank by %zu B\n",
              static_cast<unsigned long long>(mallocs), shrunk);
  CHECK_MSG(mallocs <= kMaxDriverAllocations,
            "fences stalled: " + std::to_string(mallocs) + " mallocs");
  CHECK_MSG(shrunk <= 256 * kSize, "fences stalled: free memory shrank by " +
                                      std::to_string(shrunk) + " B");

  // Handles made after the stale one, destroyed properly, leave the fences working.
  std::vector<cudaStream_t> streams(4);
  for (cudaStream_t& s : streams) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (cudaStream_t s : streams) CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(real_destroy(live));  // a second stale stream
  cudaStream_t last = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&last, cudaStreamNonBlocking));
  const std::uint64_t mallocs_again = preload_test::counter("cudaMalloc");
  churn(1000, last);
  const std::uint64_t more = preload_test::counter("cudaMalloc") - mallocs_again;
  CHECK_MSG(more <= kMaxDriverAllocations,
            "fences stalled again: " + std::to_string(more) + " mallocs");
  CHECK_CUDA(cudaStreamDestroy(last));
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
