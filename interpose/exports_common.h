// What every exported entry point shares: the export attribute, the re-entry guard
// (hook_guard.h: calls made from inside the library, and calls in a forked child, go straight to
// the real function) and guarded(), which keeps C++ exceptions from crossing an entry point: a
// failed host allocation inside the library becomes cudaErrorMemoryAllocation (CUDA_ERROR_OUT_OF_
// MEMORY has the same number), anything else cudaErrorUnknown (CUDA_ERROR_UNKNOWN likewise).
// A runtime call's failed host allocation also leaves cudaErrorMemoryAllocation in the thread's
// last-error slot, as the runtime's own failures do (Note [Last error] in hooks.cpp).
//
// Depends on hook_guard.h, deferred_frees.h, and on hooks.cpp for the last-error slot.
#pragma once

#include <cuda_runtime_api.h>

#include <cxxabi.h>

#include <new>
#include <type_traits>

#include "interpose/deferred_frees.h"
#include "interpose/hook_guard.h"

#define POOLCUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace poolcuda {

namespace hooks {
cudaError_t raise_out_of_memory(void** out);  // hooks.h
}  // namespace hooks

// Runs `body` under the re-entry guard; its result type is cudaError_t or CUresult. Also marks
// the process as one that uses CUDA through the library (Note [Silent processes] in
// lifecycle.cpp). Only a thread's cancellation unwinds through it. A cancellation's unwind has no
// exception object, so the handler's reference binds to null: UBSan's checks are off here.
template <typename Body>
__attribute__((no_sanitize_undefined)) inline auto guarded(Body&& body) -> decltype(body()) {
  using Result = decltype(body());
  try {
    note_cuda_call();  // a process's first call allocates: a failure there is caught too
    Result result;
    {
      InsideHook inside;
      result = body();
    }
    // Frees a signal handler made while the call ran (Note [Frees from inside a call]).
    if (deferred::waiting()) deferred::drain();
    return result;
  } catch (const abi::__forced_unwind&) {
    throw;  // a cancellation inside CUDA's own call (Note [Cancellation] in no_cancel.h)
  } catch (const std::bad_alloc&) {
    // Driver calls leave the runtime's slot alone; a runtime call's refusal is raised there.
    if constexpr (std::is_same_v<Result, cudaError_t>) {
      try {
        InsideHook inside;
        hooks::raise_out_of_memory(nullptr);
      } catch (const abi::__forced_unwind&) {
        throw;
      } catch (...) {  // the real call's own host allocation failed too: the answer stands
      }
    }
    return static_cast<Result>(cudaErrorMemoryAllocation);
  } catch (...) {
    return static_cast<Result>(cudaErrorUnknown);
  }
}

}  // namespace poolcuda
