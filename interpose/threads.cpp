// Starting the library's own threads (see threads.h). The new thread inherits the creating
// thread's signal mask, so the mask is set to "everything blocked" around pthread_create and
// restored at once: the creating thread, one of the program's, is unaffected.
#include "interpose/threads.h"

#include <signal.h>

namespace poolcuda {

bool start_library_thread(void* (*main)(void*), void* argument, pthread_t* thread) {
  sigset_t all;
  sigset_t saved;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_attr_t attributes;
  ::pthread_attr_init(&attributes);
  ::pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  pthread_t created_thread;
  const int created = ::pthread_create(&created_thread, &attributes, main, argument);
  ::pthread_attr_destroy(&attributes);
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (created == 0 && thread != nullptr) *thread = created_thread;
  return created == 0;
}

}  // namespace poolcuda
