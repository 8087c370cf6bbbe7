// The table of CUDA calls the library makes on its own behalf (the CUDA device, the release
// worker, stream order, captures and graph owners), with the runtime's
// signatures: through the CUDA runtime when the process has one, else through the driver
// (Note [Own calls without a runtime] in own_api.cpp). The choice is made once, at the first
// own call, and kept.
//
// Usage: own::cudaMalloc()(&ptr, size). Depends on real_cuda.h; the driver path on
// real_driver.h and driver_context.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "interpose/real_cuda.h"

#define POOLCUDA_OWN_FUNCTIONS(X)        \
  X(cudaMalloc)                          \
  X(cudaFree)                            \
  X(cudaMemGetInfo)                      \
  X(cudaDeviceSynchronize)               \
  X(cudaStreamIsCapturing)               \
  X(cudaThreadExchangeStreamCaptureMode) \
  X(cudaGetDevice)                       \
  X(cudaSetDevice)                       \
  X(cudaGetLastError)                    \
  X(cudaPeekAtLastError)                 \
  X(cudaEventCreateWithFlags)            \
  X(cudaEventRecord)                     \
  X(cudaEventQuery)                      \
  X(cudaStreamQuery)                     \
  X(cudaEventSynchronize)                \
  X(cudaEventDestroy)                    \
  X(cudaStreamWaitEvent)                 \
  X(cudaStreamGetDevice)                 \
  X(cudaStreamGetCaptureInfo)            \
  X(cudaUserObjectCreate)                \
  X(cudaUserObjectRelease)               \
  X(cudaGraphRetainUserObject)

namespace poolcuda::own {

// True when the library's own calls go through the CUDA runtime.
bool through_runtime();

// Looks up every function the pools may call with a lock of theirs held (Note [Resolved before
// any lock] in own_api.cpp). Called with no lock of the library's held.
void resolve_all();

// cudaMalloc on the library's behalf that never replaces an error the program left in the
// runtime's last-error slot (Note [Quiet growth] in own_api.cpp).
cudaError_t quiet_malloc(void** ptr, std::size_t size);

// The same calls made with the driver (own_api.cpp).
namespace via_driver {
#define POOLCUDA_OWN_DECLARATION(name) extern decltype(&::name) const name;
POOLCUDA_OWN_FUNCTIONS(POOLCUDA_OWN_DECLARATION)
#undef POOLCUDA_OWN_DECLARATION
}  // namespace via_driver

#define POOLCUDA_OWN_ACCESSOR(name) \
  inline decltype(&::name) name() { return through_runtime() ? real::name() : via_driver::name; }
POOLCUDA_OWN_FUNCTIONS(POOLCUDA_OWN_ACCESSOR)
#undef POOLCUDA_OWN_ACCESSOR

}  // namespace poolcuda::own
