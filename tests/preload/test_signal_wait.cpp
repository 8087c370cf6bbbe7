// Preload test: a program that takes SIGUSR1 itself, blocking it in every thread and waiting for
// it (sigtimedwait, a signalfd), gets every `kill -USR1` it is sent, as without the library
// (Note [A signal the program waits for] in interpose/reporter.cpp), and the library writes no
// report for them. Before, the library's reporter thread, the only one not blocking the signal,
// took each of them for a report. Once the main thread accepts the signal again, a signal
// reaching it asks for a report as usual, and the readiness mark (withdrawn while the library
// passed the signal on) comes back, so `poolcuda report` works again. A first signal that is
// queued (sigqueue) or a timer's reaches the program too, with its code and value.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "check.h"
#include "signal_report.h"

namespace {

int run() {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  CHECK(pthread_sigmask(SIG_BLOCK, &usr1, nullptr) == 0);  // every thread made below too
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 4096));

  // A thread of the program's takes the signal, as a daemon's signal thread does; the main
  // thread sends it as `kill -USR1` would, while neither of them is in a wait.
  std::atomic<int> taken{0};
  std::thread waiter([&] {
    const timespec timeout{5, 0};
    for (int i = 0; i < 3; ++i) {
      if (sigtimedwait(&usr1, nullptr, &timeout) != SIGUSR1) return;
      ++taken;
    }
    const int fd = signalfd(-1, &usr1, SFD_CLOEXEC);
    if (fd < 0) return;
    pollfd ready{fd, POLLIN, 0};
    signalfd_siginfo info{};
    if (poll(&ready, 1, 5000) == 1 && read(fd, &info, sizeof info) == sizeof info &&
        info.ssi_signo == SIGUSR1)
      ++taken;
    close(fd);
  });
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the waiter is waiting
    CHECK(kill(getpid(), SIGUSR1) == 0);
    for (int k = 0; k < 500 && taken.load() <= i; ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK_MSG(taken.load() > i, "signal " + std::to_string(i + 1) + " never reached the program");
  }
  waiter.join();
  const char* dir = std::getenv("SIGNAL_WAIT_REPORTS");
  CHECK_MSG(std::filesystem::is_empty(dir), "a report was written for a signal the program took");

  // The main thread accepts the signal again: a signal reaching it asks for a report.
  CHECK(pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr) == 0);
  const std::string report = preload_test::signal_report("SIGNAL_WAIT_REPORTS");
  CHECK(report.find("\"reuse\"") != std::string::npos);
  bool marked = false;
  for (int k = 0; k < 300 && !marked; ++k) {
    std::ifstream maps("/proc/self/maps");
    const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    marked = text.find("poolcuda-ready.") != std::string::npos;
    if (!marked) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK_MSG(marked, "the readiness mark did not come back");
  CHECK_CUDA(cudaFree(ptr));
  std::printf("child ok\n");
  return 0;
}

// The first signal the program gets is queued (sigqueue: SI_QUEUE with a value that is no
// report request) or a POSIX timer's (SI_TIMER): the program's wait gets it with its code and
// value, and no report is written. Before, only a `kill` was passed on; these were taken for
// reports and never reached the program.
int run_queued(const std::string& how) {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  CHECK(pthread_sigmask(SIG_BLOCK, &usr1, nullptr) == 0);
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 4096));
  constexpr int kValue = 1234;
  timer_t timer{};
  if (how == "queue") {
    CHECK(sigqueue(getpid(), SIGUSR1, sigval{.sival_int = kValue}) == 0);
  } else {
    sigevent event{};
    event.sigev_notify = SIGEV_SIGNAL;
    event.sigev_signo = SIGUSR1;
    event.sigev_value.sival_int = kValue;
    CHECK(timer_create(CLOCK_MONOTONIC, &event, &timer) == 0);
    const itimerspec once{{0, 0}, {0, 20 * 1000 * 1000}};
    CHECK(timer_settime(timer, 0, &once, nullptr) == 0);
  }
  siginfo_t info{};
  const timespec timeout{5, 0};
  CHECK_MSG(sigtimedwait(&usr1, &info, &timeout) == SIGUSR1, how + ": the signal never came");
  CHECK(info.si_code == (how == "queue" ? SI_QUEUE : SI_TIMER));
  CHECK(info.si_value.sival_int == kValue);
  if (how != "queue") CHECK(timer_delete(timer) == 0);
  const char* dir = std::getenv("SIGNAL_WAIT_REPORTS");
  CHECK_MSG(std::filesystem::is_empty(dir),
            how + ": a report was written for the program's signal");
  CHECK_CUDA(cudaFree(ptr));
  std::printf("%s child ok\n", how.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
#ifdef __SANITIZE_THREAD__
  // ThreadSanitizer runs a handler it deferred with the thread's mask restored afterwards, so
  // the mask the handler sets for the reporter thread through its context is lost, and a signal
  // passed on may come back to that thread before the program's wait takes it.
  preload_test::skip("ThreadSanitizer's deferred signal handlers drop the context's mask");
#endif
  if (argc == 2 && std::string(argv[1]) == "child") return run();
  if (argc == 2) return run_queued(argv[1]);
  for (const char* which : {"child", "queue", "timer"}) {
    char dir[] = "/tmp/poolcuda-signal-wait-XXXXXX";
    CHECK(mkdtemp(dir) != nullptr);
    const preload_test::ChildResult child = preload_test::run_self(
        which,
        {"POOLCUDA_CONF=report_format:json,report_path:" + std::string(dir) + "/r-%n.json",
         "SIGNAL_WAIT_REPORTS=" + std::string(dir)},
        60);
    std::system(("rm -rf '" + std::string(dir) + "'").c_str());
    std::printf("%s", child.output.c_str());
    CHECK_MSG(child.status == 0,
              std::string(which) + " exited with " + std::to_string(child.status));
  }
  std::printf("ok\n");
  return 0;
}
