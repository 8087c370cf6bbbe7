// The real CUDA driver: its resolver (the cuGetProcAddress_v2 of the loaded libcuda.so.1, found
// with the C library's dlsym), its exported symbols, and the driver functions the library calls
// itself (driver_context.cpp and the own-call path of processes without a CUDA runtime,
// own_api.cpp). Nothing here loads a driver: while none is loaded every lookup finds nothing
// and is tried again later. Each function is resolved once, at the version whose signature the
// library calls, lock-free like real_cuda.h; a function the driver lacks answers
// CUDA_ERROR_NOT_FOUND.
//
// Usage: real_driver::cuCtxGetCurrent()(&ctx). Depends on the CUDA driver header and dl_real.h.
#pragma once

#include <cuda.h>

namespace poolcuda::real_driver {

// The real cuGetProcAddress_v2, or nullptr while no driver is loaded.
using Resolver = CUresult (*)(const char*, void**, int, cuuint64_t,
                              CUdriverProcAddressQueryResult*);
Resolver resolver();

// The real cuGetProcAddress (without the status argument), or nullptr.
using ResolverV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
ResolverV1 resolver_v1();

// What the real resolver gives for base name `name` at `version`, legacy or per-thread flavour;
// nullptr when it gives nothing.
void* resolve(const char* name, int version, bool per_thread);

// The loaded driver library's exported symbol `name`, or nullptr.
void* symbol(const char* name);

// name (the variant the library calls), base name, version.
#define POOLCUDA_REAL_DRIVER_FUNCTIONS(X)                                   \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000)                               \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000)                               \
  X(cuCtxGetDevice, "cuCtxGetDevice", 2000)                                 \
  X(cuCtxGetId, "cuCtxGetId", 12000)                                        \
  X(cuCtxSynchronize, "cuCtxSynchronize", 2000)                             \
  X(cuCtxGetLimit, "cuCtxGetLimit", 3010)                                   \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000)                     \
  X(cuDeviceGetCount, "cuDeviceGetCount", 2000)                             \
  X(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 7000)         \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000)             \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000)       \
  X(cuMemAlloc_v2, "cuMemAlloc", 3020)                                      \
  X(cuMemFree_v2, "cuMemFree", 3020)                                        \
  X(cuMemGetInfo_v2, "cuMemGetInfo", 3020)                                  \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", 10000)                      \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010) \
  X(cuEventCreate, "cuEventCreate", 2000)                                   \
  X(cuEventRecord, "cuEventRecord", 2000)                                   \
  X(cuEventQuery, "cuEventQuery", 2000)                                     \
  X(cuStreamQuery, "cuStreamQuery", 2000)                                   \
  X(cuStreamCreate, "cuStreamCreate", 2000)                                 \
  X(cuStreamGetCtx, "cuStreamGetCtx", 9020)                                 \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000)                          \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000)                            \
  X(cuEventSynchronize, "cuEventSynchronize", 2000)                         \
  X(cuEventDestroy_v2, "cuEventDestroy", 4000)                              \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", 3020)                           \
  X(cuStreamGetDevice, "cuStreamGetDevice", 12080)                          \
  X(cuStreamGetCaptureInfo_v3, "cuStreamGetCaptureInfo", 12030)            \
  X(cuUserObjectCreate, "cuUserObjectCreate", 11030)                        \
  X(cuUserObjectRelease, "cuUserObjectRelease", 11030)                      \
  X(cuGraphRetainUserObject, "cuGraphRetainUserObject", 11030)

enum class Slot : int {
#define POOLCUDA_SLOT(name, base, version) name,
  POOLCUDA_REAL_DRIVER_FUNCTIONS(POOLCUDA_SLOT)
#undef POOLCUDA_SLOT
      count
};

// The resolved address for `slot`, or nullptr (no driver loaded, or it lacks the function).
void* function(Slot slot);

// Resolves every slot now (Note [Resolved before any lock] in own_api.cpp); false, resolving
// nothing, while no driver is loaded.
bool resolve_all();

template <typename Fn>
struct Missing;

template <typename... Args>
struct Missing<CUresult (*)(Args...)> {
  static CUresult call(Args...) { return CUDA_ERROR_NOT_FOUND; }
};

#define POOLCUDA_ACCESSOR(name, base, version)                           \
  inline decltype(&::name) name() {                                      \
    using Fn = decltype(&::name);                                        \
    void* address = function(Slot::name);                                \
    return address != nullptr ? reinterpret_cast<Fn>(address)            \
                              : &Missing<Fn>::call;                      \
  }
POOLCUDA_REAL_DRIVER_FUNCTIONS(POOLCUDA_ACCESSOR)
#undef POOLCUDA_ACCESSOR

}  // namespace poolcuda::real_driver
