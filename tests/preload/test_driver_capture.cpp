// Preload test: stream capture through the driver API, in a program linked with -lcuda only (no
// CUDA runtime in the process, so the library's own calls go through the driver). A driver
// capture opens and closes a capture window exactly like a runtime one. One case per argument:
//   pins       a global-mode cuStreamBeginCapture_v2 window allocates temporaries with
//              cuMemAlloc_v2, writes them with captured memsets and copies and frees them in
//              the window; a second capture (cuStreamBeginCaptureToGraph into the program's
//              graph) runs while the first graph lives. Memory freed in a window never goes to
//              a later allocation while a graph or an exec can still replay it; 100 replays
//              leave new buffers intact and the output right; the report shows the memory
//              pinned until the graph and its exec are both destroyed, then released.
//   destroyed  cuStreamDestroy_v2 of a stream mid-capture ends the capture as failed: nothing
//              stays pinned or open, and the next capture works.
//   recapture  the same capture, launched, destroyed and captured again 10 times: from the
//              second on, no allocation in the window grows a pool (the library primed it
//              before the window opened), through the driver as through the runtime.
//   threads    two threads capture at once in thread-local mode, each on a blocking stream of
//              its own, while a third frees pooled memory the whole time (the device is fenced):
//              no capture is ever invalidated and every graph writes what it captured.
//   flavours   the first cuStreamBeginCapture (no mode: global) on a blocking stream while the
//              program frees memory from before the window in it (the device is fenced: another
//              stream exists), and a capture of the per-thread default stream through the _ptsz
//              begin and end: both end valid and pin like the others.
//   joined     a stream that joined a capture (waiting on an event recorded in it) is destroyed
//              before the capture ends: the capture is not over, the window stays open until
//              the stream that began it ends it, and the memory follows that end.
//   mixed      the program also loads the runtime (dlopen, as Python's ctypes does): a capture
//              begun with cudaStreamBeginCapture and ended with cuStreamEndCapture, and one
//              begun with cuStreamBeginCapture_v2 and ended with cudaStreamEndCapture, pin
//              their memory like any other.
//   invalidated a cuMemFreeAsync of memory from before the capture, on the capture's stream after
//              a call invalidated it: refused with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, as the
//              plain call is, and the memory stays the program's (no later allocation gets its
//              address, its bytes stay, and cuMemFree frees it). The library asks the driver:
//              this program has no runtime to ask (it once freed the memory).
//   free_async a relaxed capture's stream frees a buffer from before the capture with
//              cuMemFreeAsync: the library asks the driver whether the stream captures (asking
//              the runtime, which this program lacks, failed and said so on stderr).
// The children run with SIMCUDA_STRICT=1: a race the stand-in sees aborts them. Runs on a GPU
// too (nothing stand-in only).
#include <cuda.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capture_check.h"
#include "check.h"

// The variants cuda.h renames or declares only for per-thread default stream builds.
#undef cuStreamBeginCapture
extern "C" {
CUresult cuStreamBeginCapture(CUstream stream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph);
}

namespace {

#define CHECK_CU(expr)                                                              \
  do {                                                                              \
    const CUresult check_cu_ = (expr);                                              \
    CHECK_MSG(check_cu_ == CUDA_SUCCESS, #expr " returned " + std::to_string(check_cu_)); \
  } while (0)

using preload_test::graphs_released;
using preload_test::Held;
using preload_test::held_by_graphs;

constexpr std::size_t kSize = 256 << 10;

CUdeviceptr allocate(std::size_t size = kSize) {
  CUdeviceptr ptr = 0;
  CHECK_CU(cuMemAlloc_v2(&ptr, size));
  return ptr;
}

bool bytes_equal(CUdeviceptr ptr, unsigned char byte, std::size_t size = kSize) {
  std::vector<unsigned char> host(size);
  CHECK_CU(cuMemcpyDtoH_v2(host.data(), ptr, size));
  for (unsigned char value : host) {
    if (value != byte) return false;
  }
  return true;
}

bool one_of(CUdeviceptr ptr, const std::vector<CUdeviceptr>& set) {
  for (CUdeviceptr other : set) {
    if (other == ptr) return true;
  }
  return false;
}

// Gives a graph's destructor time to run, to prove it does not.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

// Captured between a begin and an end the caller makes: three temporaries allocated in the
// window, the first set to `value` and copied along into `out`, each freed in the window once
// the next holds the data. The temporaries' addresses go to `window`. A later allocation in the
// window never gets a temporary freed before it: that memory belongs to the capture.
void capture_temporaries(CUstream stream, CUdeviceptr out, unsigned char value,
                         std::vector<CUdeviceptr>* window) {
  const CUdeviceptr a = allocate();
  CHECK_CU(cuMemsetD8Async(a, value, kSize, stream));
  const CUdeviceptr b = allocate();
  CHECK_CU(cuMemcpyDtoDAsync_v2(b, a, kSize, stream));
  CHECK_CU(cuMemFree_v2(a));
  const CUdeviceptr c = allocate();
  CHECK_MSG(c != a, "memory freed in the window went to a new allocation in it");
  CHECK_CU(cuMemcpyDtoDAsync_v2(c, b, kSize, stream));
  CHECK_CU(cuMemFree_v2(b));
  CHECK_CU(cuMemcpyDtoDAsync_v2(out, c, kSize, stream));
  CHECK_CU(cuMemFree_v2(c));
  window->insert(window->end(), {a, b, c});
}

// Eight new buffers set to 0x5a; none may be memory a live graph writes.
std::vector<CUdeviceptr> fresh_buffers(const std::vector<CUdeviceptr>& pinned) {
  std::vector<CUdeviceptr> fresh;
  for (int i = 0; i < 8; ++i) {
    const CUdeviceptr ptr = allocate();
    CHECK_MSG(!one_of(ptr, pinned), "a graph's memory went to a new allocation");
    CHECK_CU(cuMemsetD8_v2(ptr, 0x5a, kSize));
    fresh.push_back(ptr);
  }
  return fresh;
}

void pins_case() {
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const CUdeviceptr out = allocate();
  const CUdeviceptr out_second = allocate();
  std::vector<CUdeviceptr> first_window;
  std::vector<CUdeviceptr> second_window;

  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  capture_temporaries(stream, out, 0x11, &first_window);
  CUgraph graph = nullptr;
  CHECK_CU(cuStreamEndCapture(stream, &graph));
  CHECK(graph != nullptr);
  Held held = held_by_graphs();
  CHECK(held.open_captures == 0 && held.graphs == 1 && held.pinned_bytes >= 3 * kSize);

  // A second capture while the first graph lives, into a graph of the program's.
  CUgraph mine = nullptr;
  CHECK_CU(cuGraphCreate(&mine, 0));
  CHECK_CU(cuStreamBeginCaptureToGraph(stream, mine, nullptr, nullptr, 0,
                                       CU_STREAM_CAPTURE_MODE_GLOBAL));
  capture_temporaries(stream, out_second, 0x33, &second_window);
  for (CUdeviceptr ptr : second_window) CHECK(!one_of(ptr, first_window));
  CUgraph ended = nullptr;
  CHECK_CU(cuStreamEndCapture(stream, &ended));
  CHECK(ended == mine);
  CHECK(held_by_graphs().graphs == 2);

  CUgraphExec exec = nullptr;
  CUgraphExec exec_second = nullptr;
  CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK_CU(cuGraphInstantiateWithFlags(&exec_second, mine, 0));
  std::vector<CUdeviceptr> pinned = first_window;
  pinned.insert(pinned.end(), second_window.begin(), second_window.end());
  const std::vector<CUdeviceptr> fresh = fresh_buffers(pinned);
  for (int i = 0; i < 100; ++i) {
    CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuGraphLaunch(exec_second, stream));
  }
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK(bytes_equal(out, 0x11));
  CHECK(bytes_equal(out_second, 0x33));
  for (CUdeviceptr ptr : fresh)
    CHECK_MSG(bytes_equal(ptr, 0x5a), "a replay overwrote a buffer allocated after the capture");
  for (CUdeviceptr ptr : fresh) CHECK_CU(cuMemFree_v2(ptr));

  // The graphs go first: their execs still replay the memory, which stays pinned.
  CHECK_CU(cuGraphDestroy(graph));
  CHECK_CU(cuGraphDestroy(mine));
  settle();
  held = held_by_graphs();
  CHECK_MSG(held.graphs == 2 && held.pinned_bytes >= 6 * kSize,
            "the memory was released while executable graphs still hold it");
  for (CUdeviceptr ptr : fresh_buffers(pinned)) CHECK_CU(cuMemFree_v2(ptr));
  // A launch in flight when its exec is destroyed still holds the memory until it is done.
  CHECK_CU(cuMemsetD8Async(out, 0, kSize, stream));
  CHECK_CU(cuGraphLaunch(exec, stream));
  CHECK_CU(cuGraphExecDestroy(exec));
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK(bytes_equal(out, 0x11));
  CHECK_CU(cuGraphExecDestroy(exec_second));
  CHECK_MSG(graphs_released(), "every copy of the graphs is gone but the memory stays pinned");
  CHECK(held_by_graphs().pinned_bytes == 0);
  CHECK_CU(cuMemFree_v2(out));
  CHECK_CU(cuMemFree_v2(out_second));
  CHECK_CU(cuStreamDestroy_v2(stream));
}

void invalidated_case() {
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const CUdeviceptr kept = allocate();
  CHECK_CU(cuMemsetD8_v2(kept, 0xab, kSize));
  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuStreamSynchronize(stream) != CUDA_SUCCESS);  // illegal in a capture: invalidates it
  CHECK(cuMemFreeAsync(kept, stream) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK_CU(cuStreamSynchronize(stream));
  std::vector<CUdeviceptr> later;
  for (int i = 0; i < 32; ++i) {
    later.push_back(allocate());
    CHECK_MSG(later.back() != kept, "a later allocation got the refused free's memory");
    CHECK_CU(cuMemsetD8_v2(later.back(), 0x5a, kSize));
  }
  CHECK(bytes_equal(kept, 0xab));
  for (CUdeviceptr ptr : later) CHECK_CU(cuMemFree_v2(ptr));
  CHECK_CU(cuMemFree_v2(kept));
  CHECK_CU(cuStreamDestroy_v2(stream));
}

void destroyed_case() {
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  const CUdeviceptr kept = allocate();  // allocated in the window, still the program's after it
  const CUdeviceptr dropped = allocate();
  CHECK_CU(cuMemsetD8Async(kept, 0x21, kSize, stream));
  CHECK_CU(cuMemsetD8Async(dropped, 0x21, kSize, stream));
  CHECK_CU(cuMemFree_v2(dropped));
  Held held = held_by_graphs();
  CHECK(held.open_captures == 1);
  CHECK_CU(cuStreamDestroy_v2(stream));
  held = held_by_graphs();
  CHECK_MSG(held.open_captures == 0, "the destroyed stream's capture is still open");
  CHECK(held.failed_captures == 1);
  CHECK_MSG(held.graphs == 0 && held.pinned_bytes == 0, "a failed capture pinned memory");
  // The memory allocated in the window is the program's, as after any failed capture.
  CHECK_CU(cuMemsetD8_v2(kept, 0x44, kSize));
  CHECK(bytes_equal(kept, 0x44));
  CHECK_CU(cuMemFree_v2(kept));

  // The device's capture state is clean: the next capture pins and releases as usual.
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const CUdeviceptr out = allocate();
  std::vector<CUdeviceptr> window;
  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  capture_temporaries(stream, out, 0x55, &window);
  CUgraph graph = nullptr;
  CHECK_CU(cuStreamEndCapture(stream, &graph));
  held = held_by_graphs();
  CHECK(held.graphs == 1 && held.captures == 1 && held.failed_captures == 1);
  CUgraphExec exec = nullptr;
  CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK_CU(cuGraphLaunch(exec, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK(bytes_equal(out, 0x55));
  CHECK_CU(cuGraphExecDestroy(exec));
  CHECK_CU(cuGraphDestroy(graph));
  CHECK(graphs_released());
  CHECK_CU(cuMemFree_v2(out));
  CHECK_CU(cuStreamDestroy_v2(stream));
}

// Instantiates `graph`, launches it once on `stream`, waits and destroys both.
void launch_once(CUgraph graph, CUstream stream) {
  CUgraphExec exec = nullptr;
  CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK_CU(cuGraphLaunch(exec, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK_CU(cuGraphExecDestroy(exec));
  CHECK_CU(cuGraphDestroy(graph));
}

void recapture_case() {
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const CUdeviceptr out = allocate();
  std::uint64_t grown_after_first = 0;
  for (int round = 0; round < 10; ++round) {
    std::vector<CUdeviceptr> window;
    CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    capture_temporaries(stream, out, static_cast<unsigned char>(round + 1), &window);
    CUgraph graph = nullptr;
    CHECK_CU(cuStreamEndCapture(stream, &graph));
    launch_once(graph, stream);
    CHECK(bytes_equal(out, static_cast<unsigned char>(round + 1)));
    CHECK(graphs_released());
    const Held held = held_by_graphs();
    CHECK(held.window_allocations == 3u * (round + 1));
    if (round == 0) grown_after_first = held.from_driver;
    CHECK_MSG(held.from_driver == grown_after_first,
              "round " + std::to_string(round) + ": a pool grew inside the window");
  }
  CHECK(grown_after_first > 0);
  CHECK_CU(cuMemFree_v2(out));
  CHECK_CU(cuStreamDestroy_v2(stream));
}

void threads_case(CUcontext primary) {
  std::atomic<int> invalidated{0};
  // A non-blocking stream makes the device fenced: the churn's frees record fences.
  CUstream fenced = nullptr;
  CHECK_CU(cuStreamCreate(&fenced, CU_STREAM_NON_BLOCKING));
  auto churn = [primary] {
    CHECK_CU(cuCtxSetCurrent(primary));
    CUdeviceptr ptr = 0;
    if (cuMemAlloc_v2(&ptr, 64 << 10) == CUDA_SUCCESS) CHECK_CU(cuMemFree_v2(ptr));
  };
  auto capturer = [&](unsigned char value) {
    CHECK_CU(cuCtxSetCurrent(primary));
    CUstream stream = nullptr;
    CHECK_CU(cuStreamCreate(&stream, 0));  // blocking: a fence on the legacy stream would end it
    const CUdeviceptr out = allocate();
    std::vector<unsigned char> host(kSize);
    for (int round = 0; round < 40; ++round) {
      std::vector<CUdeviceptr> window;
      CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
      capture_temporaries(stream, out, value, &window);
      CUgraph graph = nullptr;
      const CUresult ended = cuStreamEndCapture(stream, &graph);
      if (ended == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
        ++invalidated;
        continue;
      }
      CHECK_CU(ended);
      CHECK_CU(cuMemsetD8Async(out, 0, kSize, stream));
      launch_once(graph, stream);
      CHECK_CU(cuMemcpyDtoHAsync_v2(host.data(), out, kSize, stream));
      CHECK_CU(cuStreamSynchronize(stream));
      for (unsigned char byte : host) CHECK(byte == value);
    }
    CHECK_CU(cuMemFree_v2(out));
    CHECK_CU(cuStreamDestroy_v2(stream));
  };
  preload_test::capture_on_two_threads(churn, capturer);
  CHECK_CU(cuStreamDestroy_v2(fenced));
  CHECK_MSG(invalidated.load() == 0,
            std::to_string(invalidated.load()) + " captures invalidated by the library");
  CHECK(held_by_graphs().captures == 80);
}

void flavours_case() {
  CUstream blocking = nullptr;
  CUstream other = nullptr;
  CHECK_CU(cuStreamCreate(&blocking, 0));
  CHECK_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  const CUdeviceptr out = allocate();
  std::vector<CUdeviceptr> before(64);
  for (CUdeviceptr& ptr : before) {
    ptr = allocate(4096);
    CHECK_CU(cuMemsetD8Async(ptr, 1, 4096, other));
  }
  CHECK_CU(cuStreamSynchronize(other));
  std::vector<CUdeviceptr> window;
  CHECK_CU(cuStreamBeginCapture(blocking));
  capture_temporaries(blocking, out, 0x61, &window);
  for (CUdeviceptr ptr : before) CHECK_CU(cuMemFree_v2(ptr));  // no fence may touch the capture
  CUgraph graph = nullptr;
  CHECK_CU(cuStreamEndCapture(blocking, &graph));
  CHECK(held_by_graphs().graphs == 1);
  launch_once(graph, blocking);
  CHECK(bytes_equal(out, 0x61));
  CHECK(graphs_released());

  // The per-thread default stream: handle 0 in the _ptsz flavour.
  CHECK_CU(cuStreamBeginCapture_v2_ptsz(nullptr, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  capture_temporaries(CU_STREAM_PER_THREAD, out, 0x62, &window);
  CHECK_CU(cuStreamEndCapture_ptsz(nullptr, &graph));
  const Held held = held_by_graphs();
  CHECK(held.graphs == 1 && held.pinned_bytes >= 3 * kSize && held.failed_captures == 0);
  launch_once(graph, CU_STREAM_PER_THREAD);
  CHECK(bytes_equal(out, 0x62));
  CHECK(graphs_released());
  CHECK_CU(cuMemFree_v2(out));
  CHECK_CU(cuStreamDestroy_v2(blocking));
  CHECK_CU(cuStreamDestroy_v2(other));
}

void joined_case() {
  CUstream origin = nullptr;
  CUstream side = nullptr;
  CHECK_CU(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
  CHECK_CU(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  CUevent fork = nullptr;
  CUevent join = nullptr;
  CHECK_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CHECK_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  const CUdeviceptr out = allocate();
  CHECK_CU(cuStreamBeginCapture_v2(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(cuEventRecord(fork, origin));
  CHECK_CU(cuStreamWaitEvent(side, fork, 0));  // side joins the capture
  std::vector<CUdeviceptr> window;
  capture_temporaries(side, out, 0x71, &window);
  CHECK_CU(cuEventRecord(join, side));
  CHECK_CU(cuStreamWaitEvent(origin, join, 0));
  CHECK_CU(cuStreamDestroy_v2(side));
  Held held = held_by_graphs();
  CHECK_MSG(held.open_captures == 1 && held.failed_captures == 0,
            "a stream that joined the capture ended it by leaving");
  CUgraph graph = nullptr;
  const CUresult ended = cuStreamEndCapture(origin, &graph);
  held = held_by_graphs();
  CHECK(held.open_captures == 0);
  if (ended == CUDA_SUCCESS) {  // CUDA kept the capture: its memory is the graph's
    CHECK(held.graphs == 1 && held.pinned_bytes >= 3 * kSize);
    launch_once(graph, origin);
    CHECK(bytes_equal(out, 0x71));
    CHECK(graphs_released());
  } else {  // the stand-in's answer: the capture failed, and nothing stays pinned
    CHECK(ended == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(held.failed_captures == 1 && held.graphs == 0 && held.pinned_bytes == 0);
  }
  CHECK_CU(cuEventDestroy_v2(fork));
  CHECK_CU(cuEventDestroy_v2(join));
  CHECK_CU(cuMemFree_v2(out));
  CHECK_CU(cuStreamDestroy_v2(origin));
}

void mixed_case() {
  void* runtime = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(runtime != nullptr, "no CUDA runtime to load");
  using Begin = cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode);
  using End = cudaError_t (*)(cudaStream_t, cudaGraph_t*);
  auto begin_runtime = reinterpret_cast<Begin>(::dlsym(runtime, "cudaStreamBeginCapture"));
  auto end_runtime = reinterpret_cast<End>(::dlsym(runtime, "cudaStreamEndCapture"));
  CHECK(begin_runtime != nullptr && end_runtime != nullptr);

  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const auto rt_stream = reinterpret_cast<cudaStream_t>(stream);
  const CUdeviceptr out = allocate();
  const CUdeviceptr out_second = allocate();
  std::vector<CUdeviceptr> windows;

  CHECK(begin_runtime(rt_stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  capture_temporaries(stream, out, 0x17, &windows);
  CUgraph graph = nullptr;
  CHECK_CU(cuStreamEndCapture(stream, &graph));
  Held held = held_by_graphs();
  CHECK_MSG(held.graphs == 1 && held.pinned_bytes >= 3 * kSize,
            "a runtime capture ended by the driver pinned nothing");

  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  capture_temporaries(stream, out_second, 0x27, &windows);
  cudaGraph_t second = nullptr;
  CHECK(end_runtime(rt_stream, &second) == cudaSuccess);
  held = held_by_graphs();
  CHECK_MSG(held.graphs == 2 && held.pinned_bytes >= 6 * kSize,
            "a driver capture ended by the runtime pinned nothing");
  CHECK(held.open_captures == 0 && held.failed_captures == 0);

  const std::vector<CUdeviceptr> fresh = fresh_buffers(windows);
  CUgraphExec exec = nullptr;
  CUgraphExec exec_second = nullptr;
  CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK_CU(cuGraphInstantiateWithFlags(&exec_second, reinterpret_cast<CUgraph>(second), 0));
  for (int i = 0; i < 20; ++i) {
    CHECK_CU(cuGraphLaunch(exec, stream));
    CHECK_CU(cuGraphLaunch(exec_second, stream));
  }
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK(bytes_equal(out, 0x17));
  CHECK(bytes_equal(out_second, 0x27));
  for (CUdeviceptr ptr : fresh) CHECK(bytes_equal(ptr, 0x5a));
  for (CUdeviceptr ptr : fresh) CHECK_CU(cuMemFree_v2(ptr));
  CHECK_CU(cuGraphExecDestroy(exec));
  CHECK_CU(cuGraphExecDestroy(exec_second));
  CHECK_CU(cuGraphDestroy(graph));
  CHECK_CU(cuGraphDestroy(reinterpret_cast<CUgraph>(second)));
  CHECK(graphs_released());
  CHECK_CU(cuMemFree_v2(out));
  CHECK_CU(cuMemFree_v2(out_second));
  CHECK_CU(cuStreamDestroy_v2(stream));
}

}  // namespace

void free_async_case() {
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const CUdeviceptr buffer = allocate();
  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(cuMemsetD8Async(buffer, 0x33, kSize, stream));
  CHECK_CU(cuMemFreeAsync(buffer, stream));
  CUgraph graph = nullptr;
  CHECK_CU(cuStreamEndCapture(stream, &graph));
  CHECK_CU(cuGraphDestroy(graph));
  CHECK_CU(cuStreamDestroy_v2(stream));
}

int main(int argc, char** argv) {
  CHECK(argc == 2);
  std::string which = argv[1];
  if (which == "free_async") {
    const preload_test::ChildResult child =
        preload_test::run_self("child:free_async", {"SIMCUDA_STRICT=1"});
    std::printf("%s", child.output.c_str());
    CHECK_MSG(child.status == 0, "the child failed");
    CHECK_MSG(child.output.find("not in the CUDA runtime") == std::string::npos,
              "the library asked a runtime the program does not have");
    return 0;
  }
  if (which.rfind("child:", 0) != 0) {
    Dl_info info{};
    void* hook = ::dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2");
    CHECK_MSG(hook != nullptr && ::dladdr(hook, &info) != 0 &&
                  std::strstr(info.dli_fname, "poolcuda") != nullptr,
              "cuStreamBeginCapture_v2 does not come from libpoolcuda.so; set LD_PRELOAD");
    return preload_test::run_capture_child(which, {"SIMCUDA_STRICT=1"});
  }
  which = which.substr(6);
  CHECK_CU(cuInit(0));
  CUcontext primary = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&primary, 0));
  CHECK_CU(cuCtxSetCurrent(primary));
  if (which == "pins") pins_case();
  else if (which == "destroyed") destroyed_case();
  else if (which == "invalidated") invalidated_case();
  else if (which == "recapture") recapture_case();
  else if (which == "threads") threads_case(primary);
  else if (which == "flavours") flavours_case();
  else if (which == "joined") joined_case();
  else if (which == "mixed") mixed_case();
  else if (which == "free_async") free_async_case();
  else preload_test::fail(__FILE__, __LINE__, "unknown case " + which);
  std::printf("%s: ok\n", which.c_str());
  return 0;
}
