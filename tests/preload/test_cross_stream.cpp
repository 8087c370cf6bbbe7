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
// for it although the stream no longer exists). The destroyed stream again, destroyed while it
// captures: a relaxed capture it began, the same with the buffer freed inside the capture, and a
// capture of another stream it joined through cudaStreamWaitEvent (the library can record
// nothing on a capturing stream: it marks the stream's work just before). Each destroyed case
// runs in a process of its own, on an empty pool.
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

// How the blocked stream is left before the buffer is freed. Every way but `stays` destroys it
// while its work still waits at the gate; the capturing ones destroy it while it captures, so
// the library can record nothing on it then (Note [Streams destroyed while capturing] in
// interpose/cuda_device.cpp).
enum class Leave {
  stays,
  destroyed,
  destroyed_capturing,   // it began a relaxed capture
  freed_in_capture,      // the same, with the free inside the capture, before the destroy
  joined_and_destroyed,  // it joined another stream's capture by waiting on its event
};

// Returns true when the new buffer was corrupted by the blocked stream's late write.
bool run_case(const char* name, unsigned int blocked_flags, bool expect_race,
              Leave leave = Leave::stays) {
  const bool destroy_first = leave != Leave::stays;
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
  cudaStream_t origin = nullptr;
  cudaEvent_t forked = nullptr;
  switch (leave) {
    case Leave::stays:
    case Leave::destroyed:
      break;
    case Leave::destroyed_capturing:
    case Leave::freed_in_capture:
      CHECK_CUDA(cudaStreamBeginCapture(blocked, cudaStreamCaptureModeRelaxed));
      if (leave == Leave::freed_in_capture) CHECK_CUDA(cudaFree(first));  // legal when relaxed
      break;
    case Leave::joined_and_destroyed:
      origin = create_stream(cudaStreamNonBlocking);
      CHECK_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
      CHECK_CUDA(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed));
      CHECK_CUDA(cudaEventRecord(forked, origin));
      CHECK_CUDA(cudaStreamWaitEvent(blocked, forked, 0));
      break;
  }
  if (destroy_first) destroy_stream(blocked);  // its queued work still runs
  if (origin != nullptr) {
    // The capture lost a stream it had forked to: CUDA ends it as invalidated.
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(origin, &graph);
    if (graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_MSG(ended == cudaSuccess || ended == cudaErrorStreamCaptureInvalidated ||
                  ended == cudaErrorStreamCaptureUnjoined,
              std::string(name) + ": the capture ended with " + preload_test::error_text(ended));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaEventDestroy(forked));
    destroy_stream(origin);
  }
  // The program is done with it; the stream is not.
  if (leave != Leave::freed_in_capture) CHECK_CUDA(cudaFree(first));

  // New buffers, written on another stream, until the freed one comes back (at once without
  // fences). The destroyed-stream cases take enough that the pool has to miss and consult the
  // fences (each runs in a process of its own, on an empty pool: free slices an earlier case
  // left would serve them all).
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
      // A free a little later closes the batch the freed buffer waits in, whose fence a later
      // miss then finds passed, unless it waits for the blocked stream.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      void* scratch = nullptr;
      CHECK_CUDA(cudaMalloc(&scratch, 4096));
      CHECK_CUDA(cudaFree(scratch));
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
  // The arguments, also as one argument of words joined by commas (how a child gets them):
  // "expect-race", "driver-streams", "driver-streams-v1", and a child's "leave=N".
  bool expect_race = false;
  int leave = -1;
  std::string flags;
  for (int i = 1; i < argc; ++i) {
    std::string words = argv[i];
    for (std::size_t start = 0; start <= words.size();) {
      const std::size_t end = std::min(words.find(',', start), words.size());
      const std::string word = words.substr(start, end - start);
      start = end + 1;
      if (word.rfind("leave=", 0) == 0) {
        leave = std::stoi(word.substr(6));
        continue;
      }
      expect_race |= word == "expect-race";
      driver_streams |= word == "driver-streams";
      destroy_v1 |= word == "driver-streams-v1";
      if (!word.empty()) flags += "," + word;
    }
  }
  CHECK_CUDA(cudaFree(nullptr));
  const char* const kLeaveNames[] = {
      "", "destroyed non-blocking stream", "non-blocking stream destroyed while capturing",
      "non-blocking stream freed in its capture, then destroyed",
      "non-blocking stream that joined a capture, destroyed"};
  if (leave > 0) {
    run_case(kLeaveNames[leave], cudaStreamNonBlocking, expect_race, static_cast<Leave>(leave));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::printf("case done\n");
    return 0;
  }
  for (const Leave way : {Leave::destroyed, Leave::destroyed_capturing, Leave::freed_in_capture,
                          Leave::joined_and_destroyed}) {
    const std::string argument = "leave=" + std::to_string(static_cast<int>(way)) + flags;
    const preload_test::ChildResult child = preload_test::run_self(argument.c_str(), {}, 60);
    std::printf("%s", child.output.c_str());
    CHECK_MSG(child.status == 0 && child.output.find("case done") != std::string::npos,
              std::string(kLeaveNames[static_cast<int>(way)]) + ": " + child.output);
  }
  run_case("non-blocking stream", cudaStreamNonBlocking, expect_race);
  run_case("blocking stream", cudaStreamDefault, expect_race);
  idle_streams_case(expect_race);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("ok\n");
  return 0;
}
