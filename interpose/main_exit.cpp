// The exported pthread_exit (Note [pthread_exit from main]).
//
// Note [pthread_exit from main]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A program's main thread may end with pthread_exit() and leave its other threads to finish: the
// process ends when its last thread does, with glibc calling exit(0) on that thread. The library's
// own threads (the reporter, the release worker) run for the life of the process, so that last
// thread was never the program's: the process lived on with only the library's threads, which block
// every signal, and neither its end nor Ctrl-C, SIGTERM or SIGHUP ever came (only SIGKILL ended
// it). So the library exports pthread_exit, and once the main thread has called it while a thread
// of the library's lives (at once, or when the first one starts later), a thread of the library's
// watches for the process to hold nothing but the library's threads, and then calls exit(0) as
// glibc would have, with the main thread's signal mask: the program's atexit handlers and static
// destructors run, and the signals they expect reach them. "Nothing but": the main thread is a
// zombie (its thread-exit work done), and the kernel's count of the process's threads (which keeps
// the exited main thread until the process ends), read with its state in one read of the main
// thread's stat, is one more than the library's own count of its live threads. A program thread
// that starts another just before it ends is counted in one of them at every moment, so the watch
// never ends a process that still runs (a listing of /proc/self/task could miss the new thread).
// Each library thread counts itself once it runs, and uncounts itself before it ends: the
// library's count is never above the kernel's count of its threads. (Counted before
// pthread_create, a thread not yet made stood in for a program thread that still ran, and a slow
// creation let the watch end the process under it.) A forked child starts with neither a count
// nor a watch: none of the parent's threads came along.
// The watch polls every kFirstPollMillis, backing off to kLastPollMillis. A process whose library
// never started a thread (no CUDA call) starts none here either; other threads' pthread_exit, and
// all the main thread's does, is the C library's unchanged.
//
// Depends on the real dlsym, the library's threads and the log.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "interpose/dl_real.h"
#include "interpose/log.h"
#include "interpose/threads.h"

namespace poolcuda {
namespace {

constexpr int kFirstPollMillis = 5;
constexpr int kLastPollMillis = 200;

std::atomic<bool> g_main_exited{false};
std::atomic<bool> g_watching{false};
// The main thread's signal mask as it called pthread_exit: the exit work runs under it.
sigset_t g_main_mask;

// The main thread's state and the process's threads as the kernel counts them (fields 3 and 20
// of the main thread's stat), read at once; false when they cannot be read.
bool read_main_stat(char* state, int* threads) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(::getpid()));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char stat[1024] = {};
  const ssize_t got = ::read(fd, stat, sizeof stat - 1);
  ::close(fd);
  if (got <= 0) return false;
  // After the name's closing parenthesis (the name may hold any): " state ppid ...".
  const char* at = std::strrchr(stat, ')');
  if (at == nullptr || at[1] != ' ' || at[2] == '\0') return false;
  *state = at[2];
  for (int field = 2; field < 20 && at != nullptr; ++field) at = std::strchr(at + 1, ' ');
  if (at == nullptr) return false;
  *threads = std::atoi(at + 1);
  return true;
}

void* watch_for_last_thread(void*) {
  ::pthread_setname_np(::pthread_self(), "poolcuda-exit");
  int wait = kFirstPollMillis;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(wait));
    wait = std::min(wait * 2, kLastPollMillis);
    // The exited main thread stays counted until the process ends: it and the library's.
    char state = 0;
    int threads = 0;
    if (read_main_stat(&state, &threads) && state == 'Z' && threads <= 1 + library_threads()) {
      // As on the program's last thread: its signals reach the exit work (a SIGTERM during a
      // slow destructor, an alarm an atexit handler waits for, SIGPIPE as a flush fails).
      ::pthread_sigmask(SIG_SETMASK, &g_main_mask, nullptr);
      std::exit(0);
    }
  }
}

void start_watch() {
  if (g_watching.exchange(true, std::memory_order_acq_rel)) return;
  if (!start_library_thread(&watch_for_last_thread, nullptr, nullptr)) {
    log_line(LogLevel::basic,
             "cannot start a thread to end the process once the program's threads have ended; "
             "it will live on with the library's");
  }
}

}  // namespace

void library_thread_started() {
  if (g_main_exited.load()) start_watch();
}

void forget_exit_watch_in_child() {
  g_main_exited.store(false, std::memory_order_relaxed);
  g_watching.store(false, std::memory_order_relaxed);
}

}  // namespace poolcuda

extern "C" __attribute__((visibility("default"), noreturn)) void pthread_exit(void* value) {
  using ExitFn = void (*)(void*);
  static const auto real =
      reinterpret_cast<ExitFn>(poolcuda::dl::real_dlsym(RTLD_NEXT, "pthread_exit"));
  if (::getpid() == ::gettid()) {
    ::pthread_sigmask(SIG_BLOCK, nullptr, &poolcuda::g_main_mask);
    poolcuda::g_main_exited.store(true);  // seq_cst: against library_thread_asked()
    if (poolcuda::library_thread_asked()) poolcuda::start_watch();
  }
  real(value);
  __builtin_unreachable();
}
