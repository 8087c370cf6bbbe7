// The program the CLI tests run under `poolcuda run` with the real library: plain C++ against
// the CUDA runtime. Usage: cli_target MODE SECONDS. Every mode but `nocuda` first makes one CUDA
// call (cudaFree(nullptr)), which installs the library's handler and starts its reporter. MODE is
//   sleep    sleeps;
//   nocuda   sleeps, without that call;
//   cuda     allocates (64 MiB freed, 1 MiB kept) before it says ready, then sleeps;
//   handler  installs its own SIGUSR1 handler after the library's, then sleeps;
//   default  sets SIGUSR1 back to its default action after the library installed its handler,
//            then sleeps;
//   poll     blocks in poll() on its main thread and in nanosleep() on a second thread, and
//            at the end prints how many of those calls failed with EINTR ("eintr N").
// It prints "ready" (flushed) once set up. Sleeps are restarted after EINTR, so only `poll`
// mode cares about interruptions.
#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

extern "C" const char* target_constructor_action();  // target_constructor.cpp

namespace {

using Clock = std::chrono::steady_clock;

void own_handler(int) {}

void sleep_until(Clock::time_point end) {
  while (Clock::now() < end) {
    timespec pause{0, 20 * 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
}

int cuda_work() {
  void* kept = nullptr;
  void* freed = nullptr;
  if (cudaMalloc(&freed, 64 << 20) != cudaSuccess || cudaMalloc(&kept, 1 << 20) != cudaSuccess ||
      cudaFree(freed) != cudaSuccess) {
    std::printf("cuda failed\n");
    return 1;
  }
  return 0;
}

// Counts EINTR from poll() (main thread) and nanosleep() (second thread) until `end`.
int poll_until(Clock::time_point end) {
  std::atomic<int> interrupted{0};
  std::thread sleeper([&] {
    while (Clock::now() < end) {
      timespec pause{0, 50 * 1000 * 1000};
      if (nanosleep(&pause, nullptr) != 0 && errno == EINTR) ++interrupted;
    }
  });
  while (Clock::now() < end) {
    if (poll(nullptr, 0, 50) < 0 && errno == EINTR) ++interrupted;
  }
  sleeper.join();
  std::printf("eintr %d\n", interrupted.load());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cli_target sleep|nocuda|cuda|handler|default|poll SECONDS\n");
    return 2;
  }
  const char* mode = argv[1];
  const Clock::time_point end = Clock::now() + std::chrono::seconds(std::atoi(argv[2]));
  if (std::strcmp(mode, "nocuda") != 0 && cudaFree(nullptr) != cudaSuccess) {
    std::printf("cuda failed\n");
    return 1;
  }
  if (std::strcmp(mode, "cuda") == 0 && cuda_work() != 0) return 1;
  if (std::strcmp(mode, "handler") == 0) {
    struct sigaction action {};
    action.sa_handler = own_handler;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, nullptr);
  }
  if (std::strcmp(mode, "default") == 0) signal(SIGUSR1, SIG_DFL);
  std::printf("ready (constructor: %s)\n", target_constructor_action());
  std::fflush(stdout);
  if (std::strcmp(mode, "poll") == 0) return poll_until(end);
  sleep_until(end);
  return 0;
}
