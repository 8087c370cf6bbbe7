// Preload test: a thread cancelled (pthread_cancel, deferred) inside the driver's refusal of an
// allocation the library made for it, under a budget (limit:256M in meson.build). Three
// quarters of the device are taken by cudaMallocAsync, which the budget does not count; then,
// twice each, a thread asks for half the device with cudaMalloc (a pool's growth) and with
// cudaMallocManaged (a managed slab), and is cancelled while the stand-in's refusal takes
// 50 ms (SIMCUDA_REFUSAL_DELAY_US: a cancellation point inside the driver's call). The charge
// each growth made before asking the driver used to be taken back only after the call
// returned, so the unwinding left it on the books: the budget then counted the whole device
// as held, cudaMemGetInfo said nothing was free, and once the hog was freed a request for three
// quarters of the device, which plain CUDA serves, was refused. On a GPU the refusal may have no
// cancellation point; the thread then ends on its own and the check holds as well.
#include <pthread.h>
#include <unistd.h>

#include "check.h"

namespace {

std::size_t g_request = 0;
bool g_managed = false;

void* allocate(void*) {
  void* ptr = nullptr;
  const cudaError_t answer = g_managed ? cudaMallocManaged(&ptr, g_request)
                                       : cudaMalloc(&ptr, g_request);
  if (answer == cudaSuccess) (void)cudaFree(ptr);
  return nullptr;
}

}  // namespace

int main() {
#ifdef __SANITIZE_THREAD__
  // The unwinding of a thread cancelled inside a blocking call unlocks the pools' lock, but
  // ThreadSanitizer misses that unlock, and reports the next lock as a double lock (a mutex, a
  // usleep under it and a pthread_cancel alone show the same report with the mutex free).
  preload_test::skip("ThreadSanitizer misses the unlocks of a cancelled thread's unwinding");
#endif
#ifdef __SANITIZE_ADDRESS__
  // AddressSanitizer's own check of the stack fails while a cancelled thread unwinds through
  // the instrumented entry point (asan_thread.cpp: kCurrentStackFrameMagic).
  preload_test::skip("AddressSanitizer fails its own check in a cancelled thread's unwinding");
#endif
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  void* hog = nullptr;
  CHECK_CUDA(cudaMallocAsync(&hog, total / 4 * 3, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  g_request = total / 2;
  for (bool managed : {false, false, true, true}) {
    g_managed = managed;
    pthread_t thread;
    CHECK(pthread_create(&thread, nullptr, allocate, nullptr) == 0);
    ::usleep(5000);
    pthread_cancel(thread);
    CHECK(pthread_join(thread, nullptr) == 0);
  }
  (void)cudaGetLastError();  // the refusals' (the threads' own slots are gone with them)
  CHECK_CUDA(cudaFreeAsync(hog, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  CHECK_MSG(free_bytes == total, "free " + std::to_string(free_bytes) + " of " +
                                     std::to_string(total));
  void* large = nullptr;
  const cudaError_t answer = cudaMalloc(&large, total / 4 * 3);
  CHECK_MSG(answer == cudaSuccess, "three quarters of the device after the cancellations: " +
                                       preload_test::error_text(answer));
  CHECK_CUDA(cudaFree(large));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}
