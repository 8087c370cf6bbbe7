// Starting one of the library's own threads (the reporter, the release worker, bounded work):
// detached, since the library never joins them (Note [Exit] in lifecycle.cpp), and with every
// signal blocked, so that no signal meant for the program runs its handler on a thread the
// program does not know (a thread that wants one signal unblocks it itself). The release worker
// runs on the CPUs the program's threads may use (Note [Library threads' CPUs] in threads.cpp).
//
// Depends on pthreads and /proc only.
#pragma once

#include <pthread.h>
#include <sched.h>

namespace poolcuda {

// Creates a detached thread running `main(argument)` with every signal blocked, on `cpus` when
// given (with the creator's mask if that is refused). False when the thread could not be
// created (nothing runs then). `thread` may be nullptr.
bool start_library_thread(void* (*main)(void*), void* argument, pthread_t* thread,
                          const cpu_set_t* cpus = nullptr);

// The CPUs any of the program's threads may run on now: the union of the masks of the
// process's threads, the library's own (named "poolcuda-...") left out. False when no mask
// could be read. Reads /proc: not for a signal handler or the library's constructor.
bool program_cpus(cpu_set_t* cpus);

// How many of the library's threads are alive (running and not yet returned); never more than
// exist.
int library_threads();

// Whether a library thread was ever asked for (it may not run yet).
bool library_thread_asked();

// In a forked child, which has none of the parent's threads: none of the library's either.
void forget_library_threads_in_child();

// Called after each library thread starts (main_exit.cpp: Note [pthread_exit from main]).
void library_thread_started();

// In a forked child, whose one thread is its main thread, alive: no exit to watch for.
void forget_exit_watch_in_child();

}  // namespace poolcuda
