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
//           work ran on a thread of the library's with every signal blocked, and waited forever;
//   forked  after CUDA calls, the process forks, and the child's main thread starts a worker
//           that sleeps (no CUDA: a forked child cannot use its parent's) and ends with
//           pthread_exit: the child counted its parent's library threads as its own and ended
//           at once, killing the worker;
//   slow-create  the worker, once the main thread has ended, makes the library start its
//           release thread (a page goes back to the driver) under a pthread_create that takes
//           400 ms (slow_thread_create.cpp, as on a loaded machine): the library counted that
//           thread before it ran, and the watch took the worker for it and ended the process.
// Run with the path of slow_thread_create's library as its argument.
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

void* sleeping_worker(void*) {
  ::usleep(300 * 1000);
  std::printf("worker done\n");
  std::fflush(stdout);
  return nullptr;
}

// The slow-create case's worker: a 256 MiB page goes idle and a growth past the held bound
// gives it back to the driver, on the release thread, which starts now (1 GiB device).
void* releasing_worker(void*) {
  ::usleep(100 * 1000);
  void* keep = nullptr;
  void* idle = nullptr;
  void* grown = nullptr;
  CHECK_CUDA(cudaMalloc(&keep, std::size_t{64} << 20));
  CHECK_CUDA(cudaMalloc(&idle, std::size_t{256} << 20));
  CHECK_CUDA(cudaFree(idle));
  CHECK_CUDA(cudaMalloc(&grown, std::size_t{320} << 20));
  ::usleep(600 * 1000);
  std::printf("worker done\n");
  std::fflush(stdout);
  return nullptr;
}

// The forked case: the child ends its main thread; the parent returns the child's status.
int fork_and_exit_main_in_child() {
  std::fflush(stdout);
  const pid_t child = ::fork();
  CHECK(child >= 0);
  if (child == 0) {
    pthread_t thread;
    CHECK(pthread_create(&thread, nullptr, &sleeping_worker, nullptr) == 0);
    CHECK(pthread_detach(thread) == 0);
    pthread_exit(nullptr);
  }
  int status = 0;
  CHECK(::waitpid(child, &status, 0) == child);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child ended with " +
                                                               std::to_string(status));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool a_case = argc > 1 && std::strstr(argv[1], ".so") == nullptr;
  if (a_case) {
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
    if (name == "slow-create") {
      CHECK_CUDA(cudaFree(nullptr));  // the reporter starts: the watch will
    } else if (no_cuda == nullptr) {
      void* idle = nullptr;
      CHECK_CUDA(cudaMalloc(&idle, std::size_t{64} << 20));
      CHECK_CUDA(cudaFree(idle));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    if (name == "forked") return fork_and_exit_main_in_child();
    pthread_t thread;
    const bool chain = name == "chain" || name == "no-cuda";
    void* (*body)(void*) = chain                   ? &chain_link
                           : name == "slow-create" ? &releasing_worker
                                                   : &worker;
    CHECK(pthread_create(&thread, nullptr, body, no_cuda) == 0);
    CHECK(pthread_detach(thread) == 0);
    pthread_exit(nullptr);
  }
  preload_test::require_preloaded();
  if (::dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr) {
    preload_test::skip("ThreadSanitizer's own thread keeps such a process alive, with or "
                       "without the library");
  }
  CHECK_MSG(argc > 1, "usage: test_main_thread_exit SLOW_THREAD_CREATE_LIBRARY");
  const char* preloaded = std::getenv("LD_PRELOAD");
  const std::vector<std::string> slow_create = {
      std::string("LD_PRELOAD=") + (preloaded != nullptr ? preloaded : "") + ":" + argv[1],
      "SLOW_THREAD_CREATE_MS=400", "SIMCUDA_DEVICE_MEMORY=1G"};
  for (const char* name : {"worker", "chain", "no-cuda", "alarm", "forked", "slow-create"}) {
    const bool slow = std::strcmp(name, "slow-create") == 0;
    const preload_test::ChildResult child =
        preload_test::run_self(name, slow ? slow_create : std::vector<std::string>{}, 60);
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
