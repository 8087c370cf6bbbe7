// What every exported entry point shares: the export attribute, the re-entry guard (calls
// made from inside the library, and calls in a forked child, go straight to the real function)
// and guarded(), which keeps C++ exceptions from crossing an entry point.
//
// Depends on lifecycle.h only.
#pragma once

#include <cuda_runtime_api.h>

#include <new>

#include "interpose/lifecycle.h"

#define POOLCUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace poolcuda {

// Set while a hook runs on this thread: a CUDA call the real runtime makes through an exported
// symbol (or one the pools make) must not re-enter the pools. initial-exec: no allocation and
// no lock on first access, which matters inside a preloaded library.
inline __attribute__((tls_model("initial-exec"))) thread_local bool t_inside_hook = false;

inline bool bypass() { return t_inside_hook || passthrough(); }

class InsideHook {
 public:
  InsideHook() { t_inside_hook = true; }
  ~InsideHook() { t_inside_hook = false; }
  InsideHook(const InsideHook&) = delete;
  InsideHook& operator=(const InsideHook&) = delete;
};

template <typename Body>
inline cudaError_t guarded(Body&& body) noexcept {
  try {
    InsideHook inside;
    return body();
  } catch (const std::bad_alloc&) {
    return cudaErrorMemoryAllocation;
  } catch (...) {
    return cudaErrorUnknown;
  }
}

}  // namespace poolcuda

