// The driver stand-in's entry points for work on a context: memory (allocation, free, memory
// info, pitched, managed and stream-ordered allocation, synchronous copies and memsets), streams,
// events, stream capture and graph launch, each with its per-thread-default-stream (_ptsz)
// flavour where the real driver has one. Thin calls into the core, as the runtime's are.
#include <algorithm>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

CUresult cuMemAlloc(unsigned int*, unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemFree(unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemGetInfo(unsigned int*, unsigned int*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemAllocPitch(unsigned int*, unsigned int*, unsigned int, unsigned int, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

namespace {

CUresult allocate(CUdeviceptr* out, size_t bytesize, AllocKind kind) {
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  void* p = nullptr;
  cudaError_t err = mem_alloc(context_device(), bytesize, kind, &p);
  if (err == cudaSuccess) *out = dptr(p);
  return alloc_result(err);
}

CUresult alloc_async(CUdeviceptr* out, size_t size, CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  void* p = nullptr;
  cudaError_t err = malloc_async(resolve_stream(rt(stream), per_thread), size, &p);
  if (err == cudaSuccess) *out = dptr(p);
  return as_cu(err);
}

CUresult free_async_impl(CUdeviceptr d, CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(free_async(resolve_stream(rt(stream), per_thread), ptr(d)));
}

}  // namespace

CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t bytesize) {
  bump(Counter::cuMemAlloc);
  if (CUresult r = guard(true)) return r;
  if (!out || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return allocate(out, bytesize, AllocKind::device);
}

// Rows are padded to a multiple of 512 bytes, like the runtime stand-in's cudaMallocPitch.
CUresult cuMemAllocPitch_v2(CUdeviceptr* out, size_t* pitch, size_t width, size_t height,
                            unsigned int element_size) {
  if (CUresult r = guard(true)) return r;
  if (!out || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_size != 4 && element_size != 8 && element_size != 16)
    return CUDA_ERROR_INVALID_VALUE;
  size_t row = (width + 511) / 512 * 512;
  if (row > SIZE_MAX / height) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = allocate(out, row * height, AllocKind::device);
  if (r == CUDA_SUCCESS) *pitch = row;
  return r;
}

CUresult cuMemAllocManaged(CUdeviceptr* out, size_t bytesize, unsigned int flags) {
  if (CUresult r = guard(true)) return r;
  if (!out || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  return allocate(out, bytesize, AllocKind::managed);
}

CUresult cuMemFree_v2(CUdeviceptr d) {
  bump(Counter::cuMemFree);
  if (CUresult r = guard(true)) return r;
  if (d == 0) return CUDA_SUCCESS;
  AllocInfo info;
  if (!mem_find(ptr(d), &info) || info.base != static_cast<uintptr_t>(d))
    return CUDA_ERROR_INVALID_VALUE;
  {
    // Like cudaFree, cuMemFree synchronizes: illegal while a capture is open on the device.
    std::lock_guard lock(state_mutex());
    if (invalidate_device_captures_locked(info.device))
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  device_drain(info.device);
  std::lock_guard lock(effects_mutex());
  return as_cu(mem_free(ptr(d), info.id));
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (CUresult r = guard(true)) return r;
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  mem_info(context_device(), free, total);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr_out, size_t bytesize, CUstream hStream) {
  return alloc_async(dptr_out, bytesize, hStream, false);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr_out, size_t bytesize, CUstream hStream) {
  return alloc_async(dptr_out, bytesize, hStream, true);
}
CUresult cuMemFreeAsync(CUdeviceptr d, CUstream hStream) { return free_async_impl(d, hStream, false); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream hStream) {
  return free_async_impl(d, hStream, true);
}

// The synchronous copies and memsets run on the legacy default stream and wait for it.
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_set(ptr(dst), value, count, resolve_stream(nullptr, false), true, "cuMemsetD8"));
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_copy(ptr(dst), src, count, cudaMemcpyHostToDevice,
                        resolve_stream(nullptr, false), true, "cuMemcpyHtoD"));
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_copy(dst, ptr(src), count, cudaMemcpyDeviceToHost,
                        resolve_stream(nullptr, false), true, "cuMemcpyDtoH"));
}

// ---- Streams --------------------------------------------------------------------------------

namespace {

CUresult create(CUstream* out, unsigned int flags, int priority) {
  if (CUresult r = guard(true)) return r;
  if (!out || (flags & ~unsigned{CU_STREAM_NON_BLOCKING})) return CUDA_ERROR_INVALID_VALUE;
  StreamRef s = create_stream(context_device(), flags, std::clamp(priority, -5, 0));
  *out = reinterpret_cast<CUstream>(s.get());
  return CUDA_SUCCESS;
}

CUresult destroy(CUstream stream) {
  if (CUresult r = guard(true)) return r;
  return as_cu(destroy_stream(rt(stream)));
}

CUresult synchronize(CUstream stream, bool per_thread) {
  bump(Counter::cudaStreamSynchronize);
  if (CUresult r = guard(true)) return r;
  StreamRef s = resolve_stream(rt(stream), per_thread);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (cudaError_t err = wait_capture_guard(s); err != cudaSuccess) return as_cu(err);
  drain(s);
  return as_cu(sticky_error());
}

}  // namespace

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return create(phStream, Flags, 0);
}

CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return create(phStream, flags, priority);
}

CUresult cuStreamDestroy_v2(CUstream hStream) { return destroy(hStream); }
CUresult cuStreamDestroy(CUstream hStream) { return destroy(hStream); }

CUresult cuStreamSynchronize(CUstream hStream) { return synchronize(hStream, false); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return synchronize(hStream, true); }

// ---- Events ---------------------------------------------------------------------------------

namespace {

CUresult record(CUevent event, CUstream stream, bool per_thread) {
  bump(Counter::cudaEventRecord);
  if (CUresult r = guard(true)) return r;
  EventRef ev = find_event(reinterpret_cast<cudaEvent_t>(event));
  StreamRef s = resolve_stream(rt(stream), per_thread);
  if (!ev || !s) return CUDA_ERROR_INVALID_HANDLE;
  return as_cu(event_record(ev, s));
}

CUresult destroy_event_impl(CUevent event) {
  if (CUresult r = guard(true)) return r;
  return as_cu(destroy_event(reinterpret_cast<cudaEvent_t>(event)));
}

}  // namespace

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  if (CUresult r = guard(true)) return r;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!phEvent || (Flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  *phEvent = reinterpret_cast<CUevent>(create_event(Flags));
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { return record(hEvent, hStream, false); }
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return record(hEvent, hStream, true);
}

CUresult cuEventQuery(CUevent hEvent) {
  if (CUresult r = guard(true)) return r;
  return as_cu(event_query(find_event(reinterpret_cast<cudaEvent_t>(hEvent))));
}

CUresult cuEventSynchronize(CUevent hEvent) {
  if (CUresult r = guard(true)) return r;
  cudaError_t err = event_sync(find_event(reinterpret_cast<cudaEvent_t>(hEvent)));
  return as_cu(err == cudaSuccess ? sticky_error() : err);
}

CUresult cuEventDestroy_v2(CUevent hEvent) { return destroy_event_impl(hEvent); }
CUresult cuEventDestroy(CUevent hEvent) { return destroy_event_impl(hEvent); }

// ---- Capture and graphs ---------------------------------------------------------------------

namespace {

CUresult begin(CUstream stream, CUstreamCaptureMode mode, bool per_thread, CUgraph into = nullptr) {
  if (CUresult r = guard(true)) return r;
  return as_cu(begin_capture(resolve_stream(rt(stream), per_thread),
                             static_cast<cudaStreamCaptureMode>(mode),
                             reinterpret_cast<cudaGraph_t>(into)));
}

CUresult begin_to_graph(CUstream stream, CUgraph graph, const CUgraphNode* dependencies,
                        size_t num_dependencies, CUstreamCaptureMode mode, bool per_thread) {
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  // Captures are linear in the stand-in: a graph with dependencies to continue is not modelled.
  if (dependencies || num_dependencies) return CUDA_ERROR_NOT_SUPPORTED;
  return begin(stream, mode, per_thread, graph);
}

CUresult end(CUstream stream, CUgraph* graph, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(end_capture(resolve_stream(rt(stream), per_thread),
                           reinterpret_cast<cudaGraph_t*>(graph)));
}

CUresult is_capturing(CUstream stream, CUstreamCaptureStatus* status, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  return as_cu(capture_info(resolve_stream(rt(stream), per_thread),
                            reinterpret_cast<cudaStreamCaptureStatus*>(status), nullptr, nullptr,
                            nullptr, nullptr, nullptr));
}

}  // namespace

// The first cuStreamBeginCapture (CUDA 10.0) had no mode: it captured in global mode.
CUresult cuStreamBeginCapture(CUstream hStream) {
  return begin(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return begin(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return begin(hStream, mode, false);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return begin(hStream, mode, true);
}

CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                     const CUgraphNode* dependencies,
                                     const CUgraphEdgeData*, size_t numDependencies,
                                     CUstreamCaptureMode mode) {
  return begin_to_graph(hStream, hGraph, dependencies, numDependencies, mode, false);
}
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode* dependencies,
                                          const CUgraphEdgeData*, size_t numDependencies,
                                          CUstreamCaptureMode mode) {
  return begin_to_graph(hStream, hGraph, dependencies, numDependencies, mode, true);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return end(hStream, phGraph, false);
}
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return end(hStream, phGraph, true);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return is_capturing(hStream, captureStatus, false);
}
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return is_capturing(hStream, captureStatus, true);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (CUresult r = guard()) return r;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  int requested = static_cast<int>(*mode);
  if (requested != CU_STREAM_CAPTURE_MODE_GLOBAL &&
      requested != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      requested != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  cudaStreamCaptureMode previous = thread_capture_mode();
  thread_capture_mode() = static_cast<cudaStreamCaptureMode>(requested);
  *mode = static_cast<CUstreamCaptureMode>(previous);
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
  if (CUresult r = guard(true)) return r;
  if (flags & ~0xfull) return CUDA_ERROR_INVALID_VALUE;
  return as_cu(graph_instantiate(reinterpret_cast<cudaGraphExec_t*>(phGraphExec),
                                 reinterpret_cast<cudaGraph_t>(hGraph)));
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_launch(reinterpret_cast<cudaGraphExec_t>(hGraphExec),
                            resolve_stream(rt(hStream), false)));
}
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_launch(reinterpret_cast<cudaGraphExec_t>(hGraphExec),
                            resolve_stream(rt(hStream), true)));
}

CUresult cuGraphDestroy(CUgraph hGraph) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_destroy(reinterpret_cast<cudaGraph_t>(hGraph)));
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_exec_destroy(reinterpret_cast<cudaGraphExec_t>(hGraphExec)));
}
