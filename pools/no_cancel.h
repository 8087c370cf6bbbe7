// NoCancel: holds off thread cancellation for a scope, around the few places where the pools
// and the interposer wait inside a program's CUDA call (Note [Cancellation]). Depends on nothing
// in poolcuda.
//
// Note [Cancellation]
// ~~~~~~~~~~~~~~~~~~~
// A thread may be cancelled (pthread_cancel) at a cancellation point: a sleep, a condition
// variable's wait, a write. The library reaches some inside a cudaMalloc or cudaFree where plain
// CUDA's calls do not wait: for a fence, for the release thread, to write a log line. A
// cancellation there unwound through a reservation half done, and the entry point's catch-all
// stopped the unwinding, which the C library answers by aborting the process: a quarter of the
// runs of four threads cancelled while they allocated aborted. So those waits hold cancellation
// off (a disable and restore cost 40 ns on the build machine: never on a hit path), and a
// cancellation asked for meanwhile takes effect at the program's next cancellation point. One
// from a cancellation point inside CUDA's own calls is let through (exports_common.h).
#pragma once

#include <pthread.h>

namespace poolcuda {

class NoCancel {
 public:
  NoCancel() { ::pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_); }
  ~NoCancel() {
    int ignored = 0;
    ::pthread_setcancelstate(old_, &ignored);
  }
  NoCancel(const NoCancel&) = delete;
  NoCancel& operator=(const NoCancel&) = delete;

 private:
  int old_ = PTHREAD_CANCEL_ENABLE;
};

}  // namespace poolcuda
