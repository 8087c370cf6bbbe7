// A sem_init for test_handler_during_start to preload after the library: the library's report
// signal set-up calls sem_init between its look at SIGUSR1's disposition and the install of its
// own handler, so a handler installed here stands for one another thread of the program's
// installs at that moment. Only the first call installs it, and only when
// HANDLER_DURING_START is set.
#include <dlfcn.h>
#include <semaphore.h>
#include <signal.h>

#include <cstdlib>

extern "C" void handler_during_start_handler(int) {}

extern "C" int sem_init(sem_t* semaphore, int shared, unsigned value) {
  using Init = int (*)(sem_t*, int, unsigned);
  static const auto real = reinterpret_cast<Init>(::dlsym(RTLD_NEXT, "sem_init"));
  static bool installed = false;
  if (!installed && std::getenv("HANDLER_DURING_START") != nullptr) {
    installed = true;
    struct sigaction action {};
    action.sa_handler = &handler_during_start_handler;
    ::sigemptyset(&action.sa_mask);
    ::sigaction(SIGUSR1, &action, nullptr);
  }
  return real(semaphore, shared, value);
}
