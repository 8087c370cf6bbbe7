// OwnCallScope: the bracket around every CUDA call the library makes on its own behalf (Note
// [Own calls] in cuda_device.cpp): the call runs on the given device (switching the thread's
// current device for the scope, and back), in relaxed capture mode, and an error it leaves in
// the runtime's last-error slot is cleared again when the slot was clean before. Used by the
// CUDA device and the managed-memory backing.
//
// Depends on the real-function table only.
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
