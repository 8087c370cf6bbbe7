// What a capturing allocator needs from the driver: capture info in its three versions and
// both flavours, a stream's device, waiting for an event and querying a stream, copies and
// memsets on a stream (captured as nodes), graphs made and cloned through the driver, and user
// objects held by graphs with the destructor running once the last copy is gone. Each entry
// point's argument checks give CUDA's codes. Handles are shared with the runtime, so runtime
// calls check what the driver did.
#include <cstring>
#include <vector>

#include "driver_test.h"

using simtest::driver;
using simtest::eventually;
using simtest::stand_in;

namespace {

constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

CUstream as_cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }

// The symbol the resolver's pointer belongs to (the stand-in's own variants are named exactly).
std::string symbol_of(void* fn) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_sname == nullptr) return "";
  return info.dli_sname;
}

using InfoV1 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*);
using InfoV2 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                            const CUgraphNode**, size_t*);
using InfoV3 = decltype(&cuStreamGetCaptureInfo_v3);

struct Destroyed {
  std::atomic<int> count{0};
  static void CUDA_CB fn(void* self) { static_cast<Destroyed*>(self)->count.fetch_add(1); }
};

// Gives a pending destructor time to run, to prove it does not.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

bool bytes_equal(const void* device, size_t size, unsigned char byte) {
  std::vector<unsigned char> host(size);
  if (cudaMemcpy(host.data(), device, size, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (unsigned char b : host)
    if (b != byte) return false;
  return true;
}

}  // namespace

TEST_CASE("the resolver maps each capture-info version and flavour to its own variant") {
  CUDA_OK(cudaFree(nullptr));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  const struct {
    int version;
    cuuint64_t flags;
    const char* variant;
  } rows[] = {{10010, 0, "cuStreamGetCaptureInfo"},
              {10010, kPerThread, "cuStreamGetCaptureInfo_ptsz"},
              {11030, 0, "cuStreamGetCaptureInfo_v2"},
              {12000, kPerThread, "cuStreamGetCaptureInfo_v2_ptsz"},
              {12030, 0, "cuStreamGetCaptureInfo_v3"},
              {13000, kPerThread, "cuStreamGetCaptureInfo_v3_ptsz"}};
  for (const auto& row : rows) {
    CAPTURE(row.variant);
    REQUIRE_EQ(driver().get_proc("cuStreamGetCaptureInfo", &fn, row.version, row.flags, &status),
               CUDA_SUCCESS);
    if (stand_in()) CHECK_EQ(symbol_of(fn), row.variant);
  }
  CHECK_EQ(driver().get_proc("cuStreamGetDevice", &fn, 12070, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_EQ(fn, nullptr);
}

TEST_CASE("capture info through the driver, every version") {
  CUDA_OK(cudaFree(nullptr));
  auto v1 = driver().get<InfoV1>("cuStreamGetCaptureInfo", 10010);
  auto v2 = driver().get<InfoV2>("cuStreamGetCaptureInfo", 11030);
  auto v3 = driver().get<InfoV3>("cuStreamGetCaptureInfo", 12030);
  auto v3_ptsz = driver().get<InfoV3>("cuStreamGetCaptureInfo", 12030, kPerThread);
  auto begin = driver().get<decltype(&cuStreamBeginCapture_v2)>("cuStreamBeginCapture", 10010);
  auto end = driver().get<decltype(&cuStreamEndCapture)>("cuStreamEndCapture");
  auto memset_async = driver().get<decltype(&cuMemsetD8Async)>("cuMemsetD8Async", 3020);
  cudaStream_t rt_stream = nullptr;
  CUDA_OK(cudaStreamCreate(&rt_stream));  // blocking: the legacy stream depends on it
  CUstream stream = as_cu(rt_stream);
  void* buffer = nullptr;
  CUDA_OK(cudaMalloc(&buffer, 4096));

  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  CHECK_EQ(v3(stream, &status, nullptr, nullptr, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  CHECK_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK_EQ(v3(stream, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
           CUDA_ERROR_INVALID_VALUE);

  REQUIRE_EQ(begin(stream, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  REQUIRE_EQ(memset_async(reinterpret_cast<CUdeviceptr>(buffer), 7, 4096, stream), CUDA_SUCCESS);
  cudaStreamCaptureStatus rt_status;
  unsigned long long rt_id = 0;
  cudaGraph_t rt_graph = nullptr;
  CUDA_OK(cudaStreamGetCaptureInfo(rt_stream, &rt_status, &rt_id, &rt_graph));
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  const CUgraphEdgeData* edges = nullptr;
  size_t count = 0;
  CHECK_EQ(v1(stream, &status, &id), CUDA_SUCCESS);
  CHECK_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK_EQ(id, rt_id);
  id = 0;
  CHECK_EQ(v2(stream, &status, &id, &graph, &deps, &count), CUDA_SUCCESS);
  CHECK_EQ(id, rt_id);
  CHECK_EQ(graph, reinterpret_cast<CUgraph>(rt_graph));
  CHECK_EQ(count, 1u);  // the memset
  CHECK(deps != nullptr);
  count = 0;
  CHECK_EQ(v3(stream, &status, &id, &graph, &deps, &edges, &count), CUDA_SUCCESS);
  CHECK_EQ(count, 1u);
  // The legacy stream depends on the capturing blocking stream: CUDA refuses the question.
  CHECK_EQ(v3(nullptr, &status, nullptr, nullptr, nullptr, nullptr, nullptr),
           CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CUgraph ended = nullptr;
  REQUIRE_EQ(end(stream, &ended), CUDA_SUCCESS);
  CHECK_EQ(ended, graph);
  CUDA_OK(cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(ended)));

  // The per-thread flavour: handle 0 is this thread's per-thread stream.
  CUDA_OK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeGlobal));
  CHECK_EQ(v3_ptsz(nullptr, &status, &id, nullptr, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  CHECK_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cudaGraph_t empty = nullptr;
  CUDA_OK(cudaStreamEndCapture(cudaStreamPerThread, &empty));
  CUDA_OK(cudaGraphDestroy(empty));

  CUDA_OK(cudaStreamDestroy(rt_stream));
  if (stand_in())  // a destroyed handle is undefined behaviour on a real driver
    CHECK_EQ(v3(stream, &status, nullptr, nullptr, nullptr, nullptr, nullptr),
             CUDA_ERROR_INVALID_HANDLE);
  CUDA_OK(cudaFree(buffer));
}

TEST_CASE("a stream's device, queries and event waits through the driver") {
  CUDA_OK(cudaFree(nullptr));
  auto get_device = driver().get<decltype(&cuStreamGetDevice)>("cuStreamGetDevice", 12080);
  auto get_device_ptsz =
      driver().get<decltype(&cuStreamGetDevice)>("cuStreamGetDevice", 12080, kPerThread);
  auto query = driver().get<decltype(&cuStreamQuery)>("cuStreamQuery", 2000);
  auto wait = driver().get<decltype(&cuStreamWaitEvent)>("cuStreamWaitEvent", 3020);
  auto to_device = driver().get<decltype(&cuMemcpyHtoDAsync_v2)>("cuMemcpyHtoDAsync", 3020);
  auto to_host = driver().get<decltype(&cuMemcpyDtoHAsync_v2)>("cuMemcpyDtoHAsync", 3020);
  auto on_device = driver().get<decltype(&cuMemcpyDtoDAsync_v2)>("cuMemcpyDtoDAsync", 3020);
  auto sync = driver().get<decltype(&cuStreamSynchronize)>("cuStreamSynchronize");
  auto event_create = driver().get<decltype(&cuEventCreate)>("cuEventCreate");
  auto record = driver().get<decltype(&cuEventRecord)>("cuEventRecord");
  auto event_destroy = driver().get<decltype(&cuEventDestroy_v2)>("cuEventDestroy", 4000);

  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  CUdevice device = -1;
  CHECK_EQ(get_device(as_cu(first), &device), CUDA_SUCCESS);
  CHECK_EQ(device, 0);
  device = -1;
  CHECK_EQ(get_device_ptsz(nullptr, &device), CUDA_SUCCESS);
  CHECK_EQ(device, 0);
  CHECK_EQ(get_device(as_cu(first), nullptr), CUDA_ERROR_INVALID_VALUE);
  if (stand_in())  // an unknown handle is undefined behaviour on a real driver
    CHECK_EQ(get_device(reinterpret_cast<CUstream>(&device), &device), CUDA_ERROR_INVALID_HANDLE);

  // first: upload then copy along; second waits for first's event and downloads. A wait that
  // did not order them would be a race (and the data would be wrong).
  const size_t size = 1 << 16;
  void* a = nullptr;
  void* b = nullptr;
  CUDA_OK(cudaMalloc(&a, size));
  CUDA_OK(cudaMalloc(&b, size));
  std::vector<unsigned char> data(size), back(size, 0);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<unsigned char>(i * 13);
  const uint64_t races = simtest::counter("races");
  CUevent done = nullptr;
  REQUIRE_EQ(event_create(&done, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CHECK_EQ(to_device(reinterpret_cast<CUdeviceptr>(a), data.data(), size, as_cu(first)),
           CUDA_SUCCESS);
  CHECK_EQ(on_device(reinterpret_cast<CUdeviceptr>(b), reinterpret_cast<CUdeviceptr>(a), size,
                     as_cu(first)),
           CUDA_SUCCESS);
  CHECK_EQ(record(done, as_cu(first)), CUDA_SUCCESS);
  CHECK_EQ(wait(as_cu(second), done, 0), CUDA_SUCCESS);
  CHECK_EQ(to_host(back.data(), reinterpret_cast<CUdeviceptr>(b), size, as_cu(second)),
           CUDA_SUCCESS);
  CHECK_EQ(sync(as_cu(second)), CUDA_SUCCESS);
  CHECK(back == data);
  CHECK_EQ(query(as_cu(first)), CUDA_SUCCESS);  // second waited for everything first did
  CHECK_EQ(simtest::counter("races"), races);
  CHECK_EQ(wait(as_cu(second), done, 0x10), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(event_destroy(done), CUDA_SUCCESS);

  // Querying a capturing stream is illegal: the capture is invalidated.
  CUDA_OK(cudaStreamBeginCapture(first, cudaStreamCaptureModeRelaxed));
  CHECK_EQ(query(as_cu(first)), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  cudaGraph_t graph = nullptr;
  CHECK_EQ(cudaStreamEndCapture(first, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();

  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaStreamDestroy(first));
  CUDA_OK(cudaStreamDestroy(second));
}

TEST_CASE("a driver capture of copies and memsets replays them") {
  CUDA_OK(cudaFree(nullptr));
  auto begin = driver().get<decltype(&cuStreamBeginCapture_v2)>("cuStreamBeginCapture", 10010);
  auto end = driver().get<decltype(&cuStreamEndCapture)>("cuStreamEndCapture");
  auto set = driver().get<decltype(&cuMemsetD8Async)>("cuMemsetD8Async", 3020);
  auto on_device = driver().get<decltype(&cuMemcpyDtoDAsync_v2)>("cuMemcpyDtoDAsync", 3020);
  auto instantiate = driver().get<decltype(&cuGraphInstantiateWithFlags)>(
      "cuGraphInstantiateWithFlags", 11040);
  auto launch = driver().get<decltype(&cuGraphLaunch)>("cuGraphLaunch");
  auto clone = driver().get<decltype(&cuGraphClone)>("cuGraphClone", 10000);
  auto destroy = driver().get<decltype(&cuGraphDestroy)>("cuGraphDestroy");
  auto exec_destroy = driver().get<decltype(&cuGraphExecDestroy)>("cuGraphExecDestroy");
  cudaStream_t rt_stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&rt_stream, cudaStreamNonBlocking));
  CUstream stream = as_cu(rt_stream);
  const size_t size = 8192;
  void* a = nullptr;
  void* b = nullptr;
  CUDA_OK(cudaMalloc(&a, size));
  CUDA_OK(cudaMalloc(&b, size));
  const auto da = reinterpret_cast<CUdeviceptr>(a);
  const auto db = reinterpret_cast<CUdeviceptr>(b);
  REQUIRE_EQ(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CHECK_EQ(set(da, 0x5e, size, stream), CUDA_SUCCESS);
  CHECK_EQ(on_device(db, da, size, stream), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  REQUIRE_EQ(end(stream, &graph), CUDA_SUCCESS);
  CUDA_OK(cudaMemset(b, 0, size));  // nothing ran yet: the capture only recorded
  CHECK(bytes_equal(b, size, 0));
  CUgraph copy = nullptr;
  REQUIRE_EQ(clone(&copy, graph), CUDA_SUCCESS);
  CHECK_EQ(clone(nullptr, graph), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(destroy(graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE_EQ(instantiate(&exec, copy, 0), CUDA_SUCCESS);
  CHECK_EQ(launch(exec, stream), CUDA_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(rt_stream));
  CHECK(bytes_equal(b, size, 0x5e));
  CHECK_EQ(exec_destroy(exec), CUDA_SUCCESS);
  CHECK_EQ(destroy(copy), CUDA_SUCCESS);
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaStreamDestroy(rt_stream));
}

TEST_CASE("user objects through the driver: graphs and execs hold them") {
  CUDA_OK(cudaFree(nullptr));
  auto create = driver().get<decltype(&cuUserObjectCreate)>("cuUserObjectCreate", 11030);
  auto retain = driver().get<decltype(&cuUserObjectRetain)>("cuUserObjectRetain", 11030);
  auto release = driver().get<decltype(&cuUserObjectRelease)>("cuUserObjectRelease", 11030);
  auto graph_retain =
      driver().get<decltype(&cuGraphRetainUserObject)>("cuGraphRetainUserObject", 11030);
  auto graph_release =
      driver().get<decltype(&cuGraphReleaseUserObject)>("cuGraphReleaseUserObject", 11030);
  auto graph_create = driver().get<decltype(&cuGraphCreate)>("cuGraphCreate", 10000);
  auto instantiate = driver().get<decltype(&cuGraphInstantiateWithFlags)>(
      "cuGraphInstantiateWithFlags", 11040);
  auto destroy = driver().get<decltype(&cuGraphDestroy)>("cuGraphDestroy");
  auto exec_destroy = driver().get<decltype(&cuGraphExecDestroy)>("cuGraphExecDestroy");
  const unsigned kNoSync = CU_USER_OBJECT_NO_DESTRUCTOR_SYNC;

  Destroyed d;
  CUuserObject object = nullptr;
  CHECK_EQ(create(&object, &d, Destroyed::fn, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(create(&object, &d, nullptr, 1, kNoSync), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(create(&object, &d, Destroyed::fn, 0, kNoSync), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(create(nullptr, &d, Destroyed::fn, 1, kNoSync), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_EQ(create(&object, &d, Destroyed::fn, 1, kNoSync), CUDA_SUCCESS);
  CHECK_EQ(retain(object, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(retain(object, 2), CUDA_SUCCESS);
  CHECK_EQ(release(object, 2), CUDA_SUCCESS);

  CUgraph graph = nullptr;
  CHECK_EQ(graph_create(&graph, 1), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_EQ(graph_create(&graph, 0), CUDA_SUCCESS);
  CHECK_EQ(graph_retain(graph, object, 1, 0x2), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(graph_retain(graph, object, 0, CU_GRAPH_USER_OBJECT_MOVE), CUDA_ERROR_INVALID_VALUE);
  // The graph takes the program's reference (move) and one more of its own.
  REQUIRE_EQ(graph_retain(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
  REQUIRE_EQ(graph_retain(graph, object, 1, 0), CUDA_SUCCESS);
  CHECK_EQ(graph_release(graph, object, 1), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE_EQ(instantiate(&exec, graph, 0), CUDA_SUCCESS);
  CHECK_EQ(destroy(graph), CUDA_SUCCESS);
  settle();
  CHECK_EQ(d.count.load(), 0);  // the exec still holds it
  CHECK_EQ(exec_destroy(exec), CUDA_SUCCESS);
  CHECK(eventually([&] { return d.count.load() == 1; }));
  if (stand_in()) {  // a dead handle is undefined behaviour on a real driver
    CHECK_EQ(release(object, 1), CUDA_ERROR_INVALID_HANDLE);
  }
}

// The real driver's behaviour here is not documented: stand-in only.
TEST_CASE("cuStreamDestroy of a capturing stream ends the capture and drops its graph" *
          STAND_IN_ONLY) {
  CUDA_OK(cudaFree(nullptr));
  auto create = driver().get<decltype(&cuStreamCreate)>("cuStreamCreate");
  auto destroy = driver().get<decltype(&cuStreamDestroy_v2)>("cuStreamDestroy", 4000);
  auto begin = driver().get<decltype(&cuStreamBeginCapture_v2)>("cuStreamBeginCapture", 10010);
  auto info = driver().get<InfoV3>("cuStreamGetCaptureInfo", 12030);
  auto user_object = driver().get<decltype(&cuUserObjectCreate)>("cuUserObjectCreate", 11030);
  auto graph_retain =
      driver().get<decltype(&cuGraphRetainUserObject)>("cuGraphRetainUserObject", 11030);
  CUstream stream = nullptr;
  REQUIRE_EQ(create(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  REQUIRE_EQ(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureStatus status;
  CUgraph graph = nullptr;
  REQUIRE_EQ(info(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  // What a capturing allocator does: a user object on the graph being captured.
  Destroyed d;
  CUuserObject object = nullptr;
  REQUIRE_EQ(user_object(&object, &d, Destroyed::fn, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
             CUDA_SUCCESS);
  REQUIRE_EQ(graph_retain(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
  CHECK_EQ(destroy(stream), CUDA_SUCCESS);
  // The capture's graph went with the stream, and with it the last reference.
  CHECK(eventually([&] { return d.count.load() == 1; }));
}
