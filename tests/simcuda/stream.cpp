// Streams of the stand-in: handles (legacy, per-thread, created), one worker thread per stream
// started at its first operation, CUDA's ordering between the legacy default stream and blocking
// streams, draining, and the per-device list used by device-wide synchronization.
// Capture decisions are delegated to capture.cpp; events live in event.cpp.
#include "core.h"

#include <algorithm>
#include <atomic>

namespace poolcuda::sim {
namespace {

struct Streams {
  std::map<void*, StreamRef> user;                 // created streams by handle
  std::vector<StreamRef> legacy;                   // per device, null until first use
  std::vector<std::vector<StreamRef>> by_device;   // every stream that may hold work
  std::vector<void*> reusable_handles;  // destroyed streams' (SIMCUDA_REUSE_STREAM_HANDLES)
};

Streams& streams() {
  static auto* s = [] {
    auto* st = new Streams;  // never destroyed: workers outlive static destructors
    st->legacy.resize(static_cast<size_t>(config().devices));
    st->by_device.resize(static_cast<size_t>(config().devices));
    return st;
  }();
  return *s;
}

std::atomic<uint64_t> g_next_stream_id{1};
std::atomic<uint64_t> g_next_op_id{1};

void wait_reached(Stream& s, uint64_t seq) {
  std::unique_lock lk(s.m);
  s.cv.wait(lk, [&] { return s.completed >= seq; });
}

void execute(Stream& s, Stream::Op& op) {
  uint64_t id = g_next_op_id.fetch_add(1);
  race_begin(id, s.id, &op.work.desc, &op.work.ranges);
  if (config().op_delay_us)
    std::this_thread::sleep_for(std::chrono::microseconds(config().op_delay_us));
  // A stream-ordered free is checked against what runs when it starts, but once its memory is
  // back the next allocation may use it on any stream: it must not stay active meanwhile.
  if (op.work.type == cudaGraphNodeTypeMemFree) race_end(id);
  if (op.work.fn) op.work.fn();
  if (op.work.type != cudaGraphNodeTypeMemFree) race_end(id);
}

void worker(StreamRef self) {
  Stream& s = *self;
  std::unique_lock lk(s.m);
  for (;;) {
    s.cv.wait(lk, [&] { return !s.queue.empty() || s.retired; });
    if (s.queue.empty()) break;
    Stream::Op op = std::move(s.queue.front());
    s.queue.pop_front();
    lk.unlock();
    for (auto& [other, seq] : op.waits) wait_reached(*other, seq);
    execute(s, op);
    op = Stream::Op{};  // drop what the op kept alive (a graph exec) before reporting completion
    lk.lock();
    ++s.completed;
    s.cv.notify_all();
  }
}

void retire(const StreamRef& s) {
  std::lock_guard lk(s->m);
  s->retired = true;
  s->cv.notify_all();
}

StreamRef make_stream(int device, StreamKind kind, unsigned flags, int priority) {
  auto s = std::make_shared<Stream>();
  s->id = g_next_stream_id.fetch_add(1);
  s->handle = s.get();
  s->device = device;
  s->kind = kind;
  s->flags = flags;
  s->priority = priority;
  return s;
}

// A thread's per-thread default streams, one per device; retired when the thread exits.
struct PerThread {
  std::vector<StreamRef> by_device;
  ~PerThread() {
    for (auto& s : by_device) {
      if (!s) continue;
      cudaGraph_t doomed;
      {
        std::lock_guard lock(state_mutex());
        doomed = abandon_capture_locked(*s);
      }
      if (doomed) graph_destroy(doomed);
      retire(s);
    }
  }
};

StreamRef per_thread_stream(int device) {
  thread_local PerThread pt;
  if (!valid_device(device)) return nullptr;
  if (pt.by_device.empty()) pt.by_device.resize(static_cast<size_t>(config().devices));
  StreamRef& s = pt.by_device[static_cast<size_t>(device)];
  if (!s) {
    s = make_stream(device, StreamKind::per_thread, 0, 0);
    std::lock_guard lock(state_mutex());
    streams().by_device[static_cast<size_t>(device)].push_back(s);
  }
  return s;
}

uint64_t pending_seq(Stream& s) {
  std::lock_guard lk(s.m);
  return s.submitted > s.completed ? s.submitted : 0;
}

}  // namespace

std::mutex& effects_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

StreamRef legacy_stream(int device) {
  if (!valid_device(device)) return nullptr;
  std::lock_guard lock(state_mutex());
  Streams& st = streams();
  StreamRef& s = st.legacy[static_cast<size_t>(device)];
  if (!s) {
    s = make_stream(device, StreamKind::legacy, 0, 0);
    st.by_device[static_cast<size_t>(device)].push_back(s);
  }
  return s;
}

StreamRef resolve_stream(cudaStream_t handle, bool per_thread_default) {
  int device = current_device();
  if (handle == nullptr) return per_thread_default ? per_thread_stream(device) : legacy_stream(device);
  if (handle == cudaStreamLegacy) return legacy_stream(device);
  if (handle == cudaStreamPerThread) return per_thread_stream(device);
  std::lock_guard lock(state_mutex());
  auto it = streams().user.find(handle);
  return it == streams().user.end() ? nullptr : it->second;
}

StreamRef create_stream(int device, unsigned flags, int priority) {
  StreamRef s = make_stream(device, StreamKind::user, flags, priority);
  std::lock_guard lock(state_mutex());
  if (config().reuse_stream_handles) {
    // Handles are then tokens of their own, never freed: a stream object's address, once freed,
    // could be a later stream's own while a destroyed stream's handle is in use again.
    std::vector<void*>& reusable = streams().reusable_handles;
    if (reusable.empty()) {
      s->handle = new char;
    } else {
      s->handle = reusable.back();
      reusable.pop_back();
    }
  }
  streams().user.emplace(s->handle, s);
  streams().by_device[static_cast<size_t>(device)].push_back(s);
  return s;
}

uint64_t stream_handle_id(const StreamRef& s) { return s ? s->id : 0; }

cudaError_t destroy_stream(cudaStream_t handle) {
  StreamRef s;
  cudaGraph_t doomed;
  {
    std::lock_guard lock(state_mutex());
    auto it = streams().user.find(handle);
    if (it == streams().user.end()) return cudaErrorInvalidResourceHandle;
    s = it->second;
    streams().user.erase(it);
    if (config().reuse_stream_handles) streams().reusable_handles.push_back(s->handle);
    doomed = abandon_capture_locked(*s);
  }
  if (doomed) graph_destroy(doomed);
  // Like CUDA, work already queued still runs; the worker exits once it has drained.
  retire(s);
  return cudaSuccess;
}

uint64_t enqueue_locked(const StreamRef& s, Work work) {
  Stream::Op op;
  op.work = std::move(work);
  Streams& st = streams();
  auto& list = st.by_device[static_cast<size_t>(s->device)];
  if (s->kind == StreamKind::legacy) {
    // The legacy stream waits for all prior work of every blocking stream on its device.
    for (const StreamRef& other : list)
      if (other != s && other->blocking())
        if (uint64_t seq = pending_seq(*other)) op.waits.emplace_back(other, seq);
  } else if (s->blocking()) {
    // ... and every blocking stream waits for all prior work of the legacy stream.
    const StreamRef& legacy = st.legacy[static_cast<size_t>(s->device)];
    if (legacy)
      if (uint64_t seq = pending_seq(*legacy)) op.waits.emplace_back(legacy, seq);
  }
  std::lock_guard lk(s->m);
  s->queue.push_back(std::move(op));
  uint64_t seq = ++s->submitted;
  if (!s->worker_started) {
    s->worker_started = true;
    std::thread(worker, s).detach();
  }
  s->cv.notify_all();
  return seq;
}

cudaError_t submit(const StreamRef& s, Work work) {
  if (!s) return cudaErrorInvalidResourceHandle;
  // Event nodes of a launched graph record / wait at launch time.
  if (work.type == cudaGraphNodeTypeEventRecord && work.event) return event_record(work.event, s);
  if (work.type == cudaGraphNodeTypeWaitEvent && work.event) return event_wait(s, work.event);
  std::lock_guard lock(state_mutex());
  if (s->capture) return capture_append_locked(*s, std::move(work));
  if (s->kind == StreamKind::legacy && invalidate_blocking_captures_locked(s->device))
    return cudaErrorStreamCaptureImplicit;
  enqueue_locked(s, std::move(work));
  return cudaSuccess;
}

void drain(const StreamRef& s) {
  uint64_t seq;
  {
    std::lock_guard lk(s->m);
    seq = s->submitted;
  }
  wait_reached(*s, seq);
}

bool idle(const StreamRef& s) {
  std::lock_guard lk(s->m);
  return s->completed == s->submitted;
}

cudaError_t stream_query(const StreamRef& s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (cudaError_t err = wait_capture_guard(s); err != cudaSuccess) return err;
  return idle(s) ? cudaSuccess : cudaErrorNotReady;
}

std::vector<StreamRef> device_streams(int device) {
  auto& list = streams().by_device[static_cast<size_t>(device)];
  // Forget retired streams that have finished their work.
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](const StreamRef& s) {
                              std::lock_guard lk(s->m);
                              return s->retired && s->completed == s->submitted;
                            }),
             list.end());
  return list;
}

void device_drain(int device) {
  std::vector<std::pair<StreamRef, uint64_t>> targets;
  {
    std::lock_guard lock(state_mutex());
    for (const StreamRef& s : device_streams(device)) {
      std::lock_guard lk(s->m);
      targets.emplace_back(s, s->submitted);
    }
  }
  for (auto& [s, seq] : targets) wait_reached(*s, seq);
}

void device_reset_streams(int device) {
  std::vector<StreamRef> doomed;
  std::vector<cudaGraph_t> graphs;
  {
    std::lock_guard lock(state_mutex());
    Streams& st = streams();
    for (auto it = st.user.begin(); it != st.user.end();) {
      if (it->second->device == device) {
        doomed.push_back(it->second);
        it = st.user.erase(it);
      } else {
        ++it;
      }
    }
    StreamRef& legacy = st.legacy[static_cast<size_t>(device)];
    if (legacy) doomed.push_back(legacy);
    legacy.reset();
    for (const StreamRef& s : device_streams(device))
      if (cudaGraph_t g = abandon_capture_locked(*s)) graphs.push_back(g);
  }
  for (cudaGraph_t g : graphs) graph_destroy(g);
  for (const StreamRef& s : doomed) retire(s);
}

}  // namespace poolcuda::sim
