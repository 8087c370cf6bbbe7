// Preload test: a library whose constructor allocates device memory is opened and closed again
// and again while short-lived threads make their first allocation, each growing a pool, with
// two non-blocking streams (so free fences are on and the thread caches' gate is shut). The
// constructor runs while dlopen holds the dynamic loader's lock and waits for a shard's lock; a
// thread's first reservation must never wait for the loader's lock while it holds a shard's
// (Note [Table without the loader] in pools/thread_cache.cpp, Note [Resolved before any lock]
// in interpose/own_api.cpp): both hung, every time, within a second. The work runs in a child
// with a time limit, so a hang fails the test instead of stalling the suite.
#include <dlfcn.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

int run(const char* plugin) {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t streams[2] = {};
  for (cudaStream_t& s : streams) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<bool> stop{false};
  std::atomic<long> cycles{0};
  std::thread loader([&] {
    while (!stop.load()) {
      void* handle = ::dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
      CHECK_MSG(handle != nullptr, ::dlerror());
      ::dlclose(handle);
      ++cycles;
    }
  });
  constexpr int kThreads = 1500;
  std::vector<void*> kept(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    std::thread([&, i] {
      CHECK_CUDA(cudaMalloc(&kept[i], (std::size_t{3} << 20) + 4096 * (i % 50)));
    }).join();
  }
  stop = true;
  loader.join();
  for (void* ptr : kept) CHECK_CUDA(cudaFree(ptr));
  for (cudaStream_t s : streams) CHECK_CUDA(cudaStreamDestroy(s));
  CHECK(cycles.load() > 0);
  std::printf("child ok: %ld dlopen cycles\n", cycles.load());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK(argc == 2);
  if (std::string(argv[1]) == "child") {
    const char* plugin = std::getenv("DLOPEN_PLUGIN");
    CHECK(plugin != nullptr);
    return run(plugin);
  }
  const std::string plugin = argv[1];
  const preload_test::ChildResult child =
      preload_test::run_self("child", {"DLOPEN_PLUGIN=" + plugin}, 60);
  std::printf("%s", child.output.c_str());
  CHECK_MSG(!child.timed_out, "hung: a thread's allocation and dlopen waited for each other");
  CHECK_MSG(child.status == 0, "child exited with " + std::to_string(child.status));
  std::printf("ok\n");
  return 0;
}
