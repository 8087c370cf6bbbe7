// Starting one of the library's own threads (the reporter, the release worker, bounded work):
// detached, since the library never joins them (Note [Exit] in lifecycle.cpp), and with every
// signal blocked, so that no signal meant for the program runs its handler on a thread the
// program does not know (a thread that wants one signal unblocks it itself), and on the CPUs
// the process had when the library was loaded (Note [Library threads' CPUs] in threads.cpp).
//
// Depends on pthreads only.
#pragma once

#include <pthread.h>

namespace poolcuda {

// Creates a detached thread running `main(argument)` with every signal blocked. False when the
// thread could not be created (nothing runs then). `thread` may be nullptr.
bool start_library_thread(void* (*main)(void*), void* argument, pthread_t* thread);

// Reads the CPU mask the library's threads will get: the library's constructor calls it, before
// the program's main can pin its threads. Later calls change nothing.
void remember_process_cpus();

}  // namespace poolcuda
