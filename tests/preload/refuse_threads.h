// For a preload test that makes the library's threads impossible to create: this program's own
// pthread_create, which the library's calls resolve to (the executable comes first in symbol
// lookup), fails with EAGAIN while preload_test::refuse_threads is set, and passes every other
// call to the real one. It defines pthread_create itself, so include it in one source file of
// the test program only.
#pragma once

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>

namespace preload_test {

inline std::atomic<bool> refuse_threads{false};

}  // namespace preload_test

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attributes,
                              void* (*start)(void*), void* argument) {
  using CreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<CreateFn>(::dlsym(RTLD_NEXT, "pthread_create"));
  if (preload_test::refuse_threads.load()) return EAGAIN;
  return real(thread, attributes, start, argument);
}
