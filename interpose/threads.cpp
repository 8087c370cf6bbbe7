// Starting the library's own threads (see threads.h). The new thread inherits the creating
// thread's signal mask, so the mask is set to "everything blocked" around pthread_create and
// restored at once: the creating thread, one of the program's, is unaffected.
//
// Note [Library threads' CPUs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A new thread also inherits the creating thread's CPU mask, and the release worker is created
// by whichever program thread first gives a page back. A program that pins its threads, one
// per CPU, would then have the release worker share one CPU with the busiest of them: its
// frees would run only when that thread blocks, a growth that waits for them would wait on its
// own CPU, and the worker would not watch for work (Note [Spinning before sleeping] in
// release_worker.cpp). So the library's threads run on the CPUs the process had when the
// library was loaded, before main: what `taskset` or a container gave the whole program, not
// what one of its threads chose later. Where that mask is no longer allowed (the process's
// cpuset shrank since), the thread is created with the creating thread's mask, as before.
#include "interpose/threads.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>

namespace poolcuda {
namespace {

struct ProcessCpus {
  cpu_set_t mask;
  bool known = false;
};

// Read at the first call, which the library's constructor makes (Note [Library threads' CPUs]).
const ProcessCpus& process_cpus() {
  static const ProcessCpus cpus = [] {
    ProcessCpus read;
    CPU_ZERO(&read.mask);
    read.known = ::sched_getaffinity(0, sizeof(read.mask), &read.mask) == 0;
    return read;
  }();
  return cpus;
}

int create_detached(void* (*main)(void*), void* argument, const cpu_set_t* cpus,
                    pthread_t* thread) {
  pthread_attr_t attributes;
  ::pthread_attr_init(&attributes);
  ::pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  if (cpus != nullptr) ::pthread_attr_setaffinity_np(&attributes, sizeof(*cpus), cpus);
  const int created = ::pthread_create(thread, &attributes, main, argument);
  ::pthread_attr_destroy(&attributes);
  return created;
}

}  // namespace

void remember_process_cpus() { process_cpus(); }

bool start_library_thread(void* (*main)(void*), void* argument, pthread_t* thread) {
  sigset_t all;
  sigset_t saved;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  const ProcessCpus& cpus = process_cpus();
  pthread_t created_thread;
  int created = create_detached(main, argument, cpus.known ? &cpus.mask : nullptr,
                                &created_thread);
  if (created == EINVAL && cpus.known)
    created = create_detached(main, argument, nullptr, &created_thread);
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (created == 0 && thread != nullptr) *thread = created_thread;
  return created == 0;
}

}  // namespace poolcuda
