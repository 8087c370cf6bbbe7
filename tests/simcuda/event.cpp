// Events of the stand-in: the handle registry, record (a marker operation that timestamps the
// event when the stream reaches it), cross-stream waits, query, synchronize and elapsed time.
// An event recorded inside a capture refers to the capture until recorded again outside one.
#include "core.h"

namespace poolcuda::sim {
namespace {

struct Events {
  std::map<void*, EventRef> by_handle;
};

Events& events() {
  static auto* e = new Events;  // never destroyed (see state_mutex)
  return *e;
}

bool reached(Stream& s, uint64_t seq) {
  std::lock_guard lk(s.m);
  return s.completed >= seq;
}

}  // namespace

EventRef find_event(cudaEvent_t e) {
  std::lock_guard lock(state_mutex());
  auto it = events().by_handle.find(e);
  return it == events().by_handle.end() ? nullptr : it->second;
}

cudaEvent_t create_event(unsigned flags) {
  auto ev = std::make_shared<Event>();
  ev->flags = flags;
  ev->device = current_device();
  std::lock_guard lock(state_mutex());
  events().by_handle.emplace(ev.get(), ev);
  return reinterpret_cast<cudaEvent_t>(ev.get());
}

cudaError_t destroy_event(cudaEvent_t e) {
  EventRef doomed;  // released after the lock: queued records keep their own reference
  std::lock_guard lock(state_mutex());
  auto it = events().by_handle.find(e);
  if (it == events().by_handle.end()) return cudaErrorInvalidResourceHandle;
  doomed = it->second;
  events().by_handle.erase(it);
  return cudaSuccess;
}

void device_reset_events(int device) {
  std::vector<EventRef> doomed;
  std::lock_guard lock(state_mutex());
  for (auto it = events().by_handle.begin(); it != events().by_handle.end();) {
    if (it->second->device == device) {
      doomed.push_back(it->second);
      it = events().by_handle.erase(it);
    } else {
      ++it;
    }
  }
}

cudaError_t event_record(const EventRef& ev, const StreamRef& s, bool external) {
  if (!ev || !s) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(state_mutex());
  if (s->capture) {
    if (s->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    if (external) {
      Work w;
      w.type = cudaGraphNodeTypeEventRecord;
      w.desc = "event record";
      w.event = ev;
      return capture_append_locked(*s, std::move(w));
    }
    ev->captured = true;
    ev->capture_of = s->capture;
    return cudaSuccess;
  }
  if (s->kind == StreamKind::legacy && invalidate_blocking_captures_locked(s->device))
    return cudaErrorStreamCaptureImplicit;
  uint64_t gen = ++ev->gen;
  Work w;
  w.type = cudaGraphNodeTypeEventRecord;
  w.desc = "event record";
  std::weak_ptr<Event> weak = ev;
  w.fn = [weak, gen] {
    if (auto e = weak.lock()) {
      std::lock_guard tl(e->time_mutex);
      e->time = std::chrono::steady_clock::now();
      e->time_gen = gen;
    }
  };
  ev->seq = enqueue_locked(s, std::move(w));
  ev->stream = s;
  ev->recorded = true;
  ev->captured = false;
  ev->capture_of.reset();
  return cudaSuccess;
}

cudaError_t stream_wait_event(const StreamRef& s, cudaEvent_t e, unsigned flags) {
  if (flags & ~unsigned{cudaEventWaitExternal}) return cudaErrorInvalidValue;
  return event_wait(s, find_event(e), flags & cudaEventWaitExternal);
}

cudaError_t event_wait(const StreamRef& s, const EventRef& ev, bool external) {
  if (!ev || !s) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(state_mutex());
  if (s->capture && s->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
  if (ev->captured && !external) {
    auto cap = ev->capture_of.lock();
    if (!cap) return cudaErrorStreamCaptureIsolation;
    if (s->capture == cap) return cudaSuccess;  // same capture: already ordered (linear graph)
    if (s->capture) return cudaErrorStreamCaptureMerge;
    // Waiting on an event of a capture joins this stream to that capture (fork pattern).
    capture_join_locked(s, cap);
    return cudaSuccess;
  }
  if (s->capture) {
    // Only an external wait on an event from outside the capture is legal: it becomes a node.
    // Another is refused and invalidates the capture, as on an H200 (driver 580).
    if (!external) {
      s->capture->invalidated = true;
      return cudaErrorStreamCaptureIsolation;
    }
    Work w;
    w.type = cudaGraphNodeTypeWaitEvent;
    w.desc = "event wait";
    w.event = ev;
    return capture_append_locked(*s, std::move(w));
  }
  if (s->kind == StreamKind::legacy && invalidate_blocking_captures_locked(s->device))
    return cudaErrorStreamCaptureImplicit;
  if (!ev->recorded || ev->stream == s) return cudaSuccess;
  Work w;
  w.desc = "event wait";
  w.type = cudaGraphNodeTypeWaitEvent;
  // The wait itself is expressed through the op's wait list.
  StreamRef source = ev->stream;
  uint64_t seq = ev->seq;
  w.fn = [source, seq] {
    std::unique_lock lk(source->m);
    source->cv.wait(lk, [&] { return source->completed >= seq; });
  };
  enqueue_locked(s, std::move(w));
  return cudaSuccess;
}

namespace {

// The stream point an event query or sync waits for. Answers an error, or success with `*s`
// left empty when there is nothing to wait for (a never-recorded event is complete).
cudaError_t recorded_point(const EventRef& ev, StreamRef* s, uint64_t* seq) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(state_mutex());
  if (ev->captured) {
    // It invalidates the capture the event was recorded in, as on an H200 (driver 580).
    if (auto cap = ev->capture_of.lock()) cap->invalidated = true;
    return cudaErrorCapturedEvent;
  }
  // Querying or waiting for an event during a capture is treated as potentially unsafe (see
  // Note [Capture legality]): code that must work under capture brackets it with relaxed mode.
  if (cudaError_t err = check_unsafe_call_locked(); err != cudaSuccess) return err;
  if (ev->recorded) {
    *s = ev->stream;
    *seq = ev->seq;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t event_query(const EventRef& ev) {
  StreamRef s;
  uint64_t seq = 0;
  if (cudaError_t err = recorded_point(ev, &s, &seq); err != cudaSuccess || !s) return err;
  return reached(*s, seq) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t event_sync(const EventRef& ev) {
  StreamRef s;
  uint64_t seq = 0;
  if (cudaError_t err = recorded_point(ev, &s, &seq); err != cudaSuccess || !s) return err;
  std::unique_lock lk(s->m);
  s->cv.wait(lk, [&] { return s->completed >= seq; });
  return cudaSuccess;
}

cudaError_t event_elapsed(const EventRef& start, const EventRef& end, float* ms) {
  if (!ms) return cudaErrorInvalidValue;
  if (!start || !end) return cudaErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  uint64_t gens[2];
  {
    std::lock_guard lock(state_mutex());
    if (start->captured || end->captured) return cudaErrorCapturedEvent;
    if (!start->recorded || !end->recorded) return cudaErrorInvalidResourceHandle;
    gens[0] = start->gen;
    gens[1] = end->gen;
  }
  if (event_query(start) == cudaErrorNotReady || event_query(end) == cudaErrorNotReady)
    return cudaErrorNotReady;
  std::chrono::steady_clock::time_point t[2];
  const EventRef* evs[2] = {&start, &end};
  for (int i = 0; i < 2; ++i) {
    std::lock_guard tl((*evs[i])->time_mutex);
    if ((*evs[i])->time_gen != gens[i]) return cudaErrorNotReady;
    t[i] = (*evs[i])->time;
  }
  *ms = std::chrono::duration<float, std::milli>(t[1] - t[0]).count();
  return cudaSuccess;
}

}  // namespace poolcuda::sim
