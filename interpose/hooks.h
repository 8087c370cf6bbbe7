// The core of every hooked CUDA entry point: what cudaMalloc, cudaFree, cudaMemGetInfo,
// cudaDeviceReset and the stream calls do when the pools are active. The exported shims
// (exports.cpp) call exactly one of these after their re-entry and pass-through checks; these
// functions never check either.
//
// Depends on the registry, the real-function table and the configuration.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace poolcuda::hooks {

cudaError_t malloc(void** ptr, std::size_t size);
cudaError_t free(void* ptr);
cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread);
cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);
cudaError_t device_reset();
cudaError_t stream_create(cudaStream_t* stream);
cudaError_t stream_create_with_flags(cudaStream_t* stream, unsigned int flags);
cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t stream_destroy(cudaStream_t stream);

// capture_hooks.cpp
cudaError_t stream_begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode,
                                 bool per_thread);
cudaError_t stream_begin_capture_to_graph(cudaStream_t stream, cudaGraph_t graph,
                                          const cudaGraphNode_t* dependencies,
                                          const cudaGraphEdgeData* edges, std::size_t count,
                                          cudaStreamCaptureMode mode, bool per_thread);
cudaError_t stream_end_capture(cudaStream_t stream, cudaGraph_t* graph, bool per_thread);
// The capture open on `stream` (0 when none) and the stream's device, asked before the stream
// is destroyed; afterwards stream_destroyed_while_capturing closes that capture as failed.
unsigned long long stream_capture_id(cudaStream_t stream, int* device);
void stream_destroyed_while_capturing(cudaStream_t stream, int device,
                                      unsigned long long capture_id);

}  // namespace poolcuda::hooks
