// Preload test: a signal handler's cudaFreeAsync, made while its thread waits inside one of the
// library's calls, is queued until that call returns (Note [Frees from inside a call] in
// interpose/deferred_frees.cpp); another thread destroys the free's stream meanwhile. The
// queued free then named a stream CUDA no longer knew, failed, and the 24 MiB buffer stayed in
// use for good: on the 64 MiB device (meson.build) a request of all but 4 MiB failed, where the
// plain program (whose free was made at once) got it.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "check.h"

namespace {

void* g_buffer = nullptr;
cudaStream_t g_stream = nullptr;
std::atomic<bool> g_freed{false};
cudaError_t g_answer = cudaErrorUnknown;

void free_in_handler(int) {
  g_answer = cudaFreeAsync(g_buffer, g_stream);
  g_freed = true;
}

void sleep_400_ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(400)); }

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t busy = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&g_buffer, std::size_t{24} << 20));
  void* keep = nullptr;
  CHECK_CUDA(cudaMalloc(&keep, std::size_t{1} << 20));
  ::signal(SIGUSR2, free_in_handler);
  const pthread_t self = ::pthread_self();
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  CHECK(launch(busy, keep, 16, 0, &sleep_400_ms, nullptr) == 0);
  cudaError_t destroyed = cudaErrorUnknown;
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::pthread_kill(self, SIGUSR2);
    while (!g_freed) std::this_thread::sleep_for(std::chrono::microseconds(100));
    destroyed = cudaStreamDestroy(g_stream);
  });
  CHECK_CUDA(cudaDeviceSynchronize());  // the handler runs inside it
  other.join();
  CHECK_CUDA(g_answer);
  CHECK_CUDA(destroyed);
  CHECK_CUDA(cudaGetLastError());  // nothing left behind by the queued free
  CHECK_CUDA(cudaDeviceSynchronize());
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  void* large = nullptr;
  const cudaError_t got = cudaMalloc(&large, total - (std::size_t{4} << 20));
  CHECK_MSG(got == cudaSuccess, "all but 4 MiB after the handler's free: " +
                                    preload_test::error_text(got));
  CHECK_CUDA(cudaFree(large));
  CHECK_CUDA(cudaFree(keep));
  CHECK_CUDA(cudaStreamDestroy(busy));
  std::printf("ok\n");
  return 0;
}
