// Runtime stand-in entry points for streams, events, host functions and stream capture, with
// their per-thread-default-stream (_ptsz) variants, and simcuda_launch_access of simcuda.h. In
// the static-runtime archive, stream create/destroy and capture begin/end call the driver
// (Note [Static runtime] in rt_driver.cpp).
#include <cstring>

#include "rt_common.h"
#include "rt_driver.h"
#include "simcuda.h"

using namespace poolcuda::sim;

namespace {

cudaStream_t handle_of(const StreamRef& s) { return static_cast<cudaStream_t>(s->handle); }

cudaError_t stream_sync(const StreamRef& s) {
  bump(Counter::cudaStreamSynchronize);
  if (!s) return cudaErrorInvalidResourceHandle;
  if (cudaError_t err = wait_capture_guard(s); err != cudaSuccess) return err;
  drain(s);
  return sticky_error();  // a fault in the work just waited for is reported here
}

cudaError_t create(cudaStream_t* out, unsigned flags, int priority) {
  if (!out) return cudaErrorInvalidValue;
  if (flags & ~unsigned{cudaStreamNonBlocking}) return cudaErrorInvalidValue;
  priority = std::clamp(priority, -5, 0);
  *out = handle_of(create_stream(current_device(), flags, priority));
  return cudaSuccess;
}

cudaError_t host_func(const StreamRef& s, cudaHostFn_t fn, void* user_data) {
  if (!fn) return cudaErrorInvalidValue;
  Work w;
  w.type = cudaGraphNodeTypeHost;
  w.desc = "host function";
  w.fn = [fn, user_data] { fn(user_data); };
  return submit(s, std::move(w));
}

struct Callback {
  cudaStream_t stream;
  cudaStreamCallback_t fn;
  void* user_data;
};

cudaError_t add_callback(cudaStream_t handle, const StreamRef& s, cudaStreamCallback_t fn,
                         void* user_data, unsigned flags) {
  if (!fn || flags != 0) return cudaErrorInvalidValue;
  Work w;
  w.type = cudaGraphNodeTypeHost;
  w.desc = "stream callback";
  Callback cb{handle, fn, user_data};
  w.fn = [cb] { cb.fn(cb.stream, sticky_error(), cb.user_data); };
  return submit(s, std::move(w));
}

cudaError_t record(cudaEvent_t event, const StreamRef& s, unsigned flags = 0) {
  bump(Counter::cudaEventRecord);
  if (flags & ~unsigned{cudaEventRecordExternal}) return cudaErrorInvalidValue;
  EventRef ev = find_event(event);
  if (!ev) return cudaErrorInvalidResourceHandle;
  if (!s) return cudaErrorInvalidResourceHandle;
  return event_record(ev, s, flags & cudaEventRecordExternal);
}

cudaError_t is_capturing(const StreamRef& s, cudaStreamCaptureStatus* status) {
  if (!status) return cudaErrorInvalidValue;
  return capture_info(s, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

}  // namespace

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::stream_create(pStream, 0));
  SIM_RETURN(create(pStream, 0, 0));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::stream_create(pStream, flags));
  SIM_RETURN(create(pStream, flags, 0));
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  SIM_ENTER();
  if (rt::kStaticRuntime) {
    SIM_RETURN(via_driver::stream_create_with_priority(pStream, flags, priority));
  }
  SIM_RETURN(create(pStream, flags, priority));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::stream_destroy(stream));
  SIM_RETURN(destroy_stream(stream));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(stream_sync(resolve_stream(stream, false)));
}

cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(stream_sync(resolve_stream(stream, true)));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(stream_query(resolve_stream(stream, false)));
}

cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(stream_query(resolve_stream(stream, true)));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(stream_wait_event(resolve_stream(stream, false), event, flags));
}

cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(stream_wait_event(resolve_stream(stream, true), event, flags));
}

#define SIM_STREAM_GETTER(name, type, field)                                  \
  cudaError_t name(cudaStream_t hStream, type* out) {                        \
    SIM_ENTER();                                                             \
    if (!out) SIM_RETURN(cudaErrorInvalidValue);                             \
    StreamRef s = resolve_stream(hStream, false);                            \
    if (!s) SIM_RETURN(cudaErrorInvalidResourceHandle);                      \
    *out = static_cast<type>(s->field);                                      \
    return cudaSuccess;                                                      \
  }                                                                          \
  cudaError_t name##_ptsz(cudaStream_t hStream, type* out) {                 \
    SIM_ENTER();                                                             \
    if (!out) SIM_RETURN(cudaErrorInvalidValue);                             \
    StreamRef s = resolve_stream(hStream, true);                             \
    if (!s) SIM_RETURN(cudaErrorInvalidResourceHandle);                      \
    *out = static_cast<type>(s->field);                                      \
    return cudaSuccess;                                                      \
  }

SIM_STREAM_GETTER(cudaStreamGetFlags, unsigned int, flags)
SIM_STREAM_GETTER(cudaStreamGetPriority, int, priority)
SIM_STREAM_GETTER(cudaStreamGetId, unsigned long long, id)

namespace {

cudaError_t stream_get_device(cudaStream_t hStream, int* device, bool per_thread) {
  if (!device) SIM_RETURN(cudaErrorInvalidValue);
  StreamRef s = resolve_stream(hStream, per_thread);
  if (!s) SIM_RETURN(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = device_query_capture_guard(s)) SIM_RETURN(err);
  *device = s->device;
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  SIM_ENTER();
  return stream_get_device(hStream, device, false);
}
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t hStream, int* device) {
  SIM_ENTER();
  return stream_get_device(hStream, device, true);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  SIM_ENTER();
  SIM_RETURN(host_func(resolve_stream(stream, false), fn, userData));
}

cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  SIM_ENTER();
  SIM_RETURN(host_func(resolve_stream(stream, true), fn, userData));
}

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                  void* userData, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(add_callback(stream, resolve_stream(stream, false), callback, userData, flags));
}

cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t stream, cudaStreamCallback_t callback,
                                       void* userData, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(add_callback(stream, resolve_stream(stream, true), callback, userData, flags));
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  SIM_ENTER();
  if (!event) SIM_RETURN(cudaErrorInvalidValue);
  *event = create_event(cudaEventDefault);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  SIM_ENTER();
  const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known)) SIM_RETURN(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
    SIM_RETURN(cudaErrorInvalidValue);
  *event = create_event(flags);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(record(event, resolve_stream(stream, false)));
}

cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(record(event, resolve_stream(stream, true)));
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(record(event, resolve_stream(stream, false), flags));
}

cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                          unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(record(event, resolve_stream(stream, true), flags));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  SIM_ENTER();
  SIM_RETURN(event_query(find_event(event)));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  SIM_ENTER();
  cudaError_t err = event_sync(find_event(event));
  SIM_RETURN(err == cudaSuccess ? sticky_error() : err);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  SIM_ENTER();
  SIM_RETURN(destroy_event(event));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  SIM_ENTER();
  SIM_RETURN(event_elapsed(find_event(start), find_event(end), ms));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::begin_capture(stream, mode, false));
  SIM_RETURN(begin_capture(resolve_stream(stream, false), mode));
}

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::begin_capture(stream, mode, true));
  SIM_RETURN(begin_capture(resolve_stream(stream, true), mode));
}

cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                          const cudaGraphNode_t* dependencies,
                                          const cudaGraphEdgeData* dependencyData,
                                          size_t numDependencies, cudaStreamCaptureMode mode) {
  SIM_ENTER();
  (void)dependencies;  // the stand-in's graphs are linear: every node follows the last one
  (void)dependencyData;
  (void)numDependencies;
  if (!graph) SIM_RETURN(cudaErrorInvalidValue);
  SIM_RETURN(begin_capture(resolve_stream(stream, false), mode, graph));
}

cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t* dependencies,
                                               const cudaGraphEdgeData* dependencyData,
                                               size_t numDependencies,
                                               cudaStreamCaptureMode mode) {
  SIM_ENTER();
  (void)dependencies;
  (void)dependencyData;
  (void)numDependencies;
  if (!graph) SIM_RETURN(cudaErrorInvalidValue);
  SIM_RETURN(begin_capture(resolve_stream(stream, true), mode, graph));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::end_capture(stream, pGraph, false));
  SIM_RETURN(end_capture(resolve_stream(stream, false), pGraph));
}

cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph) {
  SIM_ENTER();
  if (rt::kStaticRuntime) SIM_RETURN(via_driver::end_capture(stream, pGraph, true));
  SIM_RETURN(end_capture(resolve_stream(stream, true), pGraph));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  SIM_ENTER();
  SIM_RETURN(is_capturing(resolve_stream(stream, false), pCaptureStatus));
}

cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                       cudaStreamCaptureStatus* pCaptureStatus) {
  SIM_ENTER();
  SIM_RETURN(is_capturing(resolve_stream(stream, true), pCaptureStatus));
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                     cudaStreamCaptureStatus* captureStatus_out,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out,
                                     const cudaGraphEdgeData** edgeData_out,
                                     size_t* numDependencies_out) {
  SIM_ENTER();
  SIM_RETURN(capture_info(resolve_stream(stream, false), captureStatus_out, id_out, graph_out,
                          dependencies_out, edgeData_out, numDependencies_out));
}

cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
                                          cudaStreamCaptureStatus* captureStatus_out,
                                          unsigned long long* id_out, cudaGraph_t* graph_out,
                                          const cudaGraphNode_t** dependencies_out,
                                          const cudaGraphEdgeData** edgeData_out,
                                          size_t* numDependencies_out) {
  SIM_ENTER();
  SIM_RETURN(capture_info(resolve_stream(stream, true), captureStatus_out, id_out, graph_out,
                          dependencies_out, edgeData_out, numDependencies_out));
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  SIM_ENTER();
  if (!mode) SIM_RETURN(cudaErrorInvalidValue);
  // Any value is taken, as a real GPU takes it (Note [Capture legality] in capture.cpp); read
  // as an int: the caller may have stored any value in the enum.
  int requested = 0;
  std::memcpy(&requested, mode, sizeof requested);
  *mode = thread_capture_mode();
  thread_capture_mode() = static_cast<cudaStreamCaptureMode>(requested);
  return cudaSuccess;
}

cudaError_t poolcuda::sim::launch_access(const StreamRef& s, const void* ptr, size_t bytes,
                                         int is_write, void (*fn)(void*), void* user_data) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (bytes && (!mem_in_device_range(ptr) || mem_check(ptr, bytes) != cudaSuccess))
    return cudaErrorInvalidValue;
  Work w;
  w.type = cudaGraphNodeTypeHost;
  char buf[96];
  std::snprintf(buf, sizeof buf, "kernel %s %p (%zu bytes)", is_write ? "writing" : "reading",
                ptr, bytes);
  w.desc = buf;
  if (bytes) {
    auto b = reinterpret_cast<uintptr_t>(ptr);
    w.ranges.push_back(Range{b, b + bytes, is_write != 0});
  }
  if (fn) w.fn = [fn, user_data] { fn(user_data); };
  return submit(s, std::move(w));
}

extern "C" __attribute__((visibility("default"))) int simcuda_launch_access(
    void* stream, const void* ptr, size_t bytes, int is_write, void (*fn)(void*),
    void* user_data) {
  SIM_ENTER();
  SIM_RETURN(launch_access(resolve_stream(static_cast<cudaStream_t>(stream), false), ptr, bytes,
                           is_write, fn, user_data));
}

// Never runs: only its address means something to the runtime's launches (rt_launch.cpp).
extern "C" __attribute__((visibility("default"))) void simcuda_access_kernel(void) {}
