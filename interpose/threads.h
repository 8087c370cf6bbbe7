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

// Whether a thread of the program's (not one of the library's, nor one that has exited and
// awaits its reaping) is left in the process. True when /proc cannot be read.
bool program_threads_left();

}  // namespace poolcuda
