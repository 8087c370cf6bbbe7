// The exported pthread_exit (Note [pthread_exit from main]).
//
// Note [pthread_exit from main]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A program's main thread may end with pthread_exit() and leave its other threads to finish:
// the process ends when its last thread does, with glibc calling exit(0) on that thread. The
// library's own threads (the reporter, the release worker) run for the life of the process, so
// that last thread was never the program's: the process lived on with only the library's
// threads, which block every signal, and neither its end nor Ctrl-C, SIGTERM or SIGHUP ever came
// (only SIGKILL ended it). So the library exports pthread_exit: when the main thread calls it, a
// thread of the library's watches, every kPollMillis, for the program's threads to be gone
// (threads named "poolcuda-..." and exited ones not counted), and then calls exit(0) as glibc
// would have: the program's atexit handlers and static destructors run. Other threads'
// pthread_exit, and everything the main thread's does, is the C library's unchanged.
//
// Depends on the real dlsym, the library's threads and the log.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "interpose/dl_real.h"
#include "interpose/log.h"
#include "interpose/threads.h"

namespace poolcuda {
namespace {

constexpr int kPollMillis = 10;

void* watch_for_last_thread(void*) {
  ::pthread_setname_np(::pthread_self(), "poolcuda-exit");
  while (program_threads_left())
    std::this_thread::sleep_for(std::chrono::milliseconds(kPollMillis));
  std::exit(0);
}

}  // namespace
}  // namespace poolcuda

extern "C" __attribute__((visibility("default"), noreturn)) void pthread_exit(void* value) {
  using ExitFn = void (*)(void*);
  static const auto real =
      reinterpret_cast<ExitFn>(poolcuda::dl::real_dlsym(RTLD_NEXT, "pthread_exit"));
  if (::getpid() == ::gettid() &&
      !poolcuda::start_library_thread(&poolcuda::watch_for_last_thread, nullptr, nullptr)) {
    poolcuda::log_line(poolcuda::LogLevel::basic,
                       "cannot start a thread to end the process once the program's threads "
                       "have ended; it will live on with the library's");
  }
  real(value);
  __builtin_unreachable();
}
