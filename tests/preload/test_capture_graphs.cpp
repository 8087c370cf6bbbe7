// Preload test: stream capture under the library (Note [Capture windows] in
// capture/capture_policy.cpp). One program, one case per argument:
//   replay       a global-mode capture allocates temporaries, writes them with captured memsets
//                and copies and frees them inside the window; new buffers allocated afterwards
//                survive 100 replays, the graph's output is right, and no race is seen
//   lifetime     the memory comes back only once the graph, a clone and two executable graphs
//                are all destroyed
//   invalidated  a capture invalidated on purpose pins nothing and its stream works afterwards;
//                a stream destroyed mid-capture ends its capture, pins nothing and leaves no
//                error behind (the library asks nothing of the dead handle)
//   recapture    the same capture, destroyed and captured again 30 times: from the second on,
//                no cudaMalloc reaches the driver inside the window and the device memory held
//                stays flat (one working set more at most, where the wait for the last graph's
//                fence ran out before a capture)
//   batches      30 captures of decreasing sizes, all graphs alive, each replayed and checked:
//                device memory within 1.25x the sum of their working sets (with
//                capture_share:on, within 1.25x the largest)
//   threads      two threads capture at once in thread-local mode; a third frees pooled memory
//                (recording free fences) the whole time, and no capture is ever invalidated
//   to_graph     cudaStreamBeginCaptureToGraph into a graph the program created
//   destroyed    a relaxed-mode capture allocates a workspace of 40% of the device's free
//                memory; right after its graph is destroyed and the workspace freed, an
//                allocation of 70% succeeds, as plainly, although CUDA tells the library that
//                the graph is gone only later, on a thread of its own (five rounds); and
//                cudaMemGetInfo counts it free as soon as that news came; so is a page a small
//                buffer freed during a capture kept
//   managed_freed  managed memory freed inside a capture: the free succeeds and its bytes
//                never serve a new allocation while the graph may still write them
// Sizes are fractions of small fixed amounts, so the same program runs on a GPU; the driver
// counters (the stand-in's) are checked only on the stand-in. What graphs still hold is read
// from the library's own report (its capture section): the program runs itself as a child
// with reports in JSON into a folder of its own, and raises the report signal.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "capture_check.h"
#include "check.h"

namespace {

constexpr std::size_t kKiB = 1024;

using preload_test::graphs_released;
using preload_test::Held;
using preload_test::held_by_graphs;

std::uint64_t stand_in(const char* name) {
  return preload_test::on_stand_in() ? preload_test::counter(name) : 0;
}

// Captures on `stream`: three temporaries, the first set to `value`, copied along into `out`,
// all freed in the window; a buffer `also` from before the capture, when given, is set to
// `value` and freed in the window too. Returns the graph.
// `window_mallocs`, when given, receives the cudaMalloc calls that reached the stand-in inside
// the window (after the begin returned, before the end).
cudaGraph_t capture_temporaries(cudaStream_t stream, void* out, std::size_t size,
                                unsigned char value = 0x11, void* also = nullptr,
                                std::uint64_t* window_mallocs = nullptr) {
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const std::uint64_t mallocs = stand_in("cudaMalloc");
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  CHECK_CUDA(cudaMalloc(&a, size));
  CHECK_CUDA(cudaMalloc(&b, size));
  CHECK_CUDA(cudaMemsetAsync(a, value, size, stream));
  if (also != nullptr) {
    CHECK_CUDA(cudaMemsetAsync(also, value, size, stream));
    CHECK_CUDA(cudaFree(also));
  }
  CHECK_CUDA(cudaMemcpyAsync(b, a, size, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaMalloc(&c, size));
  CHECK_CUDA(cudaMemcpyAsync(c, b, size, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaMemcpyAsync(out, c, size, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaFree(c));
  if (window_mallocs != nullptr) *window_mallocs = stand_in("cudaMalloc") - mallocs;
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK(graph != nullptr);
  return graph;
}

void replay_case() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t races = stand_in("races");
  const std::size_t size = 256 * kKiB;
  void* out = nullptr;
  void* out_second = nullptr;
  void* before = nullptr;  // a buffer from before the capture, used and freed in it
  CHECK_CUDA(cudaMalloc(&out, size));
  CHECK_CUDA(cudaMalloc(&out_second, size));
  CHECK_CUDA(cudaMalloc(&before, size));
  cudaGraph_t graph = capture_temporaries(stream, out, size, 0x11, before);
  // A second capture while the first graph lives: its temporaries are memory of their own.
  cudaGraph_t second = capture_temporaries(stream, out_second, size, 0x33);
  cudaGraphExec_t exec = nullptr;
  cudaGraphExec_t exec_second = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphInstantiate(&exec_second, second, 0));
  // New buffers after the captures, of the freed buffer's size: none may be memory either
  // graph writes.
  std::vector<void*> fresh;
  for (int i = 0; i < 8; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, size));
    CHECK_CUDA(cudaMemset(ptr, 0x5a, size));
    fresh.push_back(ptr);
  }
  for (int i = 0; i < 100; ++i) {
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaGraphLaunch(exec_second, stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(preload_test::device_bytes_equal(out, size, 0x11));
  CHECK(preload_test::device_bytes_equal(out_second, size, 0x33));
  for (void* ptr : fresh) CHECK_MSG(preload_test::device_bytes_equal(ptr, size, 0x5a),
                                    "a replay overwrote a buffer allocated after the capture");
  if (preload_test::on_stand_in()) CHECK(stand_in("races") == races);
  for (void* ptr : fresh) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphExecDestroy(exec_second));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaGraphDestroy(second));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(out_second));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void lifetime_case() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t size = 4 << 20;
  void* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, size));
  cudaGraph_t graph = capture_temporaries(stream, out, size);
  cudaGraph_t clone = nullptr;
  CHECK_CUDA(cudaGraphClone(&clone, graph));
  cudaGraphExec_t exec_a = nullptr;
  cudaGraphExec_t exec_b = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec_a, graph, 0));
  CHECK_CUDA(cudaGraphInstantiate(&exec_b, clone, 0));
  auto pinned = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a destructor could run now
    const Held held = held_by_graphs();
    return held.graphs == 1 && held.pinned_bytes >= 3 * size;
  };
  CHECK(pinned());
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK(pinned());
  CHECK_CUDA(cudaGraphDestroy(clone));
  CHECK(pinned());
  CHECK_CUDA(cudaGraphLaunch(exec_a, stream));
  CHECK_CUDA(cudaGraphExecDestroy(exec_a));
  CHECK(pinned());
  CHECK_CUDA(cudaGraphLaunch(exec_b, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(preload_test::device_bytes_equal(out, size, 0x11));
  CHECK_CUDA(cudaGraphExecDestroy(exec_b));
  CHECK_MSG(graphs_released(), "the last copy is gone but the memory stays pinned");
  CHECK(held_by_graphs().pinned_bytes == 0);
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void invalidated_case() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t size = 4 << 20;
  void* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, size));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  void* temp = nullptr;
  CHECK_CUDA(cudaMalloc(&temp, size));
  CHECK_CUDA(cudaMemsetAsync(temp, 1, size, stream));
  // Synchronizing a capturing stream is illegal: the capture is invalidated.
  CHECK_RESULT(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  CHECK_CUDA(cudaFree(temp));
  cudaGraph_t graph = nullptr;
  CHECK_RESULT(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  cudaGetLastError();
  const Held held = held_by_graphs();
  CHECK(held.failed_captures == 1);
  CHECK_MSG(held.graphs == 0 && held.pinned_bytes == 0, "an invalidated capture pinned memory");
  // The stream works afterwards.
  CHECK_CUDA(cudaMemsetAsync(out, 0x33, size, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(preload_test::device_bytes_equal(out, size, 0x33));

  // Destroyed mid-capture: the destroy succeeds and the last-error slot stays clean.
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemsetAsync(out, 2, size, stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  const Held after = held_by_graphs();
  CHECK(after.open_captures == 0);
  CHECK(after.failed_captures == 2);
  CHECK(after.graphs == 0 && after.pinned_bytes == 0);
  CHECK_CUDA(cudaFree(out));
}

void recapture_case() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t size = 1 << 20;
  void* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, size));
  std::uint64_t held_after_second = 0;
  for (int round = 0; round < 30; ++round) {
    std::uint64_t in_window = 0;
    cudaGraph_t graph = capture_temporaries(stream, out, size, 0x11, nullptr, &in_window);
    if (round > 0 && preload_test::on_stand_in())
      CHECK_MSG(in_window == 0, "round " + std::to_string(round) + ": " +
                                    std::to_string(in_window) + " cudaMalloc in the window");
    preload_test::launch_once(graph, stream);
    CHECK(preload_test::device_bytes_equal(out, size, 0x11));
    CHECK(graphs_released());
    if (round == 1) held_after_second = stand_in("live_bytes");
    if (round > 1 && preload_test::on_stand_in()) {
      // Before a capture the library waits a bounded time for the fence of the slices the last
      // graph gave back (Note [Priming]). Where the stand-in's stream thread does not pass it in
      // time (a starved CPU), those slices are primed once more: held memory may then grow, by
      // one working set in all, never more.
      const std::uint64_t held = stand_in("live_bytes");
      CHECK_MSG(held >= held_after_second && held <= held_after_second + 3 * size,
                "round " + std::to_string(round) + ": device memory held went from " +
                    std::to_string(held_after_second) + " to " + std::to_string(held) + " B");
    }
  }
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void batches_case(bool share) {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t held_before = stand_in("live_bytes");
  struct Captured {
    cudaGraphExec_t exec;
    void* out;
    std::size_t size;
  };
  std::vector<Captured> graphs;
  std::uint64_t sum = 0;
  std::uint64_t largest = 0;
  for (int batch = 30; batch > 0; --batch) {
    const std::size_t size = static_cast<std::size_t>(batch) * 64 * kKiB;
    void* out = nullptr;
    CHECK_CUDA(cudaMalloc(&out, size));
    cudaGraph_t graph = capture_temporaries(stream, out, size);
    cudaGraphExec_t exec = nullptr;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
    graphs.push_back({exec, out, size});
    sum += 3 * size;  // the three temporaries
    largest = std::max<std::uint64_t>(largest, 3 * size);
  }
  for (const Captured& g : graphs) {
    CHECK_CUDA(cudaMemset(g.out, 0, g.size));
    CHECK_CUDA(cudaGraphLaunch(g.exec, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK(preload_test::device_bytes_equal(g.out, g.size, 0x11));
  }
  if (preload_test::on_stand_in()) {
    std::uint64_t outputs = 0;
    for (const Captured& g : graphs) outputs += g.size;
    const std::uint64_t held = stand_in("live_bytes") - held_before - outputs;
    const std::uint64_t bound = (share ? largest : sum) * 5 / 4 + (8u << 20);
    std::printf("batches: %llu B held for %llu B of working sets (largest %llu)\n",
                static_cast<unsigned long long>(held), static_cast<unsigned long long>(sum),
                static_cast<unsigned long long>(largest));
    CHECK_MSG(held <= bound, "held " + std::to_string(held) + " B, bound " +
                                 std::to_string(bound) + " B");
  }
  for (const Captured& g : graphs) {
    CHECK_CUDA(cudaGraphExecDestroy(g.exec));
    CHECK_CUDA(cudaFree(g.out));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void threads_case() {
  std::atomic<int> invalidated{0};
  // Pooled frees on a fenced device (a non-blocking stream exists): fences are recorded on the
  // legacy stream the whole time.
  cudaStream_t fenced = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&fenced, cudaStreamNonBlocking));
  auto churn = [] {
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, 64 * kKiB) == cudaSuccess) cudaFree(ptr);
  };
  // Each capturer works on its own stream only: any legacy-stream work of the program (a
  // cudaMemset, a cudaMemcpy) would invalidate the other's capture, with or without the library.
  auto capturer = [&](unsigned char value) {
    cudaStream_t stream = nullptr;
    CHECK_CUDA(cudaStreamCreate(&stream));  // blocking: a legacy record would invalidate it
    const std::size_t size = 128 * kKiB;
    void* out = nullptr;
    CHECK_CUDA(cudaMalloc(&out, size));
    for (int round = 0; round < 40; ++round) {
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      void* temp = nullptr;
      CHECK_CUDA(cudaMalloc(&temp, size));
      CHECK_CUDA(cudaMemsetAsync(temp, value, size, stream));
      CHECK_CUDA(cudaMemcpyAsync(out, temp, size, cudaMemcpyDeviceToDevice, stream));
      CHECK_CUDA(cudaFree(temp));
      cudaGraph_t graph = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
      if (ended == cudaErrorStreamCaptureInvalidated) {
        ++invalidated;
        cudaGetLastError();
        continue;
      }
      CHECK_RESULT(ended, cudaSuccess);
      CHECK_CUDA(cudaMemsetAsync(out, 0, size, stream));
      preload_test::launch_once(graph, stream);
      std::vector<unsigned char> host(size);
      CHECK_CUDA(cudaMemcpyAsync(host.data(), out, size, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      for (unsigned char byte : host) CHECK(byte == value);
    }
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaStreamDestroy(stream));
  };
  preload_test::capture_on_two_threads(churn, capturer);
  CHECK_CUDA(cudaStreamDestroy(fenced));
  CHECK_MSG(invalidated.load() == 0,
            std::to_string(invalidated.load()) + " captures invalidated by the library");
}

void to_graph_case() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t size = 256 * kKiB;
  void* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, size));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaGraphCreate(&graph, 0));
  CHECK_CUDA(cudaStreamBeginCaptureToGraph(stream, graph, nullptr, nullptr, 0,
                                           cudaStreamCaptureModeGlobal));
  void* temp = nullptr;
  CHECK_CUDA(cudaMalloc(&temp, size));
  CHECK_CUDA(cudaMemsetAsync(temp, 0x77, size, stream));
  CHECK_CUDA(cudaMemcpyAsync(out, temp, size, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaFree(temp));
  cudaGraph_t ended = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &ended));
  CHECK(ended == graph);
  void* fresh = nullptr;
  CHECK_CUDA(cudaMalloc(&fresh, size));
  CHECK_CUDA(cudaMemset(fresh, 0x5a, size));
  preload_test::launch_once(graph, stream);
  CHECK(preload_test::device_bytes_equal(out, size, 0x77));
  CHECK(preload_test::device_bytes_equal(fresh, size, 0x5a));
  CHECK_CUDA(cudaFree(fresh));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

// Note [Managed frees during a capture] in interpose/pooling.cpp.
void managed_freed_case() {
  constexpr std::size_t kSize = 4096;
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* freed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&freed, kSize));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemsetAsync(freed, 0xab, kSize, stream));
  CHECK_CUDA(cudaFree(freed));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  // Slabs turn over every few thousand small allocations freed as they come.
  for (int i = 0; i < 20000; ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMallocManaged(&buffer, kSize));
    CHECK_MSG(buffer != freed, "memory freed in a capture went to a new allocation after " +
                                   std::to_string(i) + " allocations");
    CHECK_CUDA(cudaFree(buffer));
  }
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void destroyed_case() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t workspace_size = free_bytes / 10 * 4;
  const std::size_t big_size = free_bytes / 10 * 7;
  for (int round = 0; round < 5; ++round) {
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    void* workspace = nullptr;
    CHECK_CUDA(cudaMalloc(&workspace, workspace_size));
    CHECK_CUDA(cudaMemsetAsync(workspace, 3, workspace_size, stream));
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    preload_test::launch_once(graph, stream);  // and destroys the graph and its executable
    CHECK_CUDA(cudaFree(workspace));
    CHECK_CUDA(cudaDeviceSynchronize());
    // cudaMemGetInfo counts the workspace free once the graph's release came, with no other
    // call to bring it in (it once waited for the next allocation or free).
    if (preload_test::on_stand_in()) {
      std::size_t now = 0;
      for (int wait = 0; wait < 200; ++wait) {
        CHECK_CUDA(cudaMemGetInfo(&now, &total));
        if (now >= free_bytes) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      CHECK_MSG(now >= free_bytes, "round " + std::to_string(round) + ": " +
                                       std::to_string(free_bytes - now) + " B short");
    }
    void* big = nullptr;
    CHECK_MSG(cudaMalloc(&big, big_size) == cudaSuccess,
              "round " + std::to_string(round) + ": the destroyed graph's memory did not come back");
    CHECK_CUDA(cudaFree(big));
  }
  // A small buffer freed during a capture keeps its whole page for the graph. Right after the
  // graph is destroyed, cudaMemGetInfo counts the page free, and a request for all the free
  // memory succeeds (asked first, or not): on the stand-in, whose device holds nothing else.
  for (const bool ask_first : {false, true}) {
    if (!preload_test::on_stand_in()) break;
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    void* slice = nullptr;
    CHECK_CUDA(cudaMalloc(&slice, 4096));
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    CHECK_CUDA(cudaFreeAsync(slice, cudaStreamLegacy));
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaDeviceSynchronize());
    if (ask_first) {  // the news comes on CUDA's own thread: a loaded machine may delay it
      std::size_t now = 0;
      for (int wait = 0; wait < 100; ++wait) {
        CHECK_CUDA(cudaMemGetInfo(&now, &total));
        if (now >= free_bytes) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      CHECK_MSG(now >= free_bytes,
                std::to_string(free_bytes - now) + " B short after the destroy");
    }
    void* all = nullptr;
    CHECK_MSG(cudaMalloc(&all, free_bytes) == cudaSuccess,
              "all the free memory, after the destroy, was refused");
    CHECK_CUDA(cudaFree(all));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK(argc == 2);
  std::string which = argv[1];
  if (which.rfind("child:", 0) != 0) return preload_test::run_capture_child(which);
  which = which.substr(6);
  CHECK_CUDA(cudaFree(nullptr));
  if (which == "replay") replay_case();
  else if (which == "lifetime") lifetime_case();
  else if (which == "invalidated") invalidated_case();
  else if (which == "recapture") recapture_case();
  else if (which == "batches") batches_case(false);
  else if (which == "batches_shared") batches_case(true);
  else if (which == "threads") threads_case();
  else if (which == "to_graph") to_graph_case();
  else if (which == "destroyed") destroyed_case();
  else if (which == "managed_freed") managed_freed_case();
  else preload_test::fail(__FILE__, __LINE__, "unknown case " + which);
  CHECK_CUDA(cudaGetLastError());
  std::printf("%s: ok\n", which.c_str());
  return 0;
}
