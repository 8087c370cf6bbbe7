// The exported CUDA runtime entry points: the only symbols libpoolcuda.so exports (exports.map).
// Each is a thin shim: calls made from inside the library (the re-entry guard) and calls in a
// forked child (Note [Fork] in lifecycle.cpp) go straight to the real function; everything else
// is one call into hooks.cpp.
//
// Depends on hooks.h, managed_hooks.h, real_cuda.h and lifecycle.h only.
#include <cuda_runtime_api.h>

#include "interpose/hooks.h"
#include "interpose/lifecycle.h"
#include "interpose/managed_hooks.h"
#include "interpose/real_cuda.h"

#define POOLCUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace poolcuda {
namespace {

// Set while a hook runs on this thread: a CUDA call the real runtime makes through an exported
// symbol (or one the pools make) must not re-enter the pools. initial-exec: no allocation and
// no lock on first access, which matters inside a preloaded library.
__attribute__((tls_model("initial-exec"))) thread_local bool t_inside_hook = false;

bool bypass() { return t_inside_hook || passthrough(); }

class InsideHook {
 public:
  InsideHook() { t_inside_hook = true; }
  ~InsideHook() { t_inside_hook = false; }
  InsideHook(const InsideHook&) = delete;
  InsideHook& operator=(const InsideHook&) = delete;
};

}  // namespace
}  // namespace poolcuda

namespace pc = poolcuda;

POOLCUDA_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (pc::bypass()) return pc::real::cudaMalloc()(ptr, size);
  pc::InsideHook inside;
  return pc::hooks::malloc(ptr, size);
}

POOLCUDA_EXPORT cudaError_t cudaFree(void* ptr) {
  if (pc::bypass()) return pc::real::cudaFree()(ptr);
  pc::InsideHook inside;
  return pc::hooks::free(ptr);
}

POOLCUDA_EXPORT cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (pc::bypass()) return pc::real::cudaMemGetInfo()(free_bytes, total_bytes);
  pc::InsideHook inside;
  return pc::hooks::mem_get_info(free_bytes, total_bytes);
}

POOLCUDA_EXPORT cudaError_t cudaDeviceReset() {
  if (pc::bypass()) return pc::real::cudaDeviceReset()();
  pc::InsideHook inside;
  return pc::hooks::device_reset();
}

POOLCUDA_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (pc::bypass()) return pc::real::cudaStreamCreate()(stream);
  pc::InsideHook inside;
  return pc::hooks::stream_create(stream);
}

POOLCUDA_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaStreamCreateWithFlags()(stream, flags);
  pc::InsideHook inside;
  return pc::hooks::stream_create_with_flags(stream, flags);
}

POOLCUDA_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags,
                                                         int priority) {
  if (pc::bypass()) return pc::real::cudaStreamCreateWithPriority()(stream, flags, priority);
  pc::InsideHook inside;
  return pc::hooks::stream_create_with_priority(stream, flags, priority);
}

POOLCUDA_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaStreamDestroy()(stream);
  pc::InsideHook inside;
  return pc::hooks::stream_destroy(stream);
}

POOLCUDA_EXPORT cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaMallocManaged()(ptr, size, flags);
  pc::InsideHook inside;
  return pc::hooks::malloc_managed(ptr, size, flags);
}

POOLCUDA_EXPORT cudaError_t cudaStreamAttachMemAsync(cudaStream_t stream, void* ptr,
                                                     size_t length, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaStreamAttachMemAsync()(stream, ptr, length, flags);
  pc::InsideHook inside;
  return pc::hooks::stream_attach_mem(stream, ptr, length, flags, false);
}

POOLCUDA_EXPORT cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void* ptr,
                                                          size_t length, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaStreamAttachMemAsync_ptsz()(stream, ptr, length, flags);
  pc::InsideHook inside;
  return pc::hooks::stream_attach_mem(stream, ptr, length, flags, true);
}

POOLCUDA_EXPORT cudaError_t cudaMemAdvise(const void* ptr, size_t count, cudaMemoryAdvise advice,
                                          cudaMemLocation location) {
  if (pc::bypass()) return pc::real::cudaMemAdvise()(ptr, count, advice, location);
  pc::InsideHook inside;
  return pc::hooks::mem_advise(ptr, count, advice, location);
}

POOLCUDA_EXPORT cudaError_t cudaMemPrefetchAsync(const void* ptr, size_t count,
                                                 cudaMemLocation location, unsigned int flags,
                                                 cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaMemPrefetchAsync()(ptr, count, location, flags, stream);
  pc::InsideHook inside;
  return pc::hooks::mem_prefetch(ptr, count, location, flags, stream, false);
}

POOLCUDA_EXPORT cudaError_t cudaMemPrefetchAsync_ptsz(const void* ptr, size_t count,
                                                      cudaMemLocation location,
                                                      unsigned int flags, cudaStream_t stream) {
  if (pc::bypass()) {
    return pc::real::cudaMemPrefetchAsync_ptsz()(ptr, count, location, flags, stream);
  }
  pc::InsideHook inside;
  return pc::hooks::mem_prefetch(ptr, count, location, flags, stream, true);
}

POOLCUDA_EXPORT cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                                     const void* ptr) {
  if (pc::bypass()) return pc::real::cudaPointerGetAttributes()(attributes, ptr);
  pc::InsideHook inside;
  return pc::hooks::pointer_get_attributes(attributes, ptr);
}
