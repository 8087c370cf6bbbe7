// Graphs, executable graphs and user objects of the stand-in. A graph is the linear list of
// nodes its capture produced; clones and execs copy the nodes and take their own user-object
// references; a launch enqueues the nodes in order and keeps its exec alive until the last one
// has run. A user object's destructor runs once its last reference goes: on the releasing thread
// for cudaUserObjectRelease, on an internal thread otherwise (Note [User object destructors]).
// Graph contents and registries are guarded by state_mutex; user objects by their own mutex.
#include "core.h"

#include <set>

namespace poolcuda::sim {

struct GraphMem {
  void* ptr = nullptr;
  uint64_t id = 0;
  ~GraphMem() { mem_free(ptr, id); }  // no-op if the program already freed it
};

struct UserObject {
  void* ptr = nullptr;
  cudaHostFn_t fn = nullptr;
  unsigned refs = 0;
};

namespace {

struct Graphs {
  std::map<void*, std::shared_ptr<Graph>> graphs;
  std::map<void*, std::shared_ptr<GraphExec>> execs;
};

Graphs& graphs() {
  static auto* g = new Graphs;  // never destroyed (see state_mutex)
  return *g;
}

struct UserObjects {
  std::mutex m;
  std::condition_variable cv;
  std::set<UserObject*> live;
  std::deque<UserObject*> dying;
  bool thread_started = false;
};

UserObjects& user_objects() {
  static auto* u = new UserObjects;  // never destroyed: its thread outlives static destructors
  return *u;
}

void destructor_thread() {
  UserObjects& u = user_objects();
  std::unique_lock lk(u.m);
  for (;;) {
    u.cv.wait(lk, [&] { return !u.dying.empty(); });
    UserObject* o = u.dying.front();
    u.dying.pop_front();
    lk.unlock();
    // A late internal thread (SIMCUDA_DESTRUCTOR_DELAY_US): CUDA runs it when it will.
    if (config().destructor_delay_us)
      std::this_thread::sleep_for(std::chrono::microseconds(config().destructor_delay_us));
    o->fn(o->ptr);
    delete o;
    lk.lock();
  }
}

// Requires u.m. With `dead`, an object whose last reference goes is handed to the caller, who
// runs its destructor on its own thread; otherwise the internal thread runs it.
cudaError_t release_locked(UserObjects& u, UserObject* o, unsigned count,
                           UserObject** dead = nullptr) {
  if (!u.live.count(o)) return cudaErrorInvalidResourceHandle;
  if (count == 0 || count > o->refs) return cudaErrorInvalidValue;
  o->refs -= count;
  if (o->refs == 0) {
    u.live.erase(o);
    if (dead) {
      *dead = o;
      return cudaSuccess;
    }
    u.dying.push_back(o);
    if (!u.thread_started) {
      u.thread_started = true;
      std::thread(destructor_thread).detach();
    }
    u.cv.notify_all();
  }
  return cudaSuccess;
}

}  // namespace

Graph::~Graph() { release_refs(refs); }
GraphExec::~GraphExec() { release_refs(refs); }

std::shared_ptr<GraphMem> make_graph_mem(void* ptr, uint64_t id) {
  auto m = std::make_shared<GraphMem>();
  m->ptr = ptr;
  m->id = id;
  return m;
}

void retain_refs(const std::map<UserObject*, unsigned>& refs) {
  UserObjects& u = user_objects();
  std::lock_guard lk(u.m);
  for (auto& [o, n] : refs) o->refs += n;
}

void release_refs(const std::map<UserObject*, unsigned>& refs) {
  UserObjects& u = user_objects();
  std::lock_guard lk(u.m);
  for (auto& [o, n] : refs) release_locked(u, o, n);
}

cudaGraph_t register_graph(std::shared_ptr<Graph> g) {
  std::lock_guard lock(state_mutex());
  void* handle = g.get();
  graphs().graphs.emplace(handle, std::move(g));
  return static_cast<cudaGraph_t>(handle);
}

std::shared_ptr<Graph> find_graph(cudaGraph_t g) {
  std::lock_guard lock(state_mutex());
  auto it = graphs().graphs.find(g);
  return it == graphs().graphs.end() ? nullptr : it->second;
}

cudaError_t graph_destroy(cudaGraph_t g) {
  std::shared_ptr<Graph> doomed;  // destroyed after the lock is released
  std::lock_guard lock(state_mutex());
  auto it = graphs().graphs.find(g);
  if (it == graphs().graphs.end()) return cudaErrorInvalidValue;
  doomed = std::move(it->second);
  graphs().graphs.erase(it);
  return cudaSuccess;
}

cudaError_t graph_clone(cudaGraph_t* out, cudaGraph_t g) {
  if (!out) return cudaErrorInvalidValue;
  auto clone = std::make_shared<Graph>();
  {
    std::lock_guard lock(state_mutex());
    auto it = graphs().graphs.find(g);
    if (it == graphs().graphs.end()) return cudaErrorInvalidValue;
    const Graph& src = *it->second;
    for (const auto& n : src.nodes) clone->nodes.push_back(std::make_unique<Node>(*n));
    clone->mems = src.mems;
    retain_refs(src.refs);
    clone->refs = src.refs;
  }
  *out = register_graph(std::move(clone));
  return cudaSuccess;
}

cudaError_t graph_instantiate(cudaGraphExec_t* out, cudaGraph_t g) {
  if (!out) return cudaErrorInvalidValue;
  auto exec = std::make_shared<GraphExec>();
  exec->device = current_device();
  std::lock_guard lock(state_mutex());
  auto it = graphs().graphs.find(g);
  if (it == graphs().graphs.end()) return cudaErrorInvalidValue;
  const Graph& src = *it->second;
  for (const auto& n : src.nodes) exec->nodes.push_back(n->work);
  exec->mems = src.mems;
  retain_refs(src.refs);
  exec->refs = src.refs;
  void* handle = exec.get();
  graphs().execs.emplace(handle, std::move(exec));
  *out = static_cast<cudaGraphExec_t>(handle);
  return cudaSuccess;
}

cudaError_t graph_exec_destroy(cudaGraphExec_t e) {
  std::shared_ptr<GraphExec> doomed;  // running launches keep their own reference
  std::lock_guard lock(state_mutex());
  auto it = graphs().execs.find(e);
  if (it == graphs().execs.end()) return cudaErrorInvalidValue;
  doomed = std::move(it->second);
  graphs().execs.erase(it);
  return cudaSuccess;
}

cudaError_t graph_launch(cudaGraphExec_t e, const StreamRef& s) {
  std::shared_ptr<GraphExec> exec;
  {
    std::lock_guard lock(state_mutex());
    auto it = graphs().execs.find(e);
    if (it == graphs().execs.end()) return cudaErrorInvalidValue;
    exec = it->second;
    if (!s) return cudaErrorInvalidResourceHandle;
    // Launching a graph into a capture (a child graph node) is not modelled.
    if (s->capture) return cudaErrorStreamCaptureUnsupported;
  }
  if (exec->nodes.empty()) {
    Work w;
    w.desc = "empty graph launch";
    w.keep = exec;
    return submit(s, std::move(w));
  }
  for (const Work& node : exec->nodes) {
    Work w = node;
    w.keep = exec;  // a running launch holds its exec (and so its user objects)
    if (cudaError_t err = submit(s, std::move(w)); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t graph_get_nodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* num) {
  if (!num) return cudaErrorInvalidValue;
  std::lock_guard lock(state_mutex());
  auto it = graphs().graphs.find(g);
  if (it == graphs().graphs.end()) return cudaErrorInvalidValue;
  const Graph& src = *it->second;
  if (!nodes) {
    *num = src.nodes.size();
    return cudaSuccess;
  }
  for (size_t i = 0; i < *num; ++i)
    nodes[i] = i < src.nodes.size() ? reinterpret_cast<cudaGraphNode_t>(src.nodes[i].get())
                                     : nullptr;
  *num = std::min(*num, src.nodes.size());
  return cudaSuccess;
}

cudaError_t node_get_type(cudaGraphNode_t n, cudaGraphNodeType* type) {
  if (!type || !n) return cudaErrorInvalidValue;
  std::lock_guard lock(state_mutex());
  for (auto& [handle, g] : graphs().graphs)
    for (auto& node : g->nodes)
      if (reinterpret_cast<cudaGraphNode_t>(node.get()) == n) {
        *type = node->work.type;
        return cudaSuccess;
      }
  return cudaErrorInvalidValue;
}

cudaError_t user_object_create(cudaUserObject_t* out, void* ptr, cudaHostFn_t fn,
                               unsigned initial, unsigned flags) {
  if (!out || !fn || initial == 0 || flags != cudaUserObjectNoDestructorSync)
    return cudaErrorInvalidValue;
  auto* o = new UserObject{ptr, fn, initial};
  UserObjects& u = user_objects();
  std::lock_guard lk(u.m);
  u.live.insert(o);
  *out = reinterpret_cast<cudaUserObject_t>(o);
  return cudaSuccess;
}

cudaError_t user_object_retain(cudaUserObject_t handle, unsigned count) {
  auto* o = reinterpret_cast<UserObject*>(handle);
  UserObjects& u = user_objects();
  std::lock_guard lk(u.m);
  if (!u.live.count(o)) return cudaErrorInvalidResourceHandle;
  if (count == 0) return cudaErrorInvalidValue;
  o->refs += count;
  return cudaSuccess;
}

// Note [User object destructors]
// CUDA documents the destructor as run by a shared internal thread, but on a real GPU (H200,
// CUDA 13) the release that drops the last reference runs it on the calling thread before it
// returns. The stand-in does both: cudaUserObjectRelease (and cuUserObjectRelease) runs it
// there, outside every lock, while references that graphs and execs drop go through the
// internal thread, so that code must be ready for either.
cudaError_t user_object_release(cudaUserObject_t handle, unsigned count) {
  UserObjects& u = user_objects();
  UserObject* dead = nullptr;
  cudaError_t err;
  {
    std::lock_guard lk(u.m);
    err = release_locked(u, reinterpret_cast<UserObject*>(handle), count, &dead);
  }
  if (dead) {
    dead->fn(dead->ptr);
    delete dead;
  }
  return err;
}

cudaError_t graph_retain_user_object(cudaGraph_t g, cudaUserObject_t handle, unsigned count,
                                     unsigned flags) {
  if (count == 0 || (flags & ~unsigned{cudaGraphUserObjectMove})) return cudaErrorInvalidValue;
  auto* o = reinterpret_cast<UserObject*>(handle);
  std::lock_guard lock(state_mutex());
  auto it = graphs().graphs.find(g);
  if (it == graphs().graphs.end()) return cudaErrorInvalidValue;
  UserObjects& u = user_objects();
  std::lock_guard lk(u.m);
  if (!u.live.count(o)) return cudaErrorInvalidResourceHandle;
  if (!(flags & cudaGraphUserObjectMove)) o->refs += count;
  it->second->refs[o] += count;
  return cudaSuccess;
}

cudaError_t graph_release_user_object(cudaGraph_t g, cudaUserObject_t handle, unsigned count) {
  if (count == 0) return cudaErrorInvalidValue;
  auto* o = reinterpret_cast<UserObject*>(handle);
  std::lock_guard lock(state_mutex());
  auto it = graphs().graphs.find(g);
  if (it == graphs().graphs.end()) return cudaErrorInvalidValue;
  auto ref = it->second->refs.find(o);
  if (ref == it->second->refs.end() || ref->second < count) return cudaErrorInvalidValue;
  ref->second -= count;
  if (ref->second == 0) it->second->refs.erase(ref);
  UserObjects& u = user_objects();
  std::lock_guard lk(u.m);
  return release_locked(u, o, count);
}

}  // namespace poolcuda::sim
