// Preload test: a device that leaves stream-ordered reuse while other threads act at that very
// moment (Note [Leaving among threads] in interpose/stream_order.cpp). Each case is a race, so
// the program runs it in many children (one device state each: leaving is final) and every one
// must pass; before the fix about half the per_thread rounds and one capture round in ten failed.
//   per_thread  a program with one blocking stream B: each of twelve threads frees a buffer that
//               a slow kernel on B still writes, gets the same address back at once (the device
//               is ordered), and at a common start writes it through its per-thread stream,
//               first use of that stream, while the main thread creates a non-blocking stream
//               (the device leaves). Every thread must read back its own bytes, and the
//               stand-in's race detector must stay silent.
//   capture     one thread begins a capture on B while the main thread creates a non-blocking
//               stream: the capture must end valid.
// With two devices, the first use of the second device must make its legacy stream wait for the
// fence of memory reused on the first (Note [Leaving among threads]):
//   set_device  device 0 reuses a buffer a slow kernel still writes; twelve threads at once make
//               device 1 current and each writes its chunk of the buffer on device 1's legacy
//               stream: every chunk must read back as written, without a race;
//   helper      device 1 reuses such a buffer and leaves (a non-blocking stream); a thread that
//               never called cudaSetDevice (so on device 0) uploads into it with cudaMemcpy:
//               the upload must come after the old owner's write (one round: no race needed).
// Needs the stand-in's kernel that runs a function (simcuda_access_kernel); elsewhere it skips.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../simcuda/simcuda.h"
#include "check.h"

namespace {

constexpr std::size_t kBytes = 256 * 1024;
constexpr int kThreads = 12;

const void* access_kernel() { return ::dlsym(RTLD_DEFAULT, "simcuda_access_kernel"); }

struct Fill {
  void* ptr = nullptr;
  unsigned char byte = 0;
  int delay_ms = 0;
  std::size_t bytes = kBytes;
};

void fill(void* data) {
  const auto* f = static_cast<const Fill*>(data);
  if (f->delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f->delay_ms));
  std::memset(f->ptr, f->byte, f->bytes);
}

// A kernel on `stream` that writes `byte` over `bytes` of the buffer, after `delay_ms`.
void late_write(cudaStream_t stream, Fill& f, std::size_t bytes) {
  f.bytes = bytes;
  simcuda_access access{f.ptr, bytes, 1, &fill, &f};
  void* args[] = {&access};
  CHECK_CUDA(cudaLaunchKernel(access_kernel(), dim3(1), dim3(1), args, 0, stream));
}

void write_kernel(cudaStream_t stream, Fill& f) { late_write(stream, f, kBytes); }

void spin_until(const std::atomic<bool>& go) {
  while (!go.load()) {
  }
}

int per_thread_round() {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t slow = nullptr;
  CHECK_CUDA(cudaStreamCreate(&slow));  // blocking: with the legacy stream, still one order
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      void* old = nullptr;
      CHECK_CUDA(cudaMalloc(&old, kBytes));
      Fill late{old, 0xEE, 40};  // the old owner's work, still running
      write_kernel(slow, late);
      CHECK_CUDA(cudaFree(old));
      void* mine = nullptr;
      CHECK_CUDA(cudaMalloc(&mine, kBytes));
      ready.fetch_add(1);
      spin_until(go);
      Fill own{mine, static_cast<unsigned char>(t), 0};
      write_kernel(cudaStreamPerThread, own);
      CHECK_CUDA(cudaDeviceSynchronize());
      if (!preload_test::device_bytes_equal(mine, kBytes, static_cast<unsigned char>(t)))
        wrong.fetch_add(1);
      CHECK_CUDA(cudaFree(mine));
    });
  }
  while (ready.load() < kThreads) std::this_thread::yield();
  go.store(true);
  cudaStream_t late_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&late_stream, cudaStreamNonBlocking));
  for (std::thread& thread : threads) thread.join();
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(wrong.load() == 0, std::to_string(wrong.load()) + " threads read another's bytes");
  CHECK_MSG(preload_test::counter("races") == 0, "the stand-in saw unordered writes");
  return 0;
}

int capture_round() {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t blocking = nullptr;
  CHECK_CUDA(cudaStreamCreate(&blocking));
  void* freed = nullptr;
  CHECK_CUDA(cudaMalloc(&freed, kBytes));
  CHECK_CUDA(cudaFree(freed));  // a free: leaving records F on the legacy stream
  void* target = nullptr;
  CHECK_CUDA(cudaMalloc(&target, kBytes));
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  // Threads that allocate meanwhile hold the pools' locks, which the leave takes: its window
  // widens, and the capture's begin, a little later each round, lands in it more often.
  std::vector<std::thread> busy;
  for (int t = 0; t < 2; ++t) {
    busy.emplace_back([&] {
      while (!stop.load()) {
        void* p = nullptr;
        CHECK_CUDA(cudaMalloc(&p, 4096));
        CHECK_CUDA(cudaFree(p));
      }
    });
  }
  const char* round = std::getenv("LEAVE_ROUND");
  const auto delay = std::chrono::microseconds(10 * ((round != nullptr ? std::atoi(round) : 0) % 8));
  cudaError_t memset_result = cudaSuccess;
  cudaError_t end_result = cudaSuccess;
  std::thread capturer([&] {
    spin_until(go);
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
    }
    CHECK_CUDA(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeThreadLocal));
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    memset_result = cudaMemsetAsync(target, 2, kBytes, blocking);
    cudaGraph_t graph = nullptr;
    end_result = cudaStreamEndCapture(blocking, &graph);
    if (graph != nullptr) preload_test::launch_once(graph, blocking);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  go.store(true);
  cudaStream_t late_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&late_stream, cudaStreamNonBlocking));
  capturer.join();
  stop.store(true);
  for (std::thread& thread : busy) thread.join();
  CHECK_MSG(memset_result == cudaSuccess && end_result == cudaSuccess,
            std::string("the capture was invalidated: ") + cudaGetErrorName(end_result));
  CHECK(preload_test::device_bytes_equal(target, kBytes, 2));
  CHECK_CUDA(cudaFree(target));
  return 0;
}

int set_device_round() {
  constexpr std::size_t kChunk = 64 * 1024;
  CHECK_CUDA(cudaSetDevice(0));
  void* old = nullptr;
  CHECK_CUDA(cudaMalloc(&old, kChunk * kThreads));
  Fill late{old, 0xEE, 200};
  late_write(cudaStreamLegacy, late, kChunk * kThreads);
  CHECK_CUDA(cudaFree(old));
  void* reused = nullptr;
  CHECK_CUDA(cudaMalloc(&reused, kChunk * kThreads));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Fill> fills(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      spin_until(go);
      CHECK_CUDA(cudaSetDevice(1));
      fills[t] = Fill{static_cast<char*>(reused) + t * kChunk, static_cast<unsigned char>(t + 1),
                      0};
      late_write(cudaStreamLegacy, fills[t], kChunk);
      CHECK_CUDA(cudaDeviceSynchronize());
    });
  }
  while (ready.load() < kThreads) std::this_thread::yield();
  go.store(true);
  for (std::thread& thread : threads) thread.join();
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int t = 0; t < kThreads; ++t) {
    CHECK_MSG(preload_test::device_bytes_equal(static_cast<char*>(reused) + t * kChunk, kChunk,
                                               static_cast<unsigned char>(t + 1)),
              "chunk " + std::to_string(t) + " holds the old owner's bytes");
  }
  CHECK_MSG(preload_test::counter("races") == 0, "the stand-in saw unordered writes");
  return 0;
}

int helper_round() {
  CHECK_CUDA(cudaSetDevice(1));
  void* old = nullptr;
  CHECK_CUDA(cudaMalloc(&old, kBytes));
  Fill late{old, 0xEE, 300};
  write_kernel(cudaStreamLegacy, late);
  CHECK_CUDA(cudaFree(old));
  void* reused = nullptr;
  CHECK_CUDA(cudaMalloc(&reused, kBytes));
  cudaStream_t late_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&late_stream, cudaStreamNonBlocking));  // device 1 leaves
  std::thread helper([&] {
    const std::vector<unsigned char> bytes(kBytes, 0x22);
    CHECK_CUDA(cudaMemcpy(reused, bytes.data(), kBytes, cudaMemcpyHostToDevice));
  });
  helper.join();
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(preload_test::device_bytes_equal(reused, kBytes, 0x22),
            "the upload ran before the old owner's write");
  CHECK_MSG(preload_test::counter("races") == 0, "the stand-in saw unordered writes");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (access_kernel() == nullptr)
    preload_test::skip("needs the stand-in's kernel that runs a function");
  if (argc < 2) preload_test::fail(__FILE__, __LINE__, "usage: CASE [ROUNDS]");
  const std::string which = argv[1];
  if (which == "per_thread_round") return per_thread_round();
  if (which == "capture_round") return capture_round();
  if (which == "set_device_round" || which == "helper_round") preload_test::require_devices(2);
  if (which == "set_device_round") return set_device_round();
  if (which == "helper_round") return helper_round();
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string round = which + "_round";
  for (int r = 0; r < rounds; ++r) {
    const preload_test::ChildResult child =
        preload_test::run_self(round.c_str(), {"LEAVE_ROUND=" + std::to_string(r)}, 60);
    if (child.status != 0)
      preload_test::fail(__FILE__, __LINE__,
                         which + " round " + std::to_string(r) + ": " + child.output);
  }
  std::printf("%s: %d rounds ok\n", which.c_str(), rounds);
  return 0;
}
