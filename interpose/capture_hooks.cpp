// The stream-capture hooks: cudaStreamBeginCapture, cudaStreamBeginCaptureToGraph and
// cudaStreamEndCapture (and their per-thread-default-stream variants) tell the device's capture
// policy when a window opens and closes, and a stream destroyed mid-capture closes its capture
// as failed. They only translate: what a window does with memory is capture/'s business
// (Note [Capture windows] in capture/capture_policy.cpp).
//
// Note [Capture begin and fences]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A fence records an event on the legacy stream, which invalidates any capture that a blocking
// stream has open on the device. So the real begin runs under the stream table's lock, the lock
// a fence holds from its check for open captures to its last record, and the device's count of
// open captures goes up before that lock is released: a begin and a fence never interleave.
// Before the lock, the policy primes the persistent pool (Note [Priming]) and drains the pin
// releases of graphs that are gone, so the window finds that memory free.
//
// Depends on the registry, the capture policy, the graph owner and the real-function table.
#include "interpose/hooks.h"

#include "interpose/graph_owner.h"
#include "interpose/real_cuda.h"
#include "interpose/registry.h"
#include "interpose/release_worker.h"
#include "interpose/stream_order.h"

namespace poolcuda::hooks {

namespace {

struct OpenCapture {
  int device = -1;
  unsigned long long id = 0;
  explicit operator bool() const { return id != 0; }
};

int stream_device(cudaStream_t stream, bool per_thread) {
  int device = -1;
  const cudaError_t result = per_thread ? real::cudaStreamGetDevice_ptsz()(stream, &device)
                                        : real::cudaStreamGetDevice()(stream, &device);
  if (result == cudaSuccess) return device;
  // A runtime without cudaStreamGetDevice: the stream is the current device's.
  if (real::cudaGetDevice()(&device) != cudaSuccess) return -1;
  real::cudaGetLastError()();
  return device;
}

// The capture open on `stream` now (an empty value when none is, or the stream is gone).
OpenCapture open_capture(cudaStream_t stream, bool per_thread, int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaError_t result =
      per_thread ? real::cudaStreamGetCaptureInfo_ptsz()(stream, &status, &id, nullptr, nullptr,
                                                         nullptr, nullptr)
                 : real::cudaStreamGetCaptureInfo()(stream, &status, &id, nullptr, nullptr,
                                                    nullptr, nullptr);
  if (result != cudaSuccess || status == cudaStreamCaptureStatusNone) return {};
  return OpenCapture{device, id};
}

template <typename RealBegin>
cudaError_t begin(cudaStream_t stream, bool per_thread, RealBegin real_begin) {
  Registry& registry = Registry::instance();
  const int device = stream_device(stream, per_thread);
  if (device < 0 || registry.manager_or_create(device) == nullptr) return real_begin();
  CapturePolicy& policy = *registry.capture(device);
  stream_order::capture_beginning(device);  // Note [Stream-ordered reuse]
  policy.drain_releases();
  policy.prime();
  cudaError_t result = cudaSuccess;
  OpenCapture capture;
  {
    auto table = registry.streams().lock();  // Note [Capture begin and fences]
    result = real_begin();
    if (result == cudaSuccess) {
      capture = open_capture(stream, per_thread, device);
      if (capture) registry.device(device)->capture_began();
    }
  }
  if (capture) policy.begin(capture.id);
  return result;
}

// After a call that may have ended `capture` (an end, a stream destroy): when it did, the
// policy closes it, pinning its memory to `graph` when there is one.
void close_if_ended(const OpenCapture& capture, cudaStream_t stream, bool per_thread,
                    cudaGraph_t graph) {
  if (!capture) return;
  Registry& registry = Registry::instance();
  CapturePolicy* policy = registry.capture(capture.device);
  if (policy == nullptr || !policy->is_open(capture.id)) return;  // begun behind our back
  if (open_capture(stream, per_thread, capture.device).id == capture.id) return;  // still open
  registry.device(capture.device)->capture_ended();
  PinSet* set = policy->end(capture.id, graph != nullptr);
  if (set != nullptr && !attach_to_graph(graph, capture.device, set)) policy->release(set);
  ReleaseWorker::instance().wake();  // pages held back by the capture may go now
}

}  // namespace

cudaError_t stream_begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode,
                                 bool per_thread) {
  return begin(stream, per_thread, [&] {
    return per_thread ? real::cudaStreamBeginCapture_ptsz()(stream, mode)
                      : real::cudaStreamBeginCapture()(stream, mode);
  });
}

cudaError_t stream_begin_capture_to_graph(cudaStream_t stream, cudaGraph_t graph,
                                          const cudaGraphNode_t* dependencies,
                                          const cudaGraphEdgeData* edges,
                                          std::size_t count, cudaStreamCaptureMode mode,
                                          bool per_thread) {
  return begin(stream, per_thread, [&] {
    return per_thread ? real::cudaStreamBeginCaptureToGraph_ptsz()(stream, graph, dependencies,
                                                                   edges, count, mode)
                      : real::cudaStreamBeginCaptureToGraph()(stream, graph, dependencies,
                                                              edges, count, mode);
  });
}

cudaError_t stream_end_capture(cudaStream_t stream, cudaGraph_t* graph, bool per_thread) {
  const int device = stream_device(stream, per_thread);
  const OpenCapture capture = open_capture(stream, per_thread, device);
  const cudaError_t result = per_thread ? real::cudaStreamEndCapture_ptsz()(stream, graph)
                                        : real::cudaStreamEndCapture()(stream, graph);
  const bool made_graph = result == cudaSuccess && graph != nullptr && *graph != nullptr;
  close_if_ended(capture, stream, per_thread, made_graph ? *graph : nullptr);
  return result;
}

void stream_destroyed_while_capturing(cudaStream_t stream, int device,
                                      unsigned long long capture_id) {
  close_if_ended(OpenCapture{device, capture_id}, stream, false, nullptr);
}

unsigned long long stream_capture_id(cudaStream_t stream, int* device) {
  *device = stream_device(stream, false);
  return open_capture(stream, false, *device).id;
}

}  // namespace poolcuda::hooks
