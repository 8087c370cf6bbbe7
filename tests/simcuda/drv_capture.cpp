// The driver stand-in's entry points for stream capture and graphs: capture begin in every
// variant (the mode-less first one, _v2, into a caller's graph) and end, capture state and info
// (cuStreamGetCaptureInfo in its three versions), the thread's capture mode, graphs (create,
// clone, instantiate, launch, destroy) and user objects held by graphs, each with its _ptsz
// flavour where the real driver has one. Thin calls into the core's capture and graph machinery,
// which the runtime's entry points share: driver and runtime handles are the same objects.
#include <cstring>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

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

// The three versions of cuStreamGetCaptureInfo differ only in what they report: v1 the status
// and id, _v2 also the graph and dependencies, _v3 also the edge data.
CUresult get_capture_info(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                          CUgraph* graph, const CUgraphNode** dependencies,
                          const CUgraphEdgeData** edges, size_t* count, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long capture_id = 0;
  cudaError_t err = capture_info(resolve_stream(rt(stream), per_thread),
                                 reinterpret_cast<cudaStreamCaptureStatus*>(status), &capture_id,
                                 reinterpret_cast<cudaGraph_t*>(graph),
                                 reinterpret_cast<const cudaGraphNode_t**>(dependencies),
                                 reinterpret_cast<const cudaGraphEdgeData**>(edges), count);
  if (err == cudaSuccess && id && *status != CU_STREAM_CAPTURE_STATUS_NONE) *id = capture_id;
  return as_cu(err);
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

CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                cuuint64_t* id_out) {
  return get_capture_info(hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr,
                          false);
}
CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                     cuuint64_t* id_out) {
  return get_capture_info(hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr,
                          true);
}

CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** dependencies_out,
                                   size_t* numDependencies_out) {
  return get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                          numDependencies_out, false);
}
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out,
                                        size_t* numDependencies_out) {
  return get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                          numDependencies_out, true);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** dependencies_out,
                                   const CUgraphEdgeData** edgeData_out,
                                   size_t* numDependencies_out) {
  return get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                          edgeData_out, numDependencies_out, false);
}
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out,
                                        const CUgraphEdgeData** edgeData_out,
                                        size_t* numDependencies_out) {
  return get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                          edgeData_out, numDependencies_out, true);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (CUresult r = guard()) return r;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  // Any value is taken, like the runtime's (Note [Capture legality] in capture.cpp).
  int requested = 0;
  std::memcpy(&requested, mode, sizeof requested);
  cudaStreamCaptureMode previous = thread_capture_mode();
  thread_capture_mode() = static_cast<cudaStreamCaptureMode>(requested);
  *mode = static_cast<CUstreamCaptureMode>(previous);
  return CUDA_SUCCESS;
}

// ---- Graphs and user objects ----------------------------------------------------------------

CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  if (CUresult r = guard(true)) return r;
  if (!phGraph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *phGraph = reinterpret_cast<CUgraph>(register_graph(std::make_shared<Graph>()));
  return CUDA_SUCCESS;
}

CUresult cuGraphClone(CUgraph* phGraphClone, CUgraph originalGraph) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_clone(reinterpret_cast<cudaGraph_t*>(phGraphClone),
                           reinterpret_cast<cudaGraph_t>(originalGraph)));
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

namespace {

cudaUserObject_t as_rt(CUuserObject object) { return reinterpret_cast<cudaUserObject_t>(object); }

}  // namespace

// The flags must be CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, as in CUDA; the destructor runs once the
// last reference (the program's, a graph's, an exec's) is gone, on the thread of the program's
// release or on an internal one (Note [User object destructors] in graph.cpp).
CUresult cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                            unsigned int initialRefcount, unsigned int flags) {
  if (CUresult r = guard(true)) return r;
  return as_cu(user_object_create(reinterpret_cast<cudaUserObject_t*>(object_out), ptr, destroy,
                                  initialRefcount, flags));
}

CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(user_object_retain(as_rt(object), count));
}

CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(user_object_release(as_rt(object), count));
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                 unsigned int flags) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_retain_user_object(reinterpret_cast<cudaGraph_t>(graph), as_rt(object),
                                        count, flags));
}

CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(graph_release_user_object(reinterpret_cast<cudaGraph_t>(graph), as_rt(object),
                                         count));
}
