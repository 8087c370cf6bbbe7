// The exported CUDA runtime entry points (the driver's are in driver_exports.cpp, dlsym in
// dlsym_hook.cpp, the ones that only watch streams and devices in stream_exports.cpp). Each is a
// thin shim: calls made from inside the library (the re-entry guard) and calls in a forked child
// (Note [Fork] in lifecycle.cpp) go straight to the real function; everything else is one call
// into hooks.cpp, through guarded() (exports_common.h). The cudaGetDriverEntryPoint family maps
// what the real call found to the library's driver hooks, like the hooked cuGetProcAddress.
//
// Depends on hooks.h, exports_common.h and real_cuda.h only.
#include <cuda_runtime_api.h>

#include <cstring>

#include "interpose/exports_common.h"
#include "interpose/hooks.h"
#include "interpose/pooling.h"
#include "interpose/real_cuda.h"

namespace pc = poolcuda;

POOLCUDA_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (pc::bypass()) return pc::real::cudaMalloc()(ptr, size);
  return pc::guarded([&] { return pc::hooks::malloc(ptr, size); });
}

POOLCUDA_EXPORT cudaError_t cudaFree(void* ptr) {
  if (pc::bypass()) {
    if (ptr != nullptr && pc::deferred::must_wait()) {
      pc::deferred::queue(ptr, nullptr, pc::deferred::plain);
      return cudaSuccess;  // Note [Frees from inside a call]
    }
    return pc::real::cudaFree()(ptr);
  }
  return pc::guarded([&] { return pc::hooks::free(ptr); });
}

POOLCUDA_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  if (pc::bypass()) return pc::real::cudaIpcGetMemHandle()(handle, devPtr);
  return pc::guarded([&] { return pc::hooks::ipc_get_mem_handle(handle, devPtr); });
}

POOLCUDA_EXPORT cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (pc::bypass()) {
    if (ptr != nullptr && pc::deferred::must_wait()) {
      pc::deferred::queue(ptr, stream, pc::deferred::async);
      return cudaSuccess;  // Note [Frees from inside a call]
    }
    return pc::real::cudaFreeAsync()(ptr, stream);
  }
  return pc::guarded([&] { return pc::hooks::free_async(ptr, stream, false); });
}

POOLCUDA_EXPORT cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  if (pc::bypass()) {
    if (ptr != nullptr && pc::deferred::must_wait()) {
      pc::deferred::queue(ptr, stream, pc::deferred::async_per_thread);
      return cudaSuccess;  // Note [Frees from inside a call]
    }
    return pc::real::cudaFreeAsync_ptsz()(ptr, stream);
  }
  return pc::guarded([&] { return pc::hooks::free_async(ptr, stream, true); });
}

POOLCUDA_EXPORT cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaMallocAsync()(ptr, size, stream);
  return pc::guarded([&] { return pc::hooks::malloc_async(ptr, size, stream, false); });
}

POOLCUDA_EXPORT cudaError_t cudaMallocAsync_ptsz(void** ptr, size_t size, cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaMallocAsync_ptsz()(ptr, size, stream);
  return pc::guarded([&] { return pc::hooks::malloc_async(ptr, size, stream, true); });
}

POOLCUDA_EXPORT cudaError_t cudaMallocPitch(void** ptr, size_t* pitch, size_t width,
                                            size_t height) {
  if (pc::bypass()) return pc::real::cudaMallocPitch()(ptr, pitch, width, height);
  return pc::guarded([&] { return pc::hooks::malloc_pitch(ptr, pitch, width, height); });
}

POOLCUDA_EXPORT cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (pc::bypass()) return pc::real::cudaMemGetInfo()(free_bytes, total_bytes);
  return pc::guarded([&] { return pc::hooks::mem_get_info(free_bytes, total_bytes); });
}

POOLCUDA_EXPORT cudaError_t cudaDeviceSynchronize() {
  if (pc::bypass()) return pc::real::cudaDeviceSynchronize()();
  return pc::guarded([&] { return pc::hooks::device_synchronize(); });
}

POOLCUDA_EXPORT cudaError_t cudaDeviceReset() {
  if (pc::bypass()) return pc::real::cudaDeviceReset()();
  return pc::guarded([&] { return pc::hooks::device_reset(); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (pc::bypass()) return pc::real::cudaStreamCreate()(stream);
  return pc::guarded([&] { return pc::hooks::stream_create(stream); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (pc::bypass()) return pc::real::cudaStreamCreateWithFlags()(stream, flags);
  return pc::guarded([&] { return pc::hooks::stream_create_with_flags(stream, flags); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags,
                                                         int priority) {
  if (pc::bypass()) return pc::real::cudaStreamCreateWithPriority()(stream, flags, priority);
  return pc::guarded([&] { return pc::hooks::stream_create_with_priority(stream, flags, priority); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaStreamDestroy()(stream);
  return pc::guarded([&] { return pc::hooks::stream_destroy(stream); });
}

// Note [Graphs dying] in pooling.cpp: the memory a graph pins comes back a little later.
POOLCUDA_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  const cudaError_t result = pc::real::cudaGraphDestroy()(graph);
  if (result == cudaSuccess) pc::pooling::graph_destroyed();
  return result;
}

POOLCUDA_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  const cudaError_t result = pc::real::cudaGraphExecDestroy()(exec);
  if (result == cudaSuccess) pc::pooling::graph_destroyed();
  return result;
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                                   cudaStreamCaptureMode mode) {
  if (pc::bypass()) return pc::real::cudaStreamBeginCapture()(stream, mode);
  return pc::guarded([&] {
    return static_cast<cudaError_t>(pc::hooks::begin_capture(
        stream, false, mode, [&] { return pc::real::cudaStreamBeginCapture()(stream, mode); }));
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                        cudaStreamCaptureMode mode) {
  if (pc::bypass()) return pc::real::cudaStreamBeginCapture_ptsz()(stream, mode);
  return pc::guarded([&] {
    return static_cast<cudaError_t>(pc::hooks::begin_capture(stream, true, mode, [&] {
      return pc::real::cudaStreamBeginCapture_ptsz()(stream, mode);
    }));
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    const cudaGraphEdgeData* edges, size_t count, cudaStreamCaptureMode mode) {
  if (pc::bypass())
    return pc::real::cudaStreamBeginCaptureToGraph()(stream, graph, dependencies, edges, count,
                                                     mode);
  return pc::guarded([&] {
    return static_cast<cudaError_t>(pc::hooks::begin_capture(stream, false, mode, [&] {
      return pc::real::cudaStreamBeginCaptureToGraph()(stream, graph, dependencies, edges, count,
                                                       mode);
    }));
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    const cudaGraphEdgeData* edges, size_t count, cudaStreamCaptureMode mode) {
  if (pc::bypass())
    return pc::real::cudaStreamBeginCaptureToGraph_ptsz()(stream, graph, dependencies, edges,
                                                          count, mode);
  return pc::guarded([&] {
    return static_cast<cudaError_t>(pc::hooks::begin_capture(stream, true, mode, [&] {
      return pc::real::cudaStreamBeginCaptureToGraph_ptsz()(stream, graph, dependencies, edges,
                                                            count, mode);
    }));
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (pc::bypass()) return pc::real::cudaStreamEndCapture()(stream, graph);
  return pc::guarded([&] {
    return static_cast<cudaError_t>(pc::hooks::end_capture(
        stream, false, graph, [&] { return pc::real::cudaStreamEndCapture()(stream, graph); }));
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* graph) {
  if (pc::bypass()) return pc::real::cudaStreamEndCapture_ptsz()(stream, graph);
  return pc::guarded([&] {
    return static_cast<cudaError_t>(pc::hooks::end_capture(
        stream, true, graph, [&] { return pc::real::cudaStreamEndCapture_ptsz()(stream, graph); }));
  });
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
POOLCUDA_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr,
                                                    unsigned long long flags,
                                                    cudaDriverEntryPointQueryResult* driverStatus) {
  return pc::hooks::map_driver_entry(
      pc::real::cudaGetDriverEntryPoint()(symbol, funcPtr, flags, driverStatus), funcPtr);
}
#pragma GCC diagnostic pop

POOLCUDA_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(
    const char* symbol, void** funcPtr, unsigned long long flags,
    cudaDriverEntryPointQueryResult* driverStatus) {
  return pc::hooks::map_driver_entry(
      pc::real::cudaGetDriverEntryPoint_ptsz()(symbol, funcPtr, flags, driverStatus), funcPtr);
}

POOLCUDA_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    cudaDriverEntryPointQueryResult* driverStatus) {
  return pc::hooks::map_driver_entry(pc::real::cudaGetDriverEntryPointByVersion()(
                                         symbol, funcPtr, cudaVersion, flags, driverStatus),
                                     funcPtr);
}

POOLCUDA_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    cudaDriverEntryPointQueryResult* driverStatus) {
  return pc::hooks::map_driver_entry(pc::real::cudaGetDriverEntryPointByVersion_ptsz()(
                                         symbol, funcPtr, cudaVersion, flags, driverStatus),
                                     funcPtr);
}

namespace poolcuda {

void* runtime_hook(const char* name) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  static const struct {
    const char* name;
    void* hook;
  } kHooks[] = {
#define POOLCUDA_HOOK(fn) {#fn, reinterpret_cast<void*>(&::fn)},
      POOLCUDA_RUNTIME_HOOKS(POOLCUDA_HOOK)
#undef POOLCUDA_HOOK
  };
#pragma GCC diagnostic pop
  for (const auto& entry : kHooks) {
    if (std::strcmp(entry.name, name) == 0) return entry.hook;
  }
  return nullptr;
}

}  // namespace poolcuda
