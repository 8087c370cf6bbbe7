// Preload test: children forked before their parent made any CUDA call keep the pools (Note
// [Fork] in interpose/lifecycle.cpp), as a prefork server's workers or a process pool's do.
// Such a child is the program alone until its first CUDA call (the report signal's default
// disposition, no readiness mark); from then on its allocations are pooled, its data holds, its
// own reporter answers, and it writes its own exit report. A grandchild forked before the
// child's first call keeps the pools too; one forked after it passes through, as any child of a
// process that used CUDA does, and writes no report. A child that never calls CUDA writes
// nothing at all, even at exit. Two threads that fork while a third makes the first CUDA call
// leave the reporter working. The parent, untouched by all this (no handler, no mark, as any
// process before its first CUDA call), pools its own allocations afterwards.
//
// Run with report_at_exit:1 and report_path REPORT_DIR/prefork-%p.txt.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "check.h"

namespace {

bool has_ready_mark() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("poolcuda-ready.") != std::string::npos;
}

bool wait_for_ready_mark() {
  for (int i = 0; i < 500; ++i) {
    if (has_ready_mark()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool signal_is_default() {
  struct sigaction action {};
  if (::sigaction(SIGUSR1, nullptr, &action) != 0) return false;
  return (action.sa_flags & SA_SIGINFO) == 0 && action.sa_handler == SIG_DFL;
}

std::string report_of(pid_t pid) {
  return std::string(std::getenv("REPORT_DIR")) + "/prefork-" + std::to_string(pid) + ".txt";
}

// Waits for `pid`; its exit status, or 100 + the signal that ended it.
int status_of(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return 99;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// 200 allocations of 4 KiB and one kept 64 KiB buffer: exit status 0 when the pools served them
// (at most a few real cudaMalloc calls) and the kept bytes held.
int allocate_pooled() {
  const std::uint64_t mallocs = preload_test::counter("cudaMalloc");
  void* kept = nullptr;
  if (cudaMalloc(&kept, 1 << 16) != cudaSuccess) return 20;
  if (cudaMemset(kept, 0x5a, 1 << 16) != cudaSuccess) return 21;
  for (int i = 0; i < 200; ++i) {
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, 4096) != cudaSuccess) return 22;
    if (cudaFree(ptr) != cudaSuccess) return 23;
  }
  if (preload_test::counter("cudaMalloc") - mallocs > 3) return 24;
  if (!preload_test::device_bytes_equal(kept, 1 << 16, 0x5a)) return 25;
  return cudaFree(kept) == cudaSuccess ? 0 : 26;
}

// A child of a process that used CUDA: its call reaches the real runtime.
int passes_through() {
  ::alarm(30);
  const std::uint64_t mallocs = preload_test::counter("cudaMalloc");
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, 4096) != cudaSuccess) return 40;
  return preload_test::counter("cudaMalloc") == mallocs + 1 ? 0 : 41;
}

// The body of a child forked before any CUDA call; exits through exit(), which writes its report.
int fresh_child(bool fork_more) {
  ::alarm(30);
  if (!signal_is_default()) return 10;
  if (has_ready_mark()) return 11;
  if (fork_more) {
    const pid_t early = ::fork();
    if (early == 0) std::exit(fresh_child(false));
    if (const int status = status_of(early); status != 0) return 50 + status % 50;
    if (!std::filesystem::exists(report_of(early))) return 12;
    std::filesystem::remove(report_of(early));
  }
  if (const int status = allocate_pooled(); status != 0) return status;
  // Its own reporter started with its first call.
  if (!wait_for_ready_mark()) return 13;
  if (signal_is_default()) return 14;
  if (fork_more) {
    const pid_t late = ::fork();
    if (late == 0) std::exit(passes_through());
    if (const int status = status_of(late); status != 0) return 60 + status % 40;
    if (std::filesystem::exists(report_of(late))) return 15;
  }
  return 0;
}

// A child that makes no CUDA call: nothing from the library on its stderr, even at exit.
bool silent_child() {
  char path[] = "/tmp/poolcuda-prefork-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return false;
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(fd, 2);
    std::exit(0);
  }
  const int status = status_of(child);
  ::close(fd);
  std::ifstream written(path);
  std::stringstream text;
  text << written.rdbuf();
  ::unlink(path);
  // Only the library's lines count: a sanitizer's leak check may speak at exit too.
  return status == 0 && text.str().find("poolcuda:") == std::string::npos;
}

// In a fresh child, two threads fork (their children exit at once) while a third makes the
// first CUDA call; then the report signal must still get a report. Exit status 0 when it does.
[[maybe_unused]] int forks_around_the_first_call(int round) {
  ::alarm(30);
  auto forker = [](void*) -> void* {
    for (int i = 0; i < 20; ++i) {
      const pid_t child = ::fork();
      if (child == 0) ::_exit(0);
      if (status_of(child) != 0) return reinterpret_cast<void*>(1);
    }
    return nullptr;
  };
  pthread_t a, b;
  if (::pthread_create(&a, nullptr, forker, nullptr) != 0) return 30;
  if (::pthread_create(&b, nullptr, forker, nullptr) != 0) return 31;
  std::this_thread::sleep_for(std::chrono::microseconds(round * 97 % 1500));
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, 8192) != cudaSuccess || cudaFree(ptr) != cudaSuccess) return 32;
  void* failed_a = nullptr;
  void* failed_b = nullptr;
  ::pthread_join(a, &failed_a);
  ::pthread_join(b, &failed_b);
  if (failed_a != nullptr || failed_b != nullptr) return 33;
  if (::kill(::getpid(), SIGUSR1) != 0) return 34;
  for (int i = 0; i < 500; ++i) {
    if (std::filesystem::exists(report_of(::getpid()))) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 35;  // the reporter never wrote it
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("counts real calls on the stand-in");

  // No CUDA call yet: the program alone, as its children are (Note [Silent processes]).
  CHECK(signal_is_default() && !has_ready_mark());

  for (int round = 0; round < 3; ++round) {
    const pid_t child = ::fork();
    CHECK(child >= 0);
    if (child == 0) std::exit(fresh_child(round == 0));
    const int status = status_of(child);
    CHECK_MSG(status == 0, "child status " + std::to_string(status));
    CHECK_MSG(std::filesystem::exists(report_of(child)), "no exit report from the child");
    std::filesystem::remove(report_of(child));
  }

  CHECK_MSG(silent_child(), "a child that made no CUDA call was not silent");

#ifndef __SANITIZE_THREAD__  // it loses track of threads made in a child of a threaded process
  for (int round = 0; round < 30; ++round) {
    const pid_t child = ::fork();
    CHECK(child >= 0);
    if (child == 0) ::_exit(forks_around_the_first_call(round));
    const int status = status_of(child);
    CHECK_MSG(status == 0, "round " + std::to_string(round) + ": status " + std::to_string(status));
    std::filesystem::remove(report_of(child));
  }
#endif

  CHECK(signal_is_default() && !has_ready_mark());
  CHECK(allocate_pooled() == 0);
  CHECK(signal_is_default() == false && wait_for_ready_mark());
  std::printf("ok\n");
  return 0;
}
