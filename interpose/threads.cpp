// Starting the library's own threads (see threads.h). The new thread inherits the creating
// thread's signal mask, so the mask is set to "everything blocked" around pthread_create and
// restored at once: the creating thread, one of the program's, is unaffected.
//
// Note [Library threads' CPUs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A new thread also inherits the creating thread's CPU mask, and the release worker is created
// by whichever program thread first gives a page back. A program that pins its threads, one
// per CPU, would then have the release worker share that thread's one CPU: its frees would run
// only when that thread blocks or yields, and a growth that waits for them would wait on its own
// CPU (Note [Spinning before sleeping] in release_worker.cpp).
// So the release worker and the reporter run on the CPUs any of the program's threads may use when
// they start (the reporter at the process's first CUDA call, or in the library's constructor when a
// constructor of the program's own libraries made that call): the union of their masks
// (program_cpus()), what `taskset`, a container or the program's own bindings allow. A mask read
// once, at load, would not do: the constructors of the program's libraries run first and may pin
// the main thread (an OpenMP binding), a forked child may pin itself after the fork, and a program
// may narrow its CPUs from main. Threads the library starts where reading /proc is not welcome (the
// exit snapshots) keep the creator's mask. Where the union cannot be read, or the thread cannot be
// created with it (a filtered sched_setaffinity, a cpuset that shrank meanwhile), the thread gets
// the creator's mask, as before.
#include "interpose/threads.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace poolcuda {
namespace {

// Adds `thread`'s mask to `all`; false when it cannot be read (a thread that exited meanwhile).
bool add_mask(pid_t thread, cpu_set_t* all) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(thread, sizeof cpus, &cpus) != 0) return false;
  CPU_OR(all, all, &cpus);
  return true;
}

// Whether the thread /proc/self/task/`tid` is one of the library's (named "poolcuda-...").
bool library_thread(const char* tid) {
  char path[300];  // a d_name has at most 255 bytes
  std::snprintf(path, sizeof path, "/proc/self/task/%s/comm", tid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char name[16] = {};
  const ssize_t got = ::read(fd, name, sizeof name - 1);
  ::close(fd);
  return got > 0 && std::strncmp(name, "poolcuda-", 9) == 0;
}

// The library's threads alive now, each counted by itself as it starts and ends: never more
// than the kernel counts of them (Note [pthread_exit from main] in main_exit.cpp). And whether
// one was ever asked for, set before its creation.
std::atomic<int> g_library_threads{0};
std::atomic<bool> g_library_thread_asked{false};

struct Started {
  void* (*main)(void*);
  void* argument;
};

void* run_counted(void* started) {
  const Started what = *static_cast<Started*>(started);
  std::free(started);
  g_library_threads.fetch_add(1, std::memory_order_acq_rel);
  void* result = what.main(what.argument);
  g_library_threads.fetch_sub(1, std::memory_order_acq_rel);
  return result;
}

int create_detached(void* (*main)(void*), void* argument, const cpu_set_t* cpus,
                    pthread_t* thread) {
  pthread_attr_t attributes;
  ::pthread_attr_init(&attributes);
  ::pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  if (cpus != nullptr) ::pthread_attr_setaffinity_np(&attributes, sizeof(*cpus), cpus);
  // malloc, not new: a program that replaces operator new (to count, or to fail on purpose)
  // must not see the library's own bookkeeping.
  auto* started = static_cast<Started*>(std::malloc(sizeof(Started)));
  if (started == nullptr) {
    ::pthread_attr_destroy(&attributes);
    return ENOMEM;
  }
  *started = Started{main, argument};
  // Counted by the thread itself once it runs: a count above the kernel's, even for a moment,
  // would let the exit watch take a program thread for one of the library's and end the process
  // under it (a slow pthread_create did).
  g_library_thread_asked.store(true);  // seq_cst: against pthread_exit's mark, as a pair
  const int created = ::pthread_create(thread, &attributes, &run_counted, started);
  ::pthread_attr_destroy(&attributes);
  if (created != 0) std::free(started);
  return created;
}

}  // namespace

bool program_cpus(cpu_set_t* all) {
  CPU_ZERO(all);
  bool read = add_mask(0, all);
  read = add_mask(::getpid(), all) || read;
  // Every CPU online is in the union already, so no thread can add one: the scan of /proc (a
  // system call or three per thread, about 180 us on the 2-core build machine with two threads)
  // is skipped. That is the usual case: the program pins no thread. (In a container limited to
  // some CPUs the count is the host's, and the scan runs.) The online count is read once per
  // process: glibc reads it from sysfs at every call, 40 to 50 us of a device's first
  // cudaMalloc, which counts the CPUs again (Note [Pools made ahead] in registry.cpp). A CPU
  // taken offline later only makes the scan run; after one comes online, the scan may be
  // skipped where it would have added only that CPU.
  static const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (read && CPU_COUNT(all) >= online) return true;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (const dirent* task = ::readdir(tasks)) {
      char* end = nullptr;
      const long tid = std::strtol(task->d_name, &end, 10);
      if (end == task->d_name || *end != '\0' || tid <= 0 || library_thread(task->d_name))
        continue;
      read = add_mask(static_cast<pid_t>(tid), all) || read;
    }
    ::closedir(tasks);
  }
  return read;
}

bool start_library_thread(void* (*main)(void*), void* argument, pthread_t* thread,
                          const cpu_set_t* cpus) {
  sigset_t all;
  sigset_t saved;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_t created_thread;
  int created = create_detached(main, argument, cpus, &created_thread);
  // Whatever refused the mask (glibc applies it before the thread runs any code, and returns
  // that call's error), the thread still starts, with the creator's mask.
  if (created != 0 && cpus != nullptr)
    created = create_detached(main, argument, nullptr, &created_thread);
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (created == 0 && thread != nullptr) *thread = created_thread;
  if (created == 0) library_thread_started();
  return created == 0;
}

int library_threads() { return g_library_threads.load(std::memory_order_acquire); }

bool library_thread_asked() { return g_library_thread_asked.load(); }

void forget_library_threads_in_child() {
  g_library_threads.store(0, std::memory_order_relaxed);
  g_library_thread_asked.store(false, std::memory_order_relaxed);
}

}  // namespace poolcuda
