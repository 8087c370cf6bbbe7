// The exported CUDA runtime entry points: the only symbols libpoolcuda.so exports (exports.map).
// Each is a thin shim: calls made from inside the library (the re-entry guard) and calls in a
// forked child (Note [Fork] in lifecycle.cpp) go straight to the real function; everything else
// is one call into hooks.cpp, through guarded(): no C++ exception ever crosses an entry point
// (a failed host allocation inside the pools becomes cudaErrorMemoryAllocation, anything else
// cudaErrorUnknown, which the real runtime also uses for failures it cannot classify).
//
// Depends on hooks.h, real_cuda.h and lifecycle.h only.
#include <cuda_runtime_api.h>

#include "interpose/exports_common.h"
#include "interpose/hooks.h"
#include "interpose/lifecycle.h"
#include "interpose/real_cuda.h"

namespace pc = poolcuda;

POOLCUDA_EXPORT cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (pc::bypass()) return pc::real::cudaMalloc()(ptr, size);
  return pc::guarded([&] { return pc::hooks::malloc(ptr, size); });
}

POOLCUDA_EXPORT cudaError_t cudaFree(void* ptr) {
  if (pc::bypass()) return pc::real::cudaFree()(ptr);
  return pc::guarded([&] { return pc::hooks::free(ptr); });
}

POOLCUDA_EXPORT cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaFreeAsync()(ptr, stream);
  return pc::guarded([&] { return pc::hooks::free_async(ptr, stream, false); });
}

POOLCUDA_EXPORT cudaError_t cudaFreeAsync_ptsz(void* ptr, cudaStream_t stream) {
  if (pc::bypass()) return pc::real::cudaFreeAsync_ptsz()(ptr, stream);
  return pc::guarded([&] { return pc::hooks::free_async(ptr, stream, true); });
}

POOLCUDA_EXPORT cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (pc::bypass()) return pc::real::cudaMemGetInfo()(free_bytes, total_bytes);
  return pc::guarded([&] { return pc::hooks::mem_get_info(free_bytes, total_bytes); });
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

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                                   cudaStreamCaptureMode mode) {
  if (pc::bypass()) return pc::real::cudaStreamBeginCapture()(stream, mode);
  return pc::guarded([&] { return pc::hooks::stream_begin_capture(stream, mode, false); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                        cudaStreamCaptureMode mode) {
  if (pc::bypass()) return pc::real::cudaStreamBeginCapture_ptsz()(stream, mode);
  return pc::guarded([&] { return pc::hooks::stream_begin_capture(stream, mode, true); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    const cudaGraphEdgeData* edges, size_t count, cudaStreamCaptureMode mode) {
  if (pc::bypass())
    return pc::real::cudaStreamBeginCaptureToGraph()(stream, graph, dependencies, edges, count,
                                                     mode);
  return pc::guarded([&] {
    return pc::hooks::stream_begin_capture_to_graph(stream, graph, dependencies, edges, count,
                                                    mode, false);
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
    const cudaGraphEdgeData* edges, size_t count, cudaStreamCaptureMode mode) {
  if (pc::bypass())
    return pc::real::cudaStreamBeginCaptureToGraph_ptsz()(stream, graph, dependencies, edges,
                                                          count, mode);
  return pc::guarded([&] {
    return pc::hooks::stream_begin_capture_to_graph(stream, graph, dependencies, edges, count,
                                                    mode, true);
  });
}

POOLCUDA_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (pc::bypass()) return pc::real::cudaStreamEndCapture()(stream, graph);
  return pc::guarded([&] { return pc::hooks::stream_end_capture(stream, graph, false); });
}

POOLCUDA_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* graph) {
  if (pc::bypass()) return pc::real::cudaStreamEndCapture_ptsz()(stream, graph);
  return pc::guarded([&] { return pc::hooks::stream_end_capture(stream, graph, true); });
}
