// Preload test 16: free fences of one device recorded from a thread whose current device is
// another. Device 1's buffer is still in use by a blocked non-blocking stream of device 1 when
// the program, with device 0 current, frees it and enough other device-1 buffers to close the
// fence epoch. The fence must be recorded on device 1's streams (with device 1 made current for
// the call and device 0 current again afterwards), so the buffer is not handed out again until
// the blocked stream has passed: new device-1 buffers written on another stream verify and the
// stand-in's race detector counts nothing. Two cases: the blocked stream non-blocking (its own
// event) and blocking (device 1's legacy stream event covers it). Skipped with fewer than two
// devices.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

using preload_test::Gate;
using preload_test::wait_at_gate;

constexpr std::size_t kSize = 1 << 20;
constexpr int kSmall = 300;  // more frees than one fence epoch holds (256)
constexpr int kMaxAllocations = 64;

void run_case(const char* name, unsigned int blocked_flags) {
  const bool counted = preload_test::on_stand_in();
  const std::uint64_t races_before = counted ? preload_test::counter("races") : 0;

  // A stream on device 0 that a device-1 fence must leave alone.
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t distractor = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&distractor, cudaStreamNonBlocking));

  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t blocked = nullptr;
  cudaStream_t other = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&blocked, blocked_flags));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, kSize));
  CHECK_CUDA(cudaMemset(first, 0, kSize));
  std::vector<void*> small(kSmall);
  for (void*& ptr : small) CHECK_CUDA(cudaMalloc(&ptr, 4096));
  Gate gate;
  if (auto launch_access = preload_test::launch_access_function()) {
    CHECK(launch_access(blocked, first, kSize, 1, &wait_at_gate, &gate) == cudaSuccess);
  } else {
    CHECK_CUDA(cudaLaunchHostFunc(blocked, &wait_at_gate, &gate));
  }
  CHECK_CUDA(cudaMemsetAsync(first, 0xaa, kSize, blocked));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!gate.entered.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(gate.entered.load());

  // Device 0 current: the frees close an epoch of device 1's manager.
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(first));
  for (void* ptr : small) CHECK_CUDA(cudaFree(ptr));
  int current = -1;
  CHECK_CUDA(cudaGetDevice(&current));
  CHECK_MSG(current == 0, "the current device changed to " + std::to_string(current));
  // Device 0 has nothing pending: an event wrongly recorded there has passed before the next
  // miss looks at it.
  CHECK_CUDA(cudaDeviceSynchronize());

  // Device 1 again: new buffers until the freed one comes back or the pool had to grow.
  CHECK_CUDA(cudaSetDevice(1));
  std::vector<void*> taken;
  void* second = nullptr;
  for (int i = 0; i < kMaxAllocations && second != first; ++i) {
    CHECK_CUDA(cudaMalloc(&second, kSize));
    CHECK_CUDA(cudaMemsetAsync(second, 0xbb, kSize, other));
    taken.push_back(second);
    CHECK_CUDA(cudaStreamSynchronize(other));
    // (Device 1's legacy stream waits for a blocked blocking stream: synchronise it only when
    // the blocked stream is non-blocking.)
    if (blocked_flags == cudaStreamNonBlocking) CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  }
  gate.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());

  bool corrupted = false;
  for (void* ptr : taken) corrupted |= !preload_test::device_bytes_equal(ptr, kSize, 0xbb);
  const std::uint64_t races = counted ? preload_test::counter("races") - races_before : 0;
  std::printf("%s: reused=%d after %zu allocations, corrupted=%d races=%llu\n", name,
              second == first ? 1 : 0, taken.size(), corrupted ? 1 : 0,
              static_cast<unsigned long long>(races));
  CHECK_MSG(!corrupted, std::string(name) + ": a new buffer was overwritten");
  if (counted) CHECK_MSG(races == 0, std::string(name) + ": races detected");

  for (void* ptr : taken) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaStreamDestroy(blocked));
  CHECK_CUDA(cudaStreamDestroy(other));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamDestroy(distractor));
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  preload_test::require_devices(2);
  // A non-blocking stream needs an event of its own; a blocking one is covered by the event on
  // device 1's legacy stream (not device 0's).
  run_case("non-blocking stream", cudaStreamNonBlocking);
  run_case("blocking stream", cudaStreamDefault);
  CHECK_CUDA(cudaGetLastError());
  std::printf("ok\n");
  return 0;
}
