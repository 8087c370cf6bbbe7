// Preload test: a main thread that ends with pthread_exit() while a detached worker allocates
// (Note [pthread_exit from main] in interpose/main_exit.cpp). The process must end when the
// worker does, with status 0 and its atexit handlers run, as it does without the library: the
// library's own threads kept it alive for good, blocking every signal (only SIGKILL ended it).
// The case runs in a child with a time limit; the child also forces a page back to the driver,
// so that the release thread runs too.
#include <pthread.h>

#include <cstdlib>
#include <string>

#include "check.h"

namespace {

void* worker(void*) {
  for (int i = 0; i < 100; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, std::size_t{1} << 20));
    CHECK_CUDA(cudaFree(p));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaDeviceSetLimit(cudaLimitMallocHeapSize, std::size_t{1} << 20));
  std::printf("worker done\n");
  std::fflush(stdout);
  return nullptr;
}

}  // namespace

int main(int argc, char**) {
  if (argc > 1) {
    std::atexit([] {
      std::printf("atexit ran\n");
      std::fflush(stdout);
    });
    CHECK_CUDA(cudaFree(nullptr));
    void* idle = nullptr;
    CHECK_CUDA(cudaMalloc(&idle, std::size_t{64} << 20));
    CHECK_CUDA(cudaFree(idle));
    CHECK_CUDA(cudaDeviceSynchronize());
    pthread_t thread;
    CHECK(pthread_create(&thread, nullptr, worker, nullptr) == 0);
    CHECK(pthread_detach(thread) == 0);
    pthread_exit(nullptr);
  }
  preload_test::require_preloaded();
  const preload_test::ChildResult child = preload_test::run_self("child", {}, 20);
  CHECK_MSG(!child.timed_out, "the process outlived its threads:\n" + child.output);
  CHECK_MSG(child.status == 0, "exit status " + std::to_string(child.status) + "\n" +
                                   child.output);
  CHECK_MSG(child.output.find("worker done") != std::string::npos &&
                child.output.find("atexit ran") != std::string::npos,
            child.output);
  std::printf("ok\n");
  return 0;
}
