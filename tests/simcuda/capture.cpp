// Stream capture in the stand-in: begin/end, the three capture modes and CUDA's legality rules
// for "potentially unsafe" calls (see Note [Capture legality]), invalidation, capture info, and
// stream-ordered allocation (memory nodes inside a capture). Graph objects live in graph.cpp.
#include "core.h"

#include <atomic>

namespace poolcuda::sim {
namespace {

// Note [Capture legality]
// The thread's mode (cudaThreadExchangeStreamCaptureMode, default global) decides which ongoing
// captures forbid a potentially unsafe call (an allocation) on this thread:
//   global:       a capture begun by this thread in a non-relaxed mode, or a capture begun by
//                 any other thread in global mode;
//   thread-local: a capture begun by this thread in a non-relaxed mode;
//   relaxed:      none.
// A mode outside the three (the exchange accepts any value, as CUDA does) counts as global.
// Potentially unsafe here: allocations (cudaMalloc, cudaMallocPitch, cudaMallocManaged,
// cudaMallocHost, cudaHostAlloc, cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged), frees
// (cudaFree, cuMemFree), waiting for or querying an event (cudaEventQuery, cudaEventSynchronize)
// and waiting for or querying any stream (cudaStreamSynchronize, cudaStreamQuery and the
// driver's): a real GPU refuses a synchronize of the legacy stream under a global capture of a
// non-blocking stream, and a query of an unrelated stream under a thread-local one, and allows a
// free under a relaxed capture.
// A forbidden call fails with cudaErrorStreamCaptureUnsupported and invalidates the captures
// that forbade it; an invalidated capture refuses further work with
// cudaErrorStreamCaptureInvalidated and its EndCapture returns that code and no graph.

struct Captures {
  std::vector<std::shared_ptr<Capture>> active;
};

Captures& captures() {
  static auto* c = new Captures;  // never destroyed (see state_mutex)
  return *c;
}

std::atomic<uint64_t> g_next_capture_id{1};

void detach_members(Capture& c) {
  for (auto& weak : c.members)
    if (auto s = weak.lock())
      if (s->capture.get() == &c) s->capture.reset();
}

}  // namespace

cudaStreamCaptureMode& thread_capture_mode() {
  thread_local cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  return mode;
}

cudaError_t check_unsafe_call_locked() {
  cudaStreamCaptureMode mode = thread_capture_mode();
  if (mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  auto self = std::this_thread::get_id();
  bool refused = false;
  for (auto& c : captures().active) {
    bool mine = c->thread == self && c->mode != cudaStreamCaptureModeRelaxed;
    bool theirs = mode != cudaStreamCaptureModeThreadLocal && c->thread != self &&
                  c->mode == cudaStreamCaptureModeGlobal;
    if (mine || theirs) {
      c->invalidated = true;
      refused = true;
    }
  }
  return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t check_unsafe_call() {
  std::lock_guard lock(state_mutex());
  return check_unsafe_call_locked();
}

bool invalidate_device_captures_locked(int device) {
  bool any = false;
  for (auto& c : captures().active)
    if (c->device == device) {
      c->invalidated = true;
      any = true;
    }
  return any;
}

bool invalidate_blocking_captures_locked(int device) {
  bool any = false;
  for (auto& c : captures().active)
    if (c->device == device && c->origin_blocking) {
      c->invalidated = true;
      any = true;
    }
  return any;
}

cudaError_t wait_capture_guard(const StreamRef& s) {
  std::lock_guard lock(state_mutex());
  if (s->capture) {
    s->capture->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (cudaError_t err = check_unsafe_call_locked(); err != cudaSuccess) return err;
  if (s->kind == StreamKind::legacy && invalidate_blocking_captures_locked(s->device))
    return cudaErrorStreamCaptureImplicit;
  return cudaSuccess;
}

cudaError_t device_query_capture_guard(const StreamRef& s) {
  std::lock_guard lock(state_mutex());
  if (!s->capture) return cudaSuccess;
  s->capture->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

bool any_capture_locked(int device) {
  for (auto& c : captures().active)
    if (c->device == device) return true;
  return false;
}

cudaError_t begin_capture(const StreamRef& s, cudaStreamCaptureMode mode, cudaGraph_t into) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return cudaErrorInvalidValue;
  std::shared_ptr<Graph> graph = into != nullptr ? find_graph(into) : std::make_shared<Graph>();
  if (!graph) return cudaErrorInvalidValue;
  cudaGraph_t handle = into != nullptr ? into : register_graph(graph);
  std::unique_lock lock(state_mutex());
  cudaError_t err = cudaSuccess;
  if (s->kind == StreamKind::legacy)
    err = cudaErrorStreamCaptureUnsupported;
  else if (s->capture)
    err = cudaErrorIllegalState;
  if (err != cudaSuccess) {
    lock.unlock();
    if (into == nullptr) graph_destroy(handle);
    return err;
  }
  auto c = std::make_shared<Capture>();
  c->id = g_next_capture_id.fetch_add(1);
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->device = s->device;
  c->origin = s.get();
  c->origin_blocking = s->blocking();
  c->members.push_back(s);
  c->graph_handle = handle;
  c->graph = graph;
  c->owns_graph = into == nullptr;
  s->capture = c;
  captures().active.push_back(c);
  return cudaSuccess;
}

cudaGraph_t abandon_capture_locked(Stream& s) {
  std::shared_ptr<Capture> c = std::move(s.capture);
  if (!c) return nullptr;
  c->invalidated = true;
  if (c->origin != &s) return nullptr;  // a joined stream leaving: the capture goes on
  detach_members(*c);
  std::erase(captures().active, c);
  return c->owns_graph ? c->graph_handle : nullptr;
}

void capture_join_locked(const StreamRef& s, const std::shared_ptr<Capture>& cap) {
  s->capture = cap;
  cap->members.push_back(s);
}

cudaError_t end_capture(const StreamRef& s, cudaGraph_t* out) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (!out) return cudaErrorInvalidValue;
  cudaGraph_t doomed = nullptr;
  cudaError_t err = cudaSuccess;
  {
    std::lock_guard lock(state_mutex());
    *out = nullptr;
    if (!s->capture) return cudaErrorIllegalState;
    std::shared_ptr<Capture> c = s->capture;
    if (c->origin != s.get()) return cudaErrorStreamCaptureUnmatched;
    // Another thread ending a non-relaxed capture is refused, and the capture is over all the
    // same: a real GPU leaves the stream not capturing and drops what was captured.
    bool wrong_thread =
        c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id();
    detach_members(*c);
    auto& active = captures().active;
    std::erase(active, c);
    if (wrong_thread) {
      doomed = c->owns_graph ? c->graph_handle : nullptr;
      err = cudaErrorStreamCaptureWrongThread;
    } else if (c->invalidated) {
      doomed = c->owns_graph ? c->graph_handle : nullptr;
      *out = nullptr;
      err = cudaErrorStreamCaptureInvalidated;
    } else {
      *out = c->graph_handle;
    }
  }
  if (doomed) graph_destroy(doomed);
  return err;
}

cudaError_t capture_append_locked(Stream& s, Work work) {
  Capture& c = *s.capture;
  if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
  // Graph memory belongs to the graph's lifetime (GraphMem), not to each launch: memory nodes
  // replay as no-ops.
  if (work.type == cudaGraphNodeTypeMemAlloc || work.type == cudaGraphNodeTypeMemFree)
    work.fn = nullptr;
  auto node = std::make_unique<Node>();
  node->work = std::move(work);
  cudaGraphNode_t handle = reinterpret_cast<cudaGraphNode_t>(node.get());
  c.graph->nodes.push_back(std::move(node));
  c.deps.assign(1, handle);
  c.edges.assign(1, cudaGraphEdgeData{});
  return cudaSuccess;
}

cudaError_t capture_info(const StreamRef& s, cudaStreamCaptureStatus* status,
                         unsigned long long* id, cudaGraph_t* graph,
                         const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                         size_t* num_deps) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (!status) return cudaErrorInvalidValue;
  std::lock_guard lock(state_mutex());
  if (s->kind == StreamKind::legacy) {
    for (auto& c : captures().active)
      if (c->device == s->device && c->origin_blocking) return cudaErrorStreamCaptureImplicit;
  }
  Capture* c = s->capture.get();
  if (!c) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status = c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  // An invalidated capture has no id to report any more (0), as an H200 answers (driver 580).
  if (id) *id = c->invalidated ? 0 : c->id;
  if (graph) *graph = c->graph_handle;
  if (deps) *deps = c->deps.empty() ? nullptr : c->deps.data();
  if (edges) *edges = c->edges.empty() ? nullptr : c->edges.data();
  if (num_deps) *num_deps = c->deps.size();
  return cudaSuccess;
}

cudaError_t malloc_async(const StreamRef& s, size_t size, void** out, int device) {
  if (!out) return cudaErrorInvalidValue;
  if (!s) return cudaErrorInvalidResourceHandle;
  if (device < 0) device = s->device;
  std::lock_guard lock(state_mutex());
  if (!s->capture) {
    if (s->kind == StreamKind::legacy && invalidate_blocking_captures_locked(s->device))
      return cudaErrorStreamCaptureImplicit;
    return mem_alloc(device, size, AllocKind::async, out);
  }
  if (s->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
  uint64_t id = 0;
  cudaError_t err = mem_alloc(device, size, AllocKind::graph, out, &id);
  if (err != cudaSuccess) return err;
  s->capture->graph->mems.push_back(make_graph_mem(*out, id));
  Work w;
  w.type = cudaGraphNodeTypeMemAlloc;
  w.desc = "graph memory alloc";
  w.mem = *out;
  w.mem_size = size;
  return capture_append_locked(*s, std::move(w));
}

cudaError_t free_async(const StreamRef& s, void* ptr) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (!ptr) return cudaErrorInvalidValue;
  AllocInfo info;
  if (!mem_find(ptr, &info) || info.base != reinterpret_cast<uintptr_t>(ptr))
    return cudaErrorInvalidValue;
  // Outside a capture the memory returns when the stream reaches the free; the free counts as
  // a write of the whole block, so a use on an unordered stream is reported as a race. Inside a
  // capture it becomes a memory free node (see capture_append_locked).
  Work w;
  w.type = cudaGraphNodeTypeMemFree;
  w.desc = "cudaFreeAsync";
  w.mem = ptr;
  w.ranges.push_back(Range{info.base, info.base + info.size, true});
  uint64_t id = info.id;
  w.fn = [ptr, id] {
    std::lock_guard lock(effects_mutex());
    mem_free(ptr, id);
  };
  return submit(s, std::move(w));
}

}  // namespace poolcuda::sim
