// Preload test: a main thread that ends with pthread_exit() while other threads go on (Note
// [pthread_exit from main] in interpose/main_exit.cpp). The process must end when the program's
// last thread does, with status 0 and its atexit handlers run, as it does without the library:
// the library's own threads kept it alive for good, blocking every signal (only SIGKILL ended
// it). Each case runs in a child with a time limit:
//   worker  a detached worker allocates and frees (the release thread runs too: a page went back
//           to the driver), then returns;
//   chain   after one allocation, 20,000 threads in a chain, each starting the next and
//           returning: the process must not end before the last (the first watch listed the
//           threads, and ended a process whose new thread it had not seen);
//   no-cuda the same chain without any CUDA call: the library starts no thread of its own;
//   alarm   as worker, with an atexit handler that waits in pause() for an alarm(1): the exit
//           work ran on a thread of the library's with every signal blocked, and waited forever.
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "check.h"

namespace {

constexpr int kChain = 20000;
std::atomic<int> g_links{0};

void* worker(void*) {
  for (int i = 0; i < 100; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, std::size_t{1} << 20));
    CHECK_CUDA(cudaFree(p));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("worker done\n");
  std::fflush(stdout);
  return nullptr;
}

// The library's threads in the process now (named "poolcuda-...").
int library_threads() {
  int found = 0;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (const dirent* task = ::readdir(tasks)) {
      if (task->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + task->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      found += name.rfind("poolcuda-", 0) == 0;
    }
    ::closedir(tasks);
  }
  return found;
}

void* chain_link(void* no_cuda) {
  if (g_links.fetch_add(1) + 1 < kChain) {
    pthread_t next;
    CHECK(pthread_create(&next, nullptr, chain_link, no_cuda) == 0);
    CHECK(pthread_detach(next) == 0);
    return nullptr;
  }
  if (no_cuda != nullptr) {
    CHECK_MSG(library_threads() == 0,
              "the library's threads: " + std::to_string(library_threads()));
  }
  std::printf("chain done\n");
  std::fflush(stdout);
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string name = argv[1];
    std::atexit([] {
      std::printf("atexit ran\n");
      std::fflush(stdout);
    });
    if (name == "alarm") {
      std::atexit([] {
        ::signal(SIGALRM, [](int) {});
        ::alarm(1);
        ::pause();
      });
    }
    void* no_cuda = name == "no-cuda" ? argv[1] : nullptr;
    if (no_cuda == nullptr) {
      void* idle = nullptr;
      CHECK_CUDA(cudaMalloc(&idle, std::size_t{64} << 20));
      CHECK_CUDA(cudaFree(idle));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    pthread_t thread;
    const bool chain = name == "chain" || name == "no-cuda";
    CHECK(pthread_create(&thread, nullptr, chain ? &chain_link : &worker, no_cuda) == 0);
    CHECK(pthread_detach(thread) == 0);
    pthread_exit(nullptr);
  }
  preload_test::require_preloaded();
  if (::dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr) {
    preload_test::skip("ThreadSanitizer's own thread keeps such a process alive, with or "
                       "without the library");
  }
  for (const char* name : {"worker", "chain", "no-cuda", "alarm"}) {
    const preload_test::ChildResult child = preload_test::run_self(name, {}, 60);
    const bool chain = std::strcmp(name, "chain") == 0 || std::strcmp(name, "no-cuda") == 0;
    const std::string done = chain ? "chain done" : "worker done";
    CHECK_MSG(!child.timed_out, std::string(name) + ": the process outlived its threads:\n" +
                                    child.output);
    CHECK_MSG(child.status == 0 && child.output.find(done) != std::string::npos &&
                  child.output.find("atexit ran") != std::string::npos,
              std::string(name) + ": exit status " + std::to_string(child.status) + "\n" +
                  child.output);
    std::printf("%s: ok\n", name);
  }
  std::printf("ok\n");
  return 0;
}
