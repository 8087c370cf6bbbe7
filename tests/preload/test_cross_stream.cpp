// Preload test 5: cross-stream reuse. A buffer still in use by a stream that is blocked (its
// queue waits behind a host function) is freed, and the next allocation is written on another
// stream. With free fences (the default) the freed memory is not handed out until the blocked
// stream has passed the free, so the new buffer's data verifies and the stand-in's race
// detector counts nothing. Run with the argument "expect-race" under free_fence:none, the same
// steps reuse the memory at once and the blocked stream's late write corrupts the new buffer:
// the race is detected, which proves the test can fail.
//
// Three cases: the blocked stream is non-blocking (it needs its own fence event), blocking (the
// legacy default stream's event covers it), and non-blocking but destroyed before the free
// (cudaStreamDestroy returns at once and the queued work still runs: the fence must still wait
// for it although the stream no longer exists).
// With the argument "driver-streams" the streams are created with cuStreamCreate and destroyed
// with cuStreamDestroy_v2 (from cudaGetDriverEntryPointByVersion): the runtime's stream hooks
// never see them, the driver hooks must. "driver-streams-v1" destroys them with the CUDA 2.0
// cuStreamDestroy instead, as programs that find driver functions by their plain names do.
// Last, the non-blocking case again beside a hundred idle streams, which fences must not
// record events on.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

using preload_test::driver_entry;
using preload_test::Gate;
using preload_test::wait_at_gate;

constexpr std::size_t kSize = 1 << 20;

bool driver_streams = false;
bool destroy_v1 = false;  // cuStreamDestroy (CUDA 2.0) instead of cuStreamDestroy_v2

cudaStream_t create_stream(unsigned int flags) {
  cudaStream_t stream = nullptr;
  if (!driver_streams) {
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, flags));
    return stream;
  }
  static auto create = driver_entry<decltype(&cuStreamCreate)>("cuStreamCreate", 2000);
  CHECK(create(reinterpret_cast<CUstream*>(&stream), flags) == CUDA_SUCCESS);
  return stream;
}

void destroy_stream(cudaStream_t stream) {
  if (!driver_streams) {
    CHECK_CUDA(cudaStreamDestroy(stream));
    return;
  }
  static auto destroy =
      driver_entry<decltype(&cuStreamDestroy_v2)>("cuStreamDestroy", destroy_v1 ? 2000 : 4000);
  CHECK(destroy(reinterpret_cast<CUstream>(stream)) == CUDA_SUCCESS);
}
// Enough 1 MiB buffers to fill the page the freed one came from.
constexpr int kMaxAllocations = 64;

// Returns true when the new buffer was corrupted by the blocked stream's late write.
bool run_case(const char* name, unsigned int blocked_flags, bool expect_race,
              bool destroy_first = false) {
  cudaStream_t blocked = nullptr;
  cudaStream_t other = nullptr;
  blocked = create_stream(blocked_flags);
  other = create_stream(cudaStreamNonBlocking);
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
  if (destroy_first) destroy_stream(blocked);  // its queued work still runs
  CHECK_CUDA(cudaFree(first));  // the program is done with it; the stream is not

  // New buffers, written on another stream, until the freed one comes back (at once without
  // fences). The destroyed-stream case takes enough that the pool has to miss and consult the
  // fences (it runs first, on an empty pool).
  std::vector<void*> taken;
  void* second = nullptr;
  const int allocations = destroy_first ? kMaxAllocations : 1;
  for (int i = 0; i < allocations && second != first; ++i) {
    CHECK_CUDA(cudaMalloc(&second, kSize));
    CHECK_CUDA(cudaMemsetAsync(second, 0xbb, kSize, other));
    taken.push_back(second);
    if (destroy_first) {
      // Every stream but the blocked one is idle, so the fence recorded at a miss has passed
      // (or is waiting for the blocked stream only) by the next miss.
      CHECK_CUDA(cudaStreamSynchronize(other));
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(other));
  gate.open.store(true);
  if (destroy_first) {
    CHECK_CUDA(cudaDeviceSynchronize());
  } else {
    CHECK_CUDA(cudaStreamSynchronize(blocked));
  }

  bool corrupted = false;
  for (void* buffer : taken) corrupted |= !preload_test::device_bytes_equal(buffer, kSize, 0xbb);
  std::uint64_t races = counted ? preload_test::counter("races") - races_before : 0;
  std::printf("%s: reused=%d after %zu allocations, corrupted=%d races=%llu\n", name,
              second == first ? 1 : 0, taken.size(), corrupted ? 1 : 0,
              static_cast<unsigned long long>(races));
  if (expect_race) {
    CHECK_MSG(second == first, std::string(name) + ": free_fence:none should reuse at once");
    CHECK_MSG(corrupted, std::string(name) + ": the late write should show");
    if (counted) CHECK_MSG(races > 0, std::string(name) + ": the race detector should fire");
  } else {
    CHECK_MSG(!corrupted, std::string(name) + ": a new buffer was overwritten");
    if (counted) CHECK_MSG(races == 0, std::string(name) + ": races detected");
  }
  for (void* buffer : taken) CHECK_CUDA(cudaFree(buffer));
  if (!destroy_first) destroy_stream(blocked);
  destroy_stream(other);
  return corrupted;
}

// A hundred idle non-blocking streams beside a busy one: a fence records no event on a stream
// with nothing queued (Note [Fence streams] in interpose/cuda_device.cpp), so each batch of
// frees costs a few events, not one per stream, while the blocked stream's fence still holds
// the buffer back (run_case, with the idle streams alive).
void idle_streams_case(bool expect_race) {
  std::vector<cudaStream_t> idle(100);
  for (cudaStream_t& stream : idle) stream = create_stream(cudaStreamNonBlocking);
  run_case("non-blocking stream beside idle ones", cudaStreamNonBlocking, expect_race);
  if (!expect_race && preload_test::on_stand_in()) {
    cudaStream_t busy = create_stream(cudaStreamNonBlocking);
    const std::uint64_t records = preload_test::counter("cudaEventRecord");
    constexpr int kBatches = 20;
    for (int i = 0; i < kBatches; ++i) {
      void* buffer = nullptr;
      CHECK_CUDA(cudaMalloc(&buffer, kSize));
      CHECK_CUDA(cudaMemsetAsync(buffer, 1, kSize, busy));
      CHECK_CUDA(cudaFree(buffer));
      CHECK_CUDA(cudaDeviceSynchronize());  // the batch gets its fence
    }
    const std::uint64_t made = preload_test::counter("cudaEventRecord") - records;
    std::printf("idle streams: %llu events for %d batches\n",
                static_cast<unsigned long long>(made), kBatches);
    CHECK_MSG(made <= 3 * kBatches, "fences recorded events on idle streams: " +
                                        std::to_string(made) + " for " +
                                        std::to_string(kBatches) + " batches");
    destroy_stream(busy);
  }
  for (cudaStream_t stream : idle) destroy_stream(stream);
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  bool expect_race = false;
  for (int i = 1; i < argc; ++i) {
    expect_race |= std::string(argv[i]) == "expect-race";
    driver_streams |= std::string(argv[i]) == "driver-streams";
    destroy_v1 |= std::string(argv[i]) == "driver-streams-v1";
  }
  CHECK_CUDA(cudaFree(nullptr));
  run_case("destroyed non-blocking stream", cudaStreamNonBlocking, expect_race, true);
  run_case("non-blocking stream", cudaStreamNonBlocking, expect_race);
  run_case("blocking stream", cudaStreamDefault, expect_race);
  idle_streams_case(expect_race);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("ok\n");
  return 0;
}
