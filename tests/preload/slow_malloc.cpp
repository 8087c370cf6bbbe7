// A CUDA runtime shim for the exit_bounded test, preloaded after libpoolcuda.so so that the
// library's real cudaMalloc is this one: once armed, a request of at least the armed size waits
// (up to 30 s) before it reaches the runtime, which keeps the caller inside the library's
// device allocation, holding the manager's lock, for as long as the test needs.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace {

std::atomic<std::size_t> g_threshold{0};  // 0: not armed
std::atomic<bool> g_entered{false};

}  // namespace

extern "C" void slow_malloc_arm(std::size_t threshold) { g_threshold.store(threshold); }

extern "C" bool slow_malloc_entered() { return g_entered.load(); }

extern "C" cudaError_t cudaMalloc(void** ptr, std::size_t size) {
  using Fn = cudaError_t (*)(void**, std::size_t);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "cudaMalloc"));
  const std::size_t threshold = g_threshold.load();
  if (threshold != 0 && size >= threshold) {
    g_entered.store(true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return real(ptr, size);
}
