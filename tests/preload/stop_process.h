// Stops the whole test process for a while, as SIGSTOP, Ctrl-Z or a batch scheduler's suspend
// do, for tests of waits whose bound passes during the stop (Note [Stopped processes] in
// pools/wait_bound.h).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

namespace preload_test {

// In a forked child of a threaded program: only async-signal-safe calls.
inline void child_sleep_ms(long ms) {
  timespec left{ms / 1000, (ms % 1000) * 1000000};
  while (nanosleep(&left, &left) != 0) {
  }
}

// Stops this whole process `after_ms` from now for `stopped_ms`, from a child; returns its pid
// (for waitpid).
inline pid_t stop_this_process(long after_ms, long stopped_ms) {
  const pid_t parent = getpid();
  const pid_t child = fork();
  CHECK_MSG(child >= 0, "fork failed");
  if (child == 0) {
    child_sleep_ms(after_ms);
    kill(parent, SIGSTOP);
    child_sleep_ms(stopped_ms);
    kill(parent, SIGCONT);
    _exit(0);
  }
  return child;
}

}  // namespace preload_test
