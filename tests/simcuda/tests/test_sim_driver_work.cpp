// Work through the driver API: streams, events, synchronous copies and memsets, pitched
// allocation, and stream capture in every variant and flavour (the first cuStreamBeginCapture
// without a mode, _v2, _ptsz, capture into a caller's graph), with the graphs launched through
// the driver. The handles are the runtime's: runtime calls accept them.
#include <cstring>
#include <vector>

#include "driver_test.h"

using simtest::driver;
using simtest::stand_in;

namespace {

constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

CUstream as_cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }

// Captures one memset on `work` (the runtime's name for `stream`) between `begin` and the
// matching end, launches the graph and checks what it wrote.
template <class Begin>
void capture_memset(CUstream stream, cudaStream_t work, Begin begin, cuuint64_t flavour) {
  auto end = driver().get<CUresult (*)(CUstream, CUgraph*)>("cuStreamEndCapture", 13000, flavour);
  auto is_capturing = driver().get<CUresult (*)(CUstream, CUstreamCaptureStatus*)>(
      "cuStreamIsCapturing", 13000, flavour);
  auto instantiate = driver().get<decltype(&cuGraphInstantiateWithFlags)>(
      "cuGraphInstantiateWithFlags", 11040);
  auto launch = driver().get<CUresult (*)(CUgraphExec, CUstream)>("cuGraphLaunch", 13000, flavour);
  auto sync = driver().get<CUresult (*)(CUstream)>("cuStreamSynchronize", 13000, flavour);
  void* buffer = nullptr;
  CUDA_OK(cudaMalloc(&buffer, 4096));
  REQUIRE_EQ(begin(), CUDA_SUCCESS);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK_EQ(is_capturing(stream, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUDA_OK(cudaMemsetAsync(buffer, 0x3c, 4096, work));
  CUgraph graph = nullptr;
  REQUIRE_EQ(end(stream, &graph), CUDA_SUCCESS);
  REQUIRE(graph != nullptr);
  CUgraphExec exec = nullptr;
  REQUIRE_EQ(instantiate(&exec, graph, 0), CUDA_SUCCESS);
  REQUIRE_EQ(launch(exec, stream), CUDA_SUCCESS);
  REQUIRE_EQ(sync(stream), CUDA_SUCCESS);
  std::vector<unsigned char> host(4096);
  CUDA_OK(cudaMemcpy(host.data(), buffer, host.size(), cudaMemcpyDeviceToHost));
  CHECK_EQ(host.front(), 0x3c);
  CHECK_EQ(host.back(), 0x3c);
  CHECK_EQ(driver().get<decltype(&cuGraphExecDestroy)>("cuGraphExecDestroy")(exec), CUDA_SUCCESS);
  CHECK_EQ(driver().get<decltype(&cuGraphDestroy)>("cuGraphDestroy")(graph), CUDA_SUCCESS);
  CUDA_OK(cudaFree(buffer));
}

}  // namespace

TEST_CASE("streams, events, copies and memsets through the driver") {
  CUDA_OK(cudaFree(nullptr));
  auto create = driver().get<decltype(&cuStreamCreate)>("cuStreamCreate");
  auto create_priority =
      driver().get<decltype(&cuStreamCreateWithPriority)>("cuStreamCreateWithPriority");
  auto destroy = driver().get<decltype(&cuStreamDestroy_v2)>("cuStreamDestroy", 4000);
  auto event_create = driver().get<decltype(&cuEventCreate)>("cuEventCreate");
  auto record = driver().get<decltype(&cuEventRecord)>("cuEventRecord");
  auto query = driver().get<decltype(&cuEventQuery)>("cuEventQuery");
  auto event_sync = driver().get<decltype(&cuEventSynchronize)>("cuEventSynchronize");
  auto event_destroy = driver().get<decltype(&cuEventDestroy_v2)>("cuEventDestroy", 4000);
  auto mem_alloc = driver().get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020);
  auto mem_free = driver().get<decltype(&cuMemFree_v2)>("cuMemFree", 3020);
  auto memset8 = driver().get<decltype(&cuMemsetD8_v2)>("cuMemsetD8", 3020);
  auto to_device = driver().get<decltype(&cuMemcpyHtoD_v2)>("cuMemcpyHtoD", 3020);
  auto to_host = driver().get<decltype(&cuMemcpyDtoH_v2)>("cuMemcpyDtoH", 3020);

  CUstream stream = nullptr;
  REQUIRE_EQ(create(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK_EQ(create(&stream, 0x80), CUDA_ERROR_INVALID_VALUE);
  unsigned flags = 0;
  CUDA_OK(cudaStreamGetFlags(reinterpret_cast<cudaStream_t>(stream), &flags));
  CHECK_EQ(flags, static_cast<unsigned>(cudaStreamNonBlocking));
  CUstream urgent = nullptr;
  REQUIRE_EQ(create_priority(&urgent, 0, -1), CUDA_SUCCESS);

  CUdeviceptr d = 0;
  REQUIRE_EQ(mem_alloc(&d, 1 << 16), CUDA_SUCCESS);
  std::vector<unsigned char> host(1 << 16, 0x11);
  CHECK_EQ(to_device(d, host.data(), host.size()), CUDA_SUCCESS);
  CHECK_EQ(memset8(d + 256, 0x22, 256), CUDA_SUCCESS);
  std::vector<unsigned char> back(host.size());
  CHECK_EQ(to_host(back.data(), d, back.size()), CUDA_SUCCESS);
  CHECK_EQ(back[255], 0x11);
  CHECK_EQ(back[256], 0x22);
  CHECK_EQ(back[511], 0x22);
  CHECK_EQ(back[512], 0x11);

  CUevent event = nullptr;
  REQUIRE_EQ(event_create(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUDA_OK(cudaMemsetAsync(reinterpret_cast<void*>(d), 0, 1 << 16,
                          reinterpret_cast<cudaStream_t>(stream)));
  CHECK_EQ(record(event, stream), CUDA_SUCCESS);
  CHECK_EQ(event_sync(event), CUDA_SUCCESS);
  CHECK_EQ(query(event), CUDA_SUCCESS);
  CHECK_EQ(event_destroy(event), CUDA_SUCCESS);
  CHECK_EQ(mem_free(d), CUDA_SUCCESS);
  CHECK_EQ(destroy(stream), CUDA_SUCCESS);
  CHECK_EQ(destroy(urgent), CUDA_SUCCESS);
}

TEST_CASE("cuMemAllocPitch pads each row") {
  CUDA_OK(cudaFree(nullptr));
  auto pitched = driver().get<decltype(&cuMemAllocPitch_v2)>("cuMemAllocPitch", 3020);
  CUdeviceptr d = 0;
  size_t pitch = 0;
  REQUIRE_EQ(pitched(&d, &pitch, 1000, 8, 4), CUDA_SUCCESS);
  CHECK(pitch >= 1000);
  CHECK_EQ(d % 256, 0u);
  if (stand_in()) CHECK_EQ(pitch, 1024u);
  CUDA_OK(cudaMemset(reinterpret_cast<void*>(d), 0, pitch * 8));
  CHECK_EQ(pitched(&d, &pitch, 1000, 8, 3), CUDA_ERROR_INVALID_VALUE);
  // A row too wide for any device: refused, the outputs left as they were.
  CUdeviceptr untouched = 0;
  CHECK_EQ(pitched(&untouched, &pitch, SIZE_MAX, 2, 16), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(untouched, 0u);
  CUDA_OK(cudaFree(reinterpret_cast<void*>(d)));
}

TEST_CASE("address ranges and IPC handles name the allocation around a pointer") {
  CUDA_OK(cudaFree(nullptr));
  auto range = driver().get<decltype(&cuMemGetAddressRange_v2)>("cuMemGetAddressRange", 3020);
  auto ipc = driver().get<decltype(&cuIpcGetMemHandle)>("cuIpcGetMemHandle", 4010);
  void* buffer = nullptr;
  CUDA_OK(cudaMalloc(&buffer, 5000));
  const auto base = reinterpret_cast<CUdeviceptr>(buffer);
  CUdeviceptr found = 0;
  size_t size = 0;
  REQUIRE_EQ(range(&found, &size, base + 4000), CUDA_SUCCESS);
  CHECK_EQ(found, base);
  CHECK(size >= 5000);
  CUipcMemHandle handle{};
  cudaIpcMemHandle_t runtime_handle{};
  REQUIRE_EQ(ipc(&handle, base + 100), CUDA_SUCCESS);
  CUDA_OK(cudaIpcGetMemHandle(&runtime_handle, buffer));
  if (stand_in()) {
    // The stand-in's handle: "simipc", then the allocation's base.
    CHECK_EQ(std::memcmp(handle.reserved, "simipc", 6), 0);
    CUdeviceptr named = 0;
    std::memcpy(&named, handle.reserved + 8, sizeof named);
    CHECK_EQ(named, base);
    CHECK_EQ(std::memcmp(handle.reserved, runtime_handle.reserved, 24), 0);
    void* managed = nullptr;
    CUDA_OK(cudaMallocManaged(&managed, 4096));
    CHECK_EQ(ipc(&handle, reinterpret_cast<CUdeviceptr>(managed)), CUDA_ERROR_INVALID_VALUE);
    CUDA_OK(cudaFree(managed));
  }
  CUDA_OK(cudaFree(buffer));
  CHECK_NE(range(&found, &size, base), CUDA_SUCCESS);
  CHECK_NE(ipc(&handle, base), CUDA_SUCCESS);
}

TEST_CASE("capture through the driver: every variant and flavour") {
  CUDA_OK(cudaFree(nullptr));
  cudaStream_t rt_stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&rt_stream, cudaStreamNonBlocking));
  CUstream stream = as_cu(rt_stream);

  auto v1 = driver().get<CUresult (*)(CUstream)>("cuStreamBeginCapture", 10000);
  capture_memset(stream, rt_stream, [&] { return v1(stream); }, 0);

  auto v2 = driver().get<decltype(&cuStreamBeginCapture_v2)>("cuStreamBeginCapture", 10010);
  capture_memset(stream, rt_stream, [&] { return v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED); }, 0);

  // The per-thread flavour: handle 0 is this thread's per-thread default stream.
  auto v2_ptsz =
      driver().get<decltype(&cuStreamBeginCapture_v2)>("cuStreamBeginCapture", 10010, kPerThread);
  capture_memset(nullptr, cudaStreamPerThread,
                 [&] { return v2_ptsz(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL); }, kPerThread);

  auto to_graph =
      driver().get<decltype(&cuStreamBeginCaptureToGraph)>("cuStreamBeginCaptureToGraph", 12030);
  cudaGraph_t into = nullptr;
  CUDA_OK(cudaGraphCreate(&into, 0));
  CUgraph mine = reinterpret_cast<CUgraph>(into);
  auto begin_into = [&] {
    return to_graph(stream, mine, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
  };
  REQUIRE_EQ(begin_into(), CUDA_SUCCESS);
  CUgraph ended = nullptr;
  CHECK_EQ(driver().get<decltype(&cuStreamEndCapture)>("cuStreamEndCapture")(stream, &ended),
           CUDA_SUCCESS);
  CHECK_EQ(ended, mine);  // the caller's graph, filled
  CUDA_OK(cudaGraphDestroy(into));

  auto exchange = driver().get<decltype(&cuThreadExchangeStreamCaptureMode)>(
      "cuThreadExchangeStreamCaptureMode", 10010);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK_EQ(exchange(&mode), CUDA_SUCCESS);
  CHECK_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  cudaStreamCaptureMode runtime_mode = cudaStreamCaptureModeGlobal;
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&runtime_mode));  // one per-thread mode for both
  CHECK_EQ(runtime_mode, cudaStreamCaptureModeRelaxed);
  CUDA_OK(cudaStreamDestroy(rt_stream));
}
