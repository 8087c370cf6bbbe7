// Graphs and user objects: instantiate (both entry points), launch replays the captured nodes
// in order on the stream (repeatably), clone and destroy independently, GetNodes' array
// semantics, memory nodes, and the user-object lifetime rule: graphs, clones and execs hold
// their own references, a running launch holds its exec's, and the destructor runs on another
// thread once the last reference goes (also when a capture is invalidated).
#include <cstring>

#include "sim_test.h"

using simtest::eventually;
using simtest::Gate;
using simtest::Recorder;
using simtest::stand_in;
using simtest::Tag;

namespace {

// Captures `body(stream)` on a fresh non-blocking stream and returns the graph.
template <class Body>
cudaGraph_t capture(cudaStream_t s, Body body) {
  REQUIRE_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  body(s);
  cudaGraph_t g = nullptr;
  REQUIRE_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  REQUIRE(g != nullptr);
  return g;
}

struct Destroyed {
  std::atomic<int> count{0};
  std::atomic<bool> on_other_thread{false};
  std::thread::id main = std::this_thread::get_id();
  static void CUDART_CB fn(void* self) {
    auto* d = static_cast<Destroyed*>(self);
    d->on_other_thread.store(std::this_thread::get_id() != d->main);
    d->count.fetch_add(1);
  }
};

// Gives a pending destructor time to run, to prove it does not.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

}  // namespace

TEST_CASE("launch replays the captured nodes in order, repeatably") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 1024;
  unsigned char* d = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), n));
  CUDA_OK(cudaMemset(d, 0, n));
  unsigned char* host = nullptr;  // pinned: graphs copy to page-locked memory
  CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host), n));
  std::memset(host, 0, n);
  Recorder rec;
  Tag first{&rec, 1}, second{&rec, 2};
  cudaGraph_t g = capture(s, [&](cudaStream_t cs) {
    CUDA_OK(cudaLaunchHostFunc(cs, Tag::fn, &first));
    CUDA_OK(cudaMemsetAsync(d, 0x11, n, cs));
    CUDA_OK(cudaMemcpyAsync(host, d, n, cudaMemcpyDeviceToHost, cs));
    CUDA_OK(cudaLaunchHostFunc(cs, Tag::fn, &second));
  });
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(rec.get().empty());
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(rec.get(), std::vector<int>{1, 2});
  CHECK_EQ(host[0], 0x11);
  CHECK_EQ(host[n - 1], 0x11);
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(rec.get(), (std::vector<int>{1, 2, 1, 2, 1, 2}));
  cudaGraphExec_t exec2 = nullptr;
  CUDA_OK(cudaGraphInstantiateWithFlags(&exec2, g, 0));
  CUDA_OK(cudaGraphDestroy(g));  // execs do not need their graph
  CUDA_OK(cudaGraphLaunch(exec2, cudaStreamPerThread));
  CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
  CHECK_EQ(rec.get().size(), 8u);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphExecDestroy(exec2));
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFreeHost(host));
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_CASE("clone, destroy, GetNodes array semantics, bad handles") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Recorder rec;
  Tag a{&rec, 1}, b{&rec, 2};
  cudaGraph_t g = capture(s, [&](cudaStream_t cs) {
    CUDA_OK(cudaLaunchHostFunc(cs, Tag::fn, &a));
    CUDA_OK(cudaLaunchHostFunc(cs, Tag::fn, &b));
  });
  cudaGraph_t clone = nullptr;
  CUDA_OK(cudaGraphClone(&clone, g));
  CUDA_OK(cudaGraphDestroy(g));
  size_t count = 0;
  CUDA_OK(cudaGraphGetNodes(clone, nullptr, &count));
  CHECK_EQ(count, 2u);
  cudaGraphNode_t nodes[4] = {};
  count = 1;  // asks for fewer than there are
  CUDA_OK(cudaGraphGetNodes(clone, nodes, &count));
  CHECK_EQ(count, 1u);
  CHECK(nodes[0] != nullptr);
  CHECK_EQ(nodes[1], nullptr);
  count = 4;  // asks for more: the rest are set to NULL, count is the real number
  CUDA_OK(cudaGraphGetNodes(clone, nodes, &count));
  CHECK_EQ(count, 2u);
  CHECK(nodes[1] != nullptr);
  CHECK_EQ(nodes[2], nullptr);
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, clone, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(rec.get(), (std::vector<int>{1, 2}));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(clone));
  CHECK(cudaGraphGetNodes(nullptr, nullptr, &count) != cudaSuccess);
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_CASE("memory nodes: graph allocations are usable at launch") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t live_before = simtest::counter("live_allocations");
  unsigned char* host = nullptr;
  CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host), 512));
  std::memset(host, 0, 512);
  void* tmp = nullptr;
  cudaGraph_t g = capture(s, [&](cudaStream_t cs) {
    CUDA_OK(cudaMallocAsync(&tmp, 512, cs));
    CUDA_OK(cudaMemsetAsync(tmp, 0x42, 512, cs));
    CUDA_OK(cudaMemcpyAsync(host, tmp, 512, cudaMemcpyDeviceToHost, cs));
    CUDA_OK(cudaFreeAsync(tmp, cs));
  });
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(host[0], 0x42);
  CHECK_EQ(host[511], 0x42);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(g));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFreeHost(host));
  if (stand_in()) CHECK_EQ(simtest::counter("live_allocations"), live_before);
}

TEST_CASE("user objects: references, destructor at the last release") {
  Destroyed d;
  cudaUserObject_t obj = nullptr;
  CUDA_OK(cudaUserObjectCreate(&obj, &d, Destroyed::fn, 1, cudaUserObjectNoDestructorSync));
  CUDA_OK(cudaUserObjectRetain(obj, 2));
  CUDA_OK(cudaUserObjectRelease(obj, 2));
  settle();
  CHECK_EQ(d.count.load(), 0);
  CUDA_OK(cudaUserObjectRelease(obj, 1));
  // CUDA documents an internal thread; a real GPU ran it on this one, inside the release.
  CHECK(eventually([&] { return d.count.load() == 1; }));
  if (stand_in()) CHECK_FALSE(d.on_other_thread.load());
  cudaUserObject_t bad = nullptr;
  CHECK_EQ(cudaUserObjectCreate(&bad, &d, Destroyed::fn, 1, 0), cudaErrorInvalidValue);
  CHECK_EQ(cudaUserObjectCreate(&bad, &d, Destroyed::fn, 0, cudaUserObjectNoDestructorSync),
           cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("graphs, clones and execs hold their own references") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Destroyed d;
  cudaUserObject_t obj = nullptr;
  CUDA_OK(cudaUserObjectCreate(&obj, &d, Destroyed::fn, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t g = capture(s, [&](cudaStream_t cs) {
    CUDA_OK(cudaLaunchHostFunc(cs, [](void*) {}, nullptr));
  });
  CUDA_OK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));  // takes our ref
  cudaGraph_t clone = nullptr;
  CUDA_OK(cudaGraphClone(&clone, g));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, clone, 0));
  CUDA_OK(cudaGraphDestroy(g));
  CUDA_OK(cudaGraphDestroy(clone));
  settle();
  CHECK_EQ(d.count.load(), 0);  // the exec still holds it

  // A running launch holds the exec: destroy the exec while its launch is parked.
  Gate gate;
  CUDA_OK(cudaLaunchHostFunc(s, Gate::wait_fn, &gate));
  CUDA_OK(cudaGraphLaunch(exec, s));
  gate.wait_entered();
  CUDA_OK(cudaGraphExecDestroy(exec));
  settle();
  CHECK_EQ(d.count.load(), 0);
  gate.open();
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK(eventually([&] { return d.count.load() == 1; }));
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_CASE("cudaGraphReleaseUserObject and bad counts") {
  Destroyed d;
  cudaUserObject_t obj = nullptr;
  CUDA_OK(cudaUserObjectCreate(&obj, &d, Destroyed::fn, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaGraphCreate(&g, 0));
  CUDA_OK(cudaGraphRetainUserObject(g, obj, 2, 0));  // the graph takes two new references
  CUDA_OK(cudaUserObjectRelease(obj, 1));            // ours goes
  if (stand_in()) {  // releasing more than the graph holds is undefined on the real runtime
    CHECK_EQ(cudaGraphReleaseUserObject(g, obj, 3), cudaErrorInvalidValue);
    cudaGetLastError();
  }
  CUDA_OK(cudaGraphReleaseUserObject(g, obj, 1));
  settle();
  CHECK_EQ(d.count.load(), 0);
  CUDA_OK(cudaGraphReleaseUserObject(g, obj, 1));
  CHECK(eventually([&] { return d.count.load() == 1; }));
  CUDA_OK(cudaGraphDestroy(g));
}

TEST_CASE("an invalidated capture releases the references of its graph") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Destroyed d;
  cudaUserObject_t obj = nullptr;
  CUDA_OK(cudaUserObjectCreate(&obj, &d, Destroyed::fn, 1, cudaUserObjectNoDestructorSync));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus st;
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamGetCaptureInfo(s, &st, nullptr, &g, nullptr, nullptr, nullptr));
  REQUIRE(g != nullptr);
  CUDA_OK(cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
  void* p = nullptr;
  CHECK_EQ(cudaMalloc(&p, 256), cudaErrorStreamCaptureUnsupported);  // invalidates
  cudaGraph_t out = nullptr;
  CHECK_EQ(cudaStreamEndCapture(s, &out), cudaErrorStreamCaptureInvalidated);
  CHECK_EQ(out, nullptr);
  cudaGetLastError();
  CHECK(eventually([&] { return d.count.load() == 1; }));
  CUDA_OK(cudaStreamDestroy(s));
}
