// OwnCallScope: how the library makes a CUDA call on its own behalf without the program
// noticing (Note [Own calls]). Used by every part of interpose/ that calls the real runtime for
// the pools (the CUDA device, the release worker, the managed slabs).
//
// Note [Own calls]
// Calls made on the library's own behalf must not change what the program observes: each runs
// on the scope's device (switching the thread's current device and back when they differ),
// in relaxed capture mode (a global-mode capture on another thread forbids "unsafe" calls on
// ours), and an error it leaves in the runtime's last-error slot is cleared again when the slot
// was clean before. (A slot already holding the program's error cannot be restored if one of
// our calls replaced it; our calls fail only when the device itself is failing.) When the
// device cannot be made current, ok() is false: the calls would run on the wrong device, so
// allocate answers `failed`, fence_record kNoFence, memory_info nothing and no tail is recorded.
// The program's device is set back whenever a switch was attempted (a failed cudaSetDevice may
// still have changed it, e.g. under a sticky error).
//
// Depends on the CUDA runtime header and the real-function table only.
#pragma once

#include <cuda_runtime_api.h>

#include "interpose/real_cuda.h"

namespace poolcuda {

class OwnCallScope {
 public:
  explicit OwnCallScope(int device) {
    prior_error_ = real::cudaPeekAtLastError()();
    int current = -1;
    if (real::cudaGetDevice()(&current) != cudaSuccess) {
      ok_ = false;
    } else if (current != device) {
      restore_device_ = current;
      ok_ = real::cudaSetDevice()(device) == cudaSuccess;
    }
    mode_ = cudaStreamCaptureModeRelaxed;
    mode_switched_ = real::cudaThreadExchangeStreamCaptureMode()(&mode_) == cudaSuccess;
  }
  ~OwnCallScope() {
    if (mode_switched_) real::cudaThreadExchangeStreamCaptureMode()(&mode_);
    if (restore_device_ >= 0) real::cudaSetDevice()(restore_device_);
    if (prior_error_ == cudaSuccess && real::cudaPeekAtLastError()() != cudaSuccess) {
      real::cudaGetLastError()();
    }
  }
  OwnCallScope(const OwnCallScope&) = delete;
  OwnCallScope& operator=(const OwnCallScope&) = delete;

  // False when the scope's device could not be made current.
  bool ok() const { return ok_; }

 private:
  bool ok_ = true;
  cudaError_t prior_error_ = cudaSuccess;
  int restore_device_ = -1;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool mode_switched_ = false;
};

}  // namespace poolcuda
