// Preload test 9: fork. Children forked while four threads of the parent allocate and free (so
// a manager's lock may be held at the fork) run in pass-through: their CUDA calls go to the real
// runtime (on the stand-in they succeed and are counted as real calls; on a GPU, where a forked
// child cannot use its parent's context, they may fail but must not crash or hang), and they
// exit cleanly. The parent's pools and data are intact afterwards. A child also gets back the
// report signal's disposition the program had before the library installed its handler (here
// the default), and loses the readiness mark, since it has no reporter thread to answer.
//
// Run under free_fence:none: once the churn has its pages, the parent's threads then make no
// real CUDA call at all, so a fork seldom catches one of them inside the runtime (a runtime's
// own locks are not fork-safe; this test is about the pools' state, not the runtime's). The
// stand-in's fork waits for its own locks (Note [Forks while another thread allocates] in
// tests/simcuda/memory.cpp): a growth still under way at the fork, common under a sanitizer on
// a loaded machine, hung the child on the stand-in's memory lock.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "check.h"

namespace {

std::atomic<bool> g_stop{false};

void churn(int id) {
  std::vector<void*> live;
  unsigned step = 0;
  while (!g_stop.load()) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 512 + (step * 104729u + static_cast<unsigned>(id)) % 100000));
    live.push_back(ptr);
    if (live.size() > 8) {
      CHECK_CUDA(cudaFree(live.front()));
      live.erase(live.begin());
    }
    ++step;
  }
  for (void* ptr : live) CHECK_CUDA(cudaFree(ptr));
}

// Whether this process shows the library's readiness mark in /proc/self/maps.
bool has_ready_mark() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("poolcuda-ready.") != std::string::npos;
}

// Exit status 0 when the pass-through behaved. `quiet`: the parent had no work in flight, so
// the child may also free (the real cudaFree synchronizes the device, and the stand-in's stream
// threads, like a real CUDA context, do not exist in a forked child).
int child_body(bool quiet) {
  // A runtime lock held by a parent thread at the fork would hang the child, and the parent's
  // waitpid with it: a bounded child fails the test instead (killed by SIGALRM).
  ::alarm(30);
  struct sigaction report_signal {};
  if (::sigaction(SIGUSR1, nullptr, &report_signal) != 0) return 7;
  if ((report_signal.sa_flags & SA_SIGINFO) != 0 || report_signal.sa_handler != SIG_DFL) return 8;
  if (has_ready_mark()) return 9;
  void* ptr = nullptr;
  if (!preload_test::on_stand_in()) {
    if (cudaMalloc(&ptr, 4096) == cudaSuccess && quiet) cudaFree(ptr);
    return 0;
  }
  std::uint64_t mallocs = preload_test::counter("cudaMalloc");
  std::uint64_t frees = preload_test::counter("cudaFree");
  if (cudaMalloc(&ptr, 4096) != cudaSuccess) return 3;
  // The call reached the real runtime: no pool served it.
  if (preload_test::counter("cudaMalloc") != mallocs + 1) return 4;
  if (quiet) {
    if (cudaFree(ptr) != cudaSuccess) return 5;
    if (preload_test::counter("cudaFree") != frees + 1) return 6;
  }
  return 0;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));

  // The library's reporter is listening in the parent (it publishes its mark once it does).
  for (int i = 0; i < 500 && !has_ready_mark(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(has_ready_mark());

  void* kept = nullptr;
  CHECK_CUDA(cudaMalloc(&kept, 1 << 16));
  CHECK_CUDA(cudaMemset(kept, 0x3c, 1 << 16));

  std::vector<std::thread> threads;
  for (int id = 0; id < 4; ++id) threads.emplace_back(churn, id);

  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pid_t pid = ::fork();
    CHECK(pid >= 0);
    if (pid == 0) ::_exit(child_body(false));
    int status = 0;
    CHECK(::waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child status " + std::to_string(status));
  }
  g_stop.store(true);
  for (auto& thread : threads) thread.join();

  // The parent's pools are intact: its data holds and it keeps allocating from the pools.
  CHECK(preload_test::device_bytes_equal(kept, 1 << 16, 0x3c));
  const bool counted = preload_test::on_stand_in();
  std::uint64_t mallocs = counted ? preload_test::counter("cudaMalloc") : 0;
  for (int i = 0; i < 100; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));
    CHECK_CUDA(cudaFree(ptr));
  }
  if (counted) CHECK(preload_test::counter("cudaMalloc") - mallocs <= 2);
  CHECK_CUDA(cudaFree(kept));

  // With nothing in flight the child may free too, and it exits through exit(), running the
  // exit handlers it inherited.
  CHECK_CUDA(cudaDeviceSynchronize());
  pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) std::exit(child_body(true));
  int status = 0;
  CHECK(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::printf("ok\n");
  return 0;
}
