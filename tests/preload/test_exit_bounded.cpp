// Preload test: the exit work never waits for a pool lock without a bound. A program's own
// signal handler calls exit() on a thread that is inside cudaMalloc, holding the device
// manager's lock (the slow_malloc shim keeps it inside the library's device allocation), with
// report_at_exit:1 and the run summary on: the process still ends, at once after the bound,
// and its exit report says which device it skipped.
//
// The program runs itself as a child with the shim preloaded after the library
// (SLOW_MALLOC_LIBRARY names it); an alarm kills a child that hangs.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "check.h"

namespace {

std::atomic<bool> g_small_done{false};

void exit_on_signal(int) { std::exit(0); }

int child() {
  ::alarm(20);  // a hang fails the test (SIGALRM's default action ends the child)
  // As `poolcuda run` asks: this process writes the summary at exit.
  CHECK(::setenv("POOLCUDA_RUN_SUMMARY", std::to_string(::getpid()).c_str(), 1) == 0);
  using ArmFn = void (*)(std::size_t);
  using EnteredFn = bool (*)();
  const auto arm = reinterpret_cast<ArmFn>(::dlsym(RTLD_DEFAULT, "slow_malloc_arm"));
  const auto entered = reinterpret_cast<EnteredFn>(::dlsym(RTLD_DEFAULT, "slow_malloc_entered"));
  CHECK_MSG(arm != nullptr && entered != nullptr, "the slow_malloc shim is not preloaded");

  void* warm = nullptr;
  CHECK_CUDA(cudaMalloc(&warm, 4096));  // the manager and a small page exist
  struct sigaction action {};
  action.sa_handler = exit_on_signal;
  ::sigemptyset(&action.sa_mask);
  CHECK(::sigaction(SIGUSR2, &action, nullptr) == 0);

  arm(32u << 20);
  std::thread holder([] {
    void* ptr = nullptr;
    (void)cudaMalloc(&ptr, 64u << 20);  // grows a pool: waits in the shim, under the lock
  });
  while (!entered()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Precondition: the lock really is held (a small request, served without the driver, waits).
  std::thread small([] {
    void* ptr = nullptr;
    (void)cudaMalloc(&ptr, 4096);
    g_small_done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_MSG(!g_small_done.load(),
            "precondition: a device allocation no longer holds the manager's lock; this test "
            "needs another way to hold it");
  std::printf("holding the lock; exit from a signal handler\n");
  std::fflush(stdout);
  CHECK(::pthread_kill(holder.native_handle(), SIGUSR2) == 0);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "child") return child();

  const char* shim = std::getenv("SLOW_MALLOC_LIBRARY");
  const char* preload = std::getenv("LD_PRELOAD");
  CHECK(shim != nullptr && preload != nullptr);
  const auto start = std::chrono::steady_clock::now();
  preload_test::ChildResult result = preload_test::run_self(
      "child", {"LD_PRELOAD=" + std::string(preload) + ":" + shim,
                "POOLCUDA_CONF=report_at_exit:1"});
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
  std::printf("%s", result.output.c_str());
  CHECK_MSG(result.status == 0, "the child exited with " + std::to_string(result.status) +
                                    " (142: it hung and the alarm ended it)");
  CHECK_MSG(seconds.count() < 15, "the exit took " + std::to_string(seconds.count()) + " s");
  CHECK_MSG(result.output.find("poolcuda report #1") != std::string::npos, "no exit report");
  CHECK_MSG(result.output.find("skipped device 0: its pools stayed locked") != std::string::npos,
            "the report does not say what it skipped");
  CHECK_MSG(result.output.find("device 0: no summary (its pools stayed locked at exit)") !=
                std::string::npos,
            "the summary does not say what it skipped");
  std::printf("ok: exited in %.1f s\n", seconds.count());
  return 0;
}
