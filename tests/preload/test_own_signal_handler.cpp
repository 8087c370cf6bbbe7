// Preload test: a program that handles SIGUSR1 itself gets every signal on a thread of its own
// (Note [A handler of the program's] in interpose/reporter.cpp). It installs its handler right
// after its first CUDA call, blocks the signal in the main thread (and so in the threads it
// starts), and one thread unblocks it and waits (poll) to be woken by it; the main thread
// sends it to the process three times, at once and then after the library's check of the
// handler. Plain, the kernel can deliver it only to the waiting thread. Under the library the
// reporter thread accepted it too, and ran the program's handler there: a thread waiting in
// pause() slept on and the program hung. Now the program's handler runs on the reporter thread
// once at most (the first signal, before the library noticed the new handler). An alarm fails
// the test instead of a hang.
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "check.h"

namespace {

// Atomics, not a volatile flag: the handler may run on another thread than the waiting one.
std::atomic<int> g_got{0};
std::atomic<int> g_on_library_threads{0};

void on_usr1(int) {
  const int saved = errno;
  char name[16] = {};
  ::pthread_getname_np(::pthread_self(), name, sizeof name);
  if (std::strncmp(name, "poolcuda-", 9) == 0) g_on_library_threads.fetch_add(1);
  g_got.store(1);
  errno = saved;
}

void on_alarm(int) {
  static const char message[] = "the waiting thread was never woken: the program hangs\n";
  (void)!::write(2, message, sizeof message - 1);
  ::_exit(1);
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, 1000));
  struct sigaction action {};
  action.sa_handler = on_usr1;
  ::sigemptyset(&action.sa_mask);
  CHECK(::sigaction(SIGUSR1, &action, nullptr) == 0);
  ::signal(SIGALRM, on_alarm);
  ::alarm(20);
  sigset_t usr1;
  ::sigemptyset(&usr1);
  ::sigaddset(&usr1, SIGUSR1);
  CHECK(::pthread_sigmask(SIG_BLOCK, &usr1, nullptr) == 0);
  std::atomic<bool> ready{false};
  std::atomic<int> woken{0};
  std::thread waiter([&] {
    ::pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
    ready.store(true);
    for (int i = 0; i < 3; ++i) {
      // A wait the signal interrupts, with a timeout: a signal that lands between the check and
      // the wait would leave pause() waiting for one that never comes.
      while (g_got.load() == 0) ::poll(nullptr, 0, 50);
      g_got.store(0);
      woken.fetch_add(1);
    }
  });
  while (!ready.load()) std::this_thread::yield();
  for (int i = 0; i < 3; ++i) {
    if (i == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // checked by now
    const int before = woken.load();
    CHECK(::kill(::getpid(), SIGUSR1) == 0);
    while (woken.load() == before) std::this_thread::yield();
  }
  waiter.join();
  ::alarm(0);
  CHECK(woken.load() == 3);
  CHECK_MSG(g_on_library_threads.load() <= 1,
            "the program's handler ran on a library thread after the library noticed it");
  CHECK_CUDA(cudaFree(buffer));
  std::printf("ok\n");
  return 0;
}
