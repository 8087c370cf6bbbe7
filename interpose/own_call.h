// OwnCallScope: how the library makes a CUDA call on its own behalf without the program
// noticing (Note [Own calls]), and RelaxedCaptureScope, its capture-mode part alone. Used by
// every part of interpose/ that calls CUDA for the pools (the CUDA device, the release worker,
// stream order, graph owners, the managed slabs) and by the hooks' capture-safe queries.
//
// Note [Own calls]
// Calls made on the library's own behalf must not change what the program observes: each runs
// on the scope's device (switching the thread's current device and back when they differ),
// in relaxed capture mode (a global-mode capture on another thread forbids "unsafe" calls on
// ours), and an error it leaves in the runtime's last-error slot is cleared again when the slot
// was clean before. (A slot already holding the program's error cannot be restored if one of
// our calls replaced it, so the one call that fails in normal operation, a pool's growth on a
// full device, never goes through the slot: Note [Quiet growth] in own_api.cpp. The others fail
// only when the device itself is failing.) When the
// device cannot be made current, ok() is false: the calls would run on the wrong device, so
// allocate answers `failed`, fence_record kNoFence, memory_info nothing and no tail is recorded.
// The program's device is set back whenever a switch was attempted (a failed cudaSetDevice may
// still have changed it, e.g. under a sticky error), and then the thread's driver context
// itself, if it differs from the one the scope found (cudaSetDevice binds the device's primary
// context: a current context of the program's own, from cuCtxCreate, was lost); and a thread
// that had no context has none again (any runtime call binds one). Otherwise the program's next
// driver calls ran in a primary context where plain CUDA would have used its own or refused
// them. (A context of cuCtxCreate that another thread destroyed cannot be made current again:
// docs/limits.md.) The hooks bind a context where the program's own runtime call would have
// (Note [A thread's first call] in hooks.cpp). Without a runtime the same calls go to the
// driver, where "the device" is the primary context (Note [Own calls without a runtime] in
// own_api.cpp). The hooks' re-entry guard covers the scope: the real runtime reaches the driver
// through the driver hooks, and calls made for the pools must not enter them again.
//
// Depends on the CUDA runtime header, the own-call table, the real driver's table (for the
// thread's context) and the re-entry guard only.
#pragma once

#include <cuda_runtime_api.h>

#include "interpose/hook_guard.h"
#include "interpose/own_api.h"
#include "interpose/real_driver.h"

namespace poolcuda {

// Relaxed capture mode alone, for calls whose answer or error is meant for the program (a
// refusal raised in the last-error slot) or that run on no particular device (a stream's
// device): a global or thread-local capture would judge them unsafe and be invalidated. A
// thread that had no driver context has none again when the scope ends (Note [Own calls]).
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope() {
    have_context_ = real_driver::cuCtxGetCurrent()(&context_) == CUDA_SUCCESS;
    switched_ = own::cudaThreadExchangeStreamCaptureMode()(&mode_) == cudaSuccess;
  }
  ~RelaxedCaptureScope() {
    if (switched_) own::cudaThreadExchangeStreamCaptureMode()(&mode_);
    // Only a thread that had none can have been given a context by the calls alone; a device
    // switch puts its own back (OwnCallScope).
    if (have_context_ && context_ == nullptr) restore_context();
  }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

  // Makes the thread's context the one the scope found, if it is another now.
  void restore_context() const {
    CUcontext now = nullptr;
    if (have_context_ && real_driver::cuCtxGetCurrent()(&now) == CUDA_SUCCESS && now != context_)
      real_driver::cuCtxSetCurrent()(context_);
  }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool switched_ = false;
  CUcontext context_ = nullptr;  // the thread's driver context when the scope began
  bool have_context_ = false;
};

class OwnCallScope {
 public:
  explicit OwnCallScope(int device) {
    prior_error_ = own::cudaPeekAtLastError()();
    int current = -1;
    if (own::cudaGetDevice()(&current) != cudaSuccess) {
      ok_ = false;
    } else if (current != device) {
      restore_device_ = current;
      ok_ = own::cudaSetDevice()(device) == cudaSuccess;
    }
  }
  ~OwnCallScope() {
    if (restore_device_ >= 0) {
      own::cudaSetDevice()(restore_device_);
      relaxed_.restore_context();  // cudaSetDevice made the device's primary context current
    }
    if (prior_error_ == cudaSuccess && own::cudaPeekAtLastError()() != cudaSuccess) {
      own::cudaGetLastError()();
    }
  }
  OwnCallScope(const OwnCallScope&) = delete;
  OwnCallScope& operator=(const OwnCallScope&) = delete;

  // False when the scope's device could not be made current.
  bool ok() const { return ok_; }

 private:
  InsideHook inside_;
  // Before anything else, so that the device switch and its undoing run relaxed too, and the
  // thread's context is put back after both.
  RelaxedCaptureScope relaxed_;
  bool ok_ = true;
  cudaError_t prior_error_ = cudaSuccess;
  int restore_device_ = -1;
};

}  // namespace poolcuda
