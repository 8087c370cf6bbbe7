// Preload test 5: cross-stream reuse. A buffer still in use by a stream that is blocked (its
// queue waits behind a host function) is freed, and the next allocation is written on another
// stream. With free fences (the default) the freed memory is not handed out until the blocked
// stream has passed the free, so the new buffer's data verifies and the stand-in's race
// detector counts nothing. Run with the argument "expect-race" under free_fence:none, the same
// steps reuse the memory at once and the blocked stream's late write corrupts the new buffer:
// the race is detected, which proves the test can fail.
//
// Two cases: the blocked stream is non-blocking (it needs its own fence event) and blocking
// (the legacy default stream's event covers it).
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "check.h"

namespace {

struct Gate {
  std::atomic<bool> entered{false};  // the blocked stream reached the gate
  std::atomic<bool> open{false};
};

// Holds its stream until the gate opens (at most ten seconds, so that a mistake cannot hang a
// real GPU forever).
void CUDART_CB wait_at_gate(void* data) {
  auto* gate = static_cast<Gate*>(data);
  gate->entered.store(true);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!gate->open.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

constexpr std::size_t kSize = 1 << 20;

// Returns true when the new buffer was corrupted by the blocked stream's late write.
bool run_case(const char* name, unsigned int blocked_flags, bool expect_race) {
  cudaStream_t blocked = nullptr;
  cudaStream_t other = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&blocked, blocked_flags));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  const bool counted = preload_test::on_stand_in();
  std::uint64_t races_before = counted ? preload_test::counter("races") : 0;

  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, kSize));
  CHECK_CUDA(cudaMemset(first, 0, kSize));
  Gate gate;
  // The blocked stream's work: on the stand-in a kernel-like access that writes the buffer and
  // stays active (visible to the race detector) until the gate opens; on a GPU a host function
  // that holds the stream. Either way a write of the whole buffer follows it.
  if (auto launch_access = preload_test::launch_access_function()) {
    CHECK(launch_access(blocked, first, kSize, 1, &wait_at_gate, &gate) == cudaSuccess);
  } else {
    CHECK_CUDA(cudaLaunchHostFunc(blocked, &wait_at_gate, &gate));
  }
  CHECK_CUDA(cudaMemsetAsync(first, 0xaa, kSize, blocked));  // queued behind the gate
  // The blocked stream's access is executing (not merely queued) before anything else happens,
  // so an unfenced reuse overlaps it in time and the race detector cannot miss it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!gate.entered.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(gate.entered.load());
  CHECK_CUDA(cudaFree(first));  // the program is done with it; the stream is not

  void* second = nullptr;
  CHECK_CUDA(cudaMalloc(&second, kSize));
  CHECK_CUDA(cudaMemsetAsync(second, 0xbb, kSize, other));
  CHECK_CUDA(cudaStreamSynchronize(other));
  gate.open.store(true);
  CHECK_CUDA(cudaStreamSynchronize(blocked));

  bool corrupted = !preload_test::device_bytes_equal(second, kSize, 0xbb);
  std::uint64_t races = counted ? preload_test::counter("races") - races_before : 0;
  std::printf("%s: reused=%d corrupted=%d races=%llu\n", name, second == first ? 1 : 0,
              corrupted ? 1 : 0, static_cast<unsigned long long>(races));
  if (expect_race) {
    CHECK_MSG(second == first, std::string(name) + ": free_fence:none should reuse at once");
    CHECK_MSG(corrupted, std::string(name) + ": the late write should show");
    if (counted) CHECK_MSG(races > 0, std::string(name) + ": the race detector should fire");
  } else {
    CHECK_MSG(!corrupted, std::string(name) + ": the new buffer was overwritten");
    if (counted) CHECK_MSG(races == 0, std::string(name) + ": races detected");
  }
  CHECK_CUDA(cudaFree(second));
  CHECK_CUDA(cudaStreamDestroy(blocked));
  CHECK_CUDA(cudaStreamDestroy(other));
  return corrupted;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const bool expect_race = argc > 1 && std::string(argv[1]) == "expect-race";
  CHECK_CUDA(cudaFree(nullptr));
  run_case("non-blocking stream", cudaStreamNonBlocking, expect_race);
  run_case("blocking stream", cudaStreamDefault, expect_race);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("ok\n");
  return 0;
}
