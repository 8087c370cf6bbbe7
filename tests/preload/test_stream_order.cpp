// Preload test: stream-ordered reuse under free_fence:auto (Note [Stream-ordered reuse] in
// interpose/stream_order.cpp). One program, one case per argument.
// While a device's work is one ordered queue, a freed slice goes to the next allocation at once:
//   legacy        the legacy default stream alone
//   blocking      the legacy stream and one created blocking stream
// Each case frees a buffer and gets the same address back, then allocates, writes and frees one
// buffer 1,000 times with the stream parked behind a gate: every allocation gets that address
// and the pools never hold more than one page (read from the library's report, which also says
// `reuse: ordered`).
// Every way of leaving that state moves the device to fenced reuse without a race. The old
// owner of a buffer is parked on a slow stream, still writing it; the program frees it and gets
// the same address back at once (the device is still ordered); then it leaves, and the new
// owner writes the buffer on the queues that leaving brought in, and on a non-blocking stream
// created afterwards. Those writes must wait for the old owner (they are still pending while the
// gate is closed), the stand-in's race detector must stay silent, the data must be the new
// owner's and the report must say `reuse: fenced`:
//   non_blocking  a non-blocking stream is created
//   blocking2     a second blocking stream is created (the first one is the slow one)
//   per_thread    a second thread uses its per-thread default stream (the first thread uses its
//                 own through the cudaStreamPerThread handle, the second through a _ptsz entry
//                 point)
//   device        a second device is made current and its legacy stream writes the buffer
//   implicit_device  the program works on device 1; a thread that never called cudaSetDevice
//                 (so on device 0) writes the buffer on its legacy stream
//   implicit_device_sync  the same with that thread's synchronous cudaMemcpy
//   peer          peer access is enabled, then the second device writes the buffer
//   driver        a stream is created with cuStreamCreate (from the runtime's driver resolver)
//   capture       a capture begins on a blocking stream; the late stream is created inside the
//                 capture, which must still end valid
// Leaving behind a park:
//   park          the old owner's write (held back by a gate) and the free come before the
//                 program parks the legacy stream on a host function; a non-blocking stream
//                 created then (the device leaves) writes the buffer: the write must wait for
//                 the old owner's, and once that is done the stream's synchronize must return
//                 while the park goes on, since no work it depends on lies behind the park
// With the argument "expect-race" (run under free_fence:none), the same steps reuse without any
// fence: the new owner's writes run while the old owner still writes, the race detector fires and
// the data is the old owner's. That proves each case can fail.
// The program runs itself as a child with reports in JSON into a folder of its own, and raises
// the report signal to read them.
#include <cuda.h>
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "exit_report.h"
#include "signal_report.h"

// The per-thread-default-stream flavour, declared as a program built with
// -DCUDA_API_PER_THREAD_DEFAULT_STREAM sees it (the plain header does not declare it).
extern "C" cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count,
                                            cudaMemcpyKind kind, cudaStream_t stream);

namespace {

using preload_test::Gate;
using preload_test::wait_at_gate;

constexpr std::size_t kSize = 256 << 10;
constexpr std::size_t kHalf = kSize / 2;
constexpr unsigned char kOld = 0xaa;                  // the old owner's late write
constexpr unsigned char kNew[2] = {0xbb, 0xcc};       // the new owner's, per half

bool expect_race = false;  // free_fence:none

// ---- Reports -----------------------------------------------------------------------------------

std::string report_now() { return preload_test::signal_report("STREAM_ORDER_REPORTS"); }

// The word after "reuse": in the first device's section (device 0).
std::string reuse_of(const std::string& report) {
  const std::string key = "\"reuse\":\"";
  const std::size_t at = report.find(key);
  if (at == std::string::npos) return "(none)";
  const std::size_t from = at + key.size();
  return report.substr(from, report.find('"', from) - from);
}

// Under free_fence:none the report says so whatever the streams do.
void expect_reuse(const char* word) {
  const std::string expected = expect_race ? "unfenced" : word;
  const std::string reuse = reuse_of(report_now());
  CHECK_MSG(reuse == expected, "reuse is " + reuse + ", expected " + expected);
}

// ---- Streams -----------------------------------------------------------------------------------

cudaStream_t create_stream(unsigned int flags) {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, flags));
  return stream;
}

// Enqueues on `stream` an operation that writes `ptr` (on the stand-in: declared to the race
// detector, like a kernel) and, when `gate` is given, holds the stream until the gate opens.
void launch_write(cudaStream_t stream, void* ptr, std::size_t size, Gate* gate) {
  if (auto launch_access = preload_test::launch_access_function()) {
    CHECK(launch_access(stream, ptr, size, 1, gate != nullptr ? &wait_at_gate : nullptr, gate) ==
          cudaSuccess);
  } else if (gate != nullptr) {
    CHECK_CUDA(cudaLaunchHostFunc(stream, &wait_at_gate, gate));
  } else {
    CHECK_CUDA(cudaMemsetAsync(ptr, 0, size, stream));
  }
}

void wait_entered(const Gate& gate) {
  for (int i = 0; i < 10000 && !gate.entered.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(gate.entered.load());
}

std::uint64_t races() { return preload_test::on_stand_in() ? preload_test::counter("races") : 0; }

// ---- Single ordered queue: immediate reuse ------------------------------------------------------

// Frees and reallocates on `streams` (the legacy stream, and the blocking stream when given),
// first once, then 1,000 times behind a parked stream.
void reuse_case(cudaStream_t blocking) {
  const cudaStream_t main = blocking != nullptr ? blocking : cudaStreamLegacy;
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, kSize));
  launch_write(main, first, kSize, nullptr);
  CHECK_CUDA(cudaFree(first));
  void* again = nullptr;
  CHECK_CUDA(cudaMalloc(&again, kSize));
  CHECK_MSG(again == first, "a freed slice is reused at once");
  CHECK_CUDA(cudaFree(again));

  // The parked stream keeps every write pending: no fence could pass before the gate opens.
  Gate gate;
  launch_write(main, nullptr, 0, &gate);
  wait_entered(gate);
  for (int i = 0; i < 1000; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, kSize));
    CHECK_MSG(ptr == first, "allocation " + std::to_string(i) + " got another address");
    launch_write(i % 2 == 0 ? main : cudaStreamLegacy, ptr, kSize, nullptr);
    CHECK_CUDA(cudaFree(ptr));
  }
  gate.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::string report = report_now();
  CHECK_MSG(reuse_of(report) == "ordered", "reuse is " + reuse_of(report));
  const std::uint64_t pages = preload_test::sum_of(report, "pages_peak");
  CHECK_MSG(pages == 1, "the pools held " + std::to_string(pages) + " pages");
}

// ---- Leaving: the handover of a buffer across the transition -----------------------------------

class Handover {
 public:
  // The old owner writes a buffer on `slow`, which stays parked; the buffer is freed and
  // allocated again while the device is still ordered.
  explicit Handover(cudaStream_t slow) {
    races_before_ = races();
    for (int half = 0; half < 2; ++half) {
      CHECK_CUDA(cudaMallocHost(&host_[half], kHalf));
      std::memset(host_[half], kNew[half], kHalf);
    }
    CHECK_CUDA(cudaMalloc(&old_, kSize));
    expect_reuse("ordered");  // the pools exist now
    CHECK_CUDA(cudaMemset(old_, 0, kSize));
    launch_write(slow, old_, kSize, &gate_);
    CHECK_CUDA(cudaMemsetAsync(old_, kOld, kSize, slow));  // queued behind the gate
    wait_entered(gate_);
    CHECK_CUDA(cudaFree(old_));
    CHECK_CUDA(cudaMalloc(&new_, kSize));
    CHECK_MSG(new_ == old_, "the freed buffer comes back at once while the device is ordered");
  }

  // The new owner writes half `half` on `stream` of the current device, through the _ptsz
  // entry point when `ptsz`; the write must wait for the old owner (free_fence:auto) or run
  // past it (free_fence:none). `stream` is queried from the calling thread, in relaxed mode: a
  // query or synchronize of any stream is potentially unsafe under the thread's own capture.
  void write(int half, cudaStream_t stream, bool ptsz = false) {
    void* dst = static_cast<char*>(new_) + half * kHalf;
    if (ptsz) {
      CHECK_CUDA(cudaMemcpyAsync_ptsz(dst, host_[half], kHalf, cudaMemcpyHostToDevice, nullptr));
    } else {
      CHECK_CUDA(cudaMemcpyAsync(dst, host_[half], kHalf, cudaMemcpyHostToDevice, stream));
    }
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    if (expect_race) {
      CHECK_CUDA(cudaStreamSynchronize(stream));
    } else {
      CHECK_RESULT(cudaStreamQuery(stream), cudaErrorNotReady);
    }
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  }

  // The new owner writes half `half` with the legacy stream's synchronous cudaMemcpy, which
  // returns once the copy is done: after the old owner's write (free_fence:auto), or at once,
  // past it (free_fence:none).
  void write_synchronously(int half) {
    void* dst = static_cast<char*>(new_) + half * kHalf;
    CHECK_CUDA(cudaMemcpy(dst, host_[half], kHalf, cudaMemcpyHostToDevice));
  }

  void open_gate() { gate_.open.store(true); }

  // A non-blocking stream created after the transition on the current device writes `half`.
  void write_from_new_stream(int half) {
    late_.push_back(create_stream(cudaStreamNonBlocking));
    write(half, late_.back());
  }

  void finish(const char* name) {
    expect_reuse("fenced");
    gate_.open.store(true);
    int count = 0;
    int current = 0;
    CHECK_CUDA(cudaGetDeviceCount(&count));
    CHECK_CUDA(cudaGetDevice(&current));
    for (int device = 0; device < count; ++device) {
      CHECK_CUDA(cudaSetDevice(device));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaSetDevice(current));
    const std::uint64_t raced = races() - races_before_;
    bool new_data = true;
    for (int half = 0; half < 2; ++half)
      new_data &= preload_test::device_bytes_equal(static_cast<char*>(new_) + half * kHalf, kHalf,
                                                   kNew[half]);
    std::printf("%s: races=%llu new owner's data=%d\n", name,
                static_cast<unsigned long long>(raced), new_data ? 1 : 0);
    if (expect_race) {
      CHECK_MSG(!new_data, "the old owner's late write should show");
      if (preload_test::on_stand_in()) CHECK_MSG(raced > 0, "the race detector should fire");
    } else {
      CHECK_MSG(new_data, "the new owner's data was overwritten");
      CHECK_MSG(raced == 0, "races detected");
    }
    for (cudaStream_t stream : late_) CHECK_CUDA(cudaStreamDestroy(stream));
    CHECK_CUDA(cudaFree(new_));
    for (void* host : host_) CHECK_CUDA(cudaFreeHost(host));
  }

 private:
  Gate gate_;
  void* old_ = nullptr;
  void* new_ = nullptr;
  void* host_[2] = {};
  std::vector<cudaStream_t> late_;
  std::uint64_t races_before_ = 0;
};

void non_blocking_case() {
  Handover handover(cudaStreamLegacy);
  cudaStream_t stream = create_stream(cudaStreamNonBlocking);
  handover.write(0, stream);
  handover.write_from_new_stream(1);
  handover.finish("non_blocking");
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void blocking2_case() {
  cudaStream_t first = create_stream(cudaStreamDefault);
  Handover handover(first);
  cudaStream_t second = create_stream(cudaStreamDefault);
  handover.write(0, second);
  handover.write_from_new_stream(1);
  handover.finish("blocking2");
  CHECK_CUDA(cudaStreamDestroy(second));
  CHECK_CUDA(cudaStreamDestroy(first));
}

void per_thread_case() {
  void* warm = nullptr;
  CHECK_CUDA(cudaMalloc(&warm, kSize));
  // This thread's per-thread stream is the one blocking queue besides the legacy stream.
  CHECK_CUDA(cudaMemsetAsync(warm, 0, kSize, cudaStreamPerThread));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  Handover handover(cudaStreamPerThread);
  std::thread([&] { handover.write(0, cudaStreamPerThread, true); }).join();
  handover.write_from_new_stream(1);
  handover.finish("per_thread");
  CHECK_CUDA(cudaFree(warm));
}

int device_count() {
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) preload_test::skip("needs two devices");
  return count;
}

void device_case() {
  device_count();
  Handover handover(cudaStreamLegacy);
  CHECK_CUDA(cudaSetDevice(1));
  handover.write(0, cudaStreamLegacy);
  handover.write_from_new_stream(1);
  CHECK_CUDA(cudaSetDevice(0));
  handover.finish("device");
}

// The program's device is device 1; a thread that never calls cudaSetDevice works on device 0
// and its legacy stream writes the buffer.
void implicit_device_case() {
  device_count();
  CHECK_CUDA(cudaSetDevice(1));
  Handover handover(cudaStreamLegacy);
  std::thread([&] { handover.write(0, cudaStreamLegacy); }).join();
  handover.write_from_new_stream(1);
  handover.finish("implicit_device");
}

// As implicit_device, with a synchronous cudaMemcpy: the thread's copy must still be waiting for
// the old owner while the gate is closed.
void implicit_device_sync_case() {
  device_count();
  CHECK_CUDA(cudaSetDevice(1));
  Handover handover(cudaStreamLegacy);
  std::atomic<bool> copied{false};
  std::thread thread([&] {
    handover.write_synchronously(0);
    copied.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool early = copied.load();
  handover.write_from_new_stream(1);
  handover.open_gate();
  thread.join();
  if (!expect_race) CHECK_MSG(!early, "the copy did not wait for the old owner");
  handover.finish("implicit_device_sync");
}

void peer_case() {
  device_count();
  int can_access = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&can_access, 0, 1));
  if (can_access == 0) preload_test::skip("device 0 cannot access device 1");
  Handover handover(cudaStreamLegacy);
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  handover.write_from_new_stream(0);
  CHECK_CUDA(cudaSetDevice(1));
  handover.write(1, cudaStreamLegacy);
  CHECK_CUDA(cudaSetDevice(0));
  handover.finish("peer");
  CHECK_CUDA(cudaDeviceDisablePeerAccess(1));
}

void driver_case() {
  const auto create = preload_test::driver_entry<decltype(&cuStreamCreate)>("cuStreamCreate", 2000);
  Handover handover(cudaStreamLegacy);
  CUstream stream = nullptr;
  CHECK(create(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  handover.write(0, reinterpret_cast<cudaStream_t>(stream));
  handover.write_from_new_stream(1);
  handover.finish("driver");
  CHECK_CUDA(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream)));
}

void capture_case() {
  cudaStream_t capturing = create_stream(cudaStreamDefault);
  void* captured = nullptr;
  CHECK_CUDA(cudaMalloc(&captured, kSize));
  Handover handover(cudaStreamLegacy);
  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeThreadLocal));
  CHECK_CUDA(cudaMemsetAsync(captured, 1, kSize, capturing));
  handover.write_from_new_stream(0);
  handover.write_from_new_stream(1);
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));  // still valid
  handover.finish("capture");
  preload_test::launch_once(graph, capturing);
  CHECK(preload_test::device_bytes_equal(captured, kSize, 1));
  CHECK_CUDA(cudaFree(captured));
  CHECK_CUDA(cudaStreamDestroy(capturing));
}

void park_case() {
  const std::uint64_t races_before = races();
  void* keeper = nullptr;  // keeps the page busy: the host function gives no page back
  CHECK_CUDA(cudaMalloc(&keeper, kSize));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, kSize));
  Gate old_write;
  launch_write(cudaStreamLegacy, buffer, kSize, &old_write);  // the old owner, still writing
  wait_entered(old_write);
  CHECK_CUDA(cudaFree(buffer));
  expect_reuse("ordered");
  Gate park;
  CHECK_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, &wait_at_gate, &park));
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 5000 && !done.load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!done.load()) park.open.store(true);  // never leave a real GPU parked
  });
  const cudaStream_t late = create_stream(cudaStreamNonBlocking);  // the device leaves
  void* again = nullptr;
  CHECK_CUDA(cudaMalloc(&again, kSize));
  CHECK_CUDA(cudaMemsetAsync(again, kNew[0], kSize, late));
  CHECK_RESULT(cudaStreamQuery(late), cudaErrorNotReady);  // behind the old owner's write
  old_write.open.store(true);
  wait_entered(park);
  const cudaError_t synced = cudaStreamSynchronize(late);
  const bool before_park_ended = !park.open.load();
  done.store(true);
  watchdog.join();
  CHECK_RESULT(synced, cudaSuccess);
  CHECK_MSG(before_park_ended, "cudaStreamSynchronize of the new stream waited for the park");
  expect_reuse("fenced");
  park.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(again == buffer, "the freed slice should be reused");
  CHECK(preload_test::device_bytes_equal(again, kSize, kNew[0]));
  CHECK_MSG(races() == races_before, "the new owner raced the old one");
  CHECK_CUDA(cudaFree(again));
  CHECK_CUDA(cudaFree(keeper));
  CHECK_CUDA(cudaStreamDestroy(late));
}

// ---- Parent ------------------------------------------------------------------------------------

int run_child(const std::string& which) {
  char dir[] = "/tmp/poolcuda-stream-order-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  std::string conf = "report_format:json,report_path:" + std::string(dir) + "/r-%n.json";
  if (const char* extra = std::getenv("POOLCUDA_CONF"); extra != nullptr && *extra != '\0') {
    conf += ',';
    conf += extra;
  }
  std::vector<std::string> env = {"POOLCUDA_CONF=" + conf,
                                  "STREAM_ORDER_REPORTS=" + std::string(dir)};
  if (which.find("device") != std::string::npos || which.rfind("peer", 0) == 0)
    env.push_back("SIMCUDA_DEVICES=2");
  const preload_test::ChildResult child =
      preload_test::run_self(("child:" + which).c_str(), env);
  std::printf("%s", child.output.c_str());
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
  return child.status;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK(argc >= 2);
  std::string which = argv[1];
  if (which.rfind("child:", 0) != 0) {
    if (argc == 3 && std::string(argv[2]) == "expect-race") which += ":expect-race";
    return run_child(which);
  }
  which = which.substr(6);
  if (const std::size_t colon = which.find(':'); colon != std::string::npos) {
    expect_race = which.substr(colon + 1) == "expect-race";
    which = which.substr(0, colon);
  }
  CHECK_CUDA(cudaFree(nullptr));
  if (which == "legacy") reuse_case(nullptr);
  else if (which == "blocking") reuse_case(create_stream(cudaStreamDefault));
  else if (which == "non_blocking") non_blocking_case();
  else if (which == "blocking2") blocking2_case();
  else if (which == "per_thread") per_thread_case();
  else if (which == "device") device_case();
  else if (which == "implicit_device") implicit_device_case();
  else if (which == "implicit_device_sync") implicit_device_sync_case();
  else if (which == "peer") peer_case();
  else if (which == "driver") driver_case();
  else if (which == "capture") capture_case();
  else if (which == "park") park_case();
  else preload_test::fail(__FILE__, __LINE__, "unknown case " + which);
  CHECK_CUDA(cudaGetLastError());
  std::printf("%s: ok\n", which.c_str());
  return 0;
}
