// A pthread_create for test_main_thread_exit to preload after the library: it waits
// SLOW_THREAD_CREATE_MS milliseconds (none when unset) before it creates the thread, as a loaded
// machine may, so that a thread asked for is not yet running for that long.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdlib>

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attributes,
                              void* (*start)(void*), void* argument) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<Create>(::dlsym(RTLD_NEXT, "pthread_create"));
  if (const char* ms = std::getenv("SLOW_THREAD_CREATE_MS")) ::usleep(std::atoi(ms) * 1000);
  return real(thread, attributes, start, argument);
}
