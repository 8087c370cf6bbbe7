// NoSigpipe: SIGPIPE blocked in the calling thread while it lives, so that a write into a pipe
// whose reader is gone fails with EPIPE instead of killing the program (plain CUDA writes nothing
// there). A SIGPIPE such a write raised meanwhile is consumed; one that was pending before stays
// pending for the program. Used by the log's writes to standard error and by reports written
// into FIFOs and devices. Depends on POSIX only.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace poolcuda {

class NoSigpipe {
 public:
  NoSigpipe() {
    ::sigemptyset(&pipe_);
    ::sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    was_pending_ = ::sigpending(&pending) == 0 && ::sigismember(&pending, SIGPIPE) == 1;
    ::pthread_sigmask(SIG_BLOCK, &pipe_, &saved_);
  }
  ~NoSigpipe() {
    sigset_t pending;
    if (!was_pending_ && ::sigpending(&pending) == 0 && ::sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{};
      while (::sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_;
  sigset_t saved_;
  bool was_pending_ = false;
};

}  // namespace poolcuda
