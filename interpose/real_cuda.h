// The table of real CUDA runtime functions. Each entry is resolved on first use with the C
// library's own dlsym (dl_real.h), RTLD_NEXT from this library (falling back to a libcudart that
// was loaded privately, see real_cuda.cpp), once per process, lock-free and thread-safe: racing
// threads store the same pointer. A function that cannot be found is remembered as missing (one
// log line, no further lookups) and answers cudaErrorSharedObjectSymbolNotFound instead of
// crashing.
//
// Usage: real::cudaMalloc()(&ptr, size). Depends on the CUDA runtime header and dl_real.h.
#pragma once

#include <cuda_runtime_api.h>

// Every real function the library calls. Add a name here and real::<name>() exists.
#define POOLCUDA_REAL_FUNCTIONS(X)          \
  X(cudaMalloc)                             \
  X(cudaFree)                               \
  X(cudaMemGetInfo)                         \
  X(cudaDeviceReset)                        \
  X(cudaDeviceSynchronize)                  \
  X(cudaStreamCreate)                       \
  X(cudaStreamCreateWithFlags)              \
  X(cudaStreamCreateWithPriority)           \
  X(cudaStreamDestroy)                      \
  X(cudaStreamIsCapturing)                  \
  X(cudaThreadExchangeStreamCaptureMode)    \
  X(cudaGetDevice)                          \
  X(cudaSetDevice)                          \
  X(cudaGetLastError)                       \
  X(cudaPeekAtLastError)                    \
  X(cudaEventCreateWithFlags)               \
  X(cudaEventRecord)                        \
  X(cudaEventQuery)                         \
  X(cudaEventSynchronize)                   \
  X(cudaEventDestroy)                       \
  X(cudaGetDriverEntryPoint)                \
  X(cudaGetDriverEntryPointByVersion)       \
  X(cudaGetDriverEntryPoint_ptsz)           \
  X(cudaGetDriverEntryPointByVersion_ptsz)

// The per-thread-default-stream flavours, which the runtime header declares only when code is
// built for the per-thread default stream.
extern "C" {
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus);
}

namespace poolcuda::real {

enum class Slot : int {
#define POOLCUDA_SLOT(name) name,
  POOLCUDA_REAL_FUNCTIONS(POOLCUDA_SLOT)
#undef POOLCUDA_SLOT
      count
};

// The resolved address for `slot`, or nullptr when the symbol exists nowhere (decided by the
// first lookup, see Note [Missing functions] in real_cuda.cpp).
void* resolve(Slot slot);

// resolve() for the slot named `name`; nullptr when `name` has no slot.
void* resolve_by_name(const char* name);

// Whether a CUDA runtime is loaded now. Looks, records nothing: unlike a slot, the answer may
// change when a library brings a runtime in later.
bool runtime_loaded();

template <typename Fn>
struct Missing;

template <typename... Args>
struct Missing<cudaError_t (*)(Args...)> {
  static cudaError_t call(Args...) { return cudaErrorSharedObjectSymbolNotFound; }
};

// cudaGetDriverEntryPoint is deprecated in favour of its ByVersion form; both are hooked.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define POOLCUDA_ACCESSOR(name)                                          \
  inline decltype(&::name) name() {                                      \
    using Fn = decltype(&::name);                                        \
    void* address = resolve(Slot::name);                                 \
    return address != nullptr ? reinterpret_cast<Fn>(address)            \
                              : &Missing<Fn>::call;                      \
  }
POOLCUDA_REAL_FUNCTIONS(POOLCUDA_ACCESSOR)
#undef POOLCUDA_ACCESSOR
#pragma GCC diagnostic pop

}  // namespace poolcuda::real
