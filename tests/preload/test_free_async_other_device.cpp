// Preload test: cudaFreeAsync of device-0 memory on a stream of device 1 (a device-1 stream
// wrote it through peer access and frees it where it used it). The free is ordered only on that
// stream, so the pools must not hand the memory out again before the device-1 stream has run
// past the free, although none of device 0's streams waits for it (Note [Frees on another
// device's stream] in interpose/cuda_device.cpp). The device-1 stream is held behind a gate
// while device-0 buffers are allocated and written; once it runs, its late write must find no
// new owner: every new buffer keeps its bytes and the stand-in's race detector counts nothing.
// With the argument "expect-race" (run under free_fence:none) the memory is reused at once and
// the late write is caught, which proves each case can fail.
//
// Cases: a non-blocking device-1 stream freed with device 1 current and with device 0 current,
// and device 1's legacy and per-thread default streams (which name device 1's streams only
// while device 1 is current). And managed memory of device 0, which a device-1 stream reaches
// without peer access (Note [Managed frees on another device's stream] in interpose/pooling.cpp).
// And a capture open on device 1 does not keep device 0's managed frees from going back (Note
// [Managed frees during a capture]): more than the device is allocated and freed meanwhile.
// Device 1's fence holds with a relaxed capture open on device 1, and with more frees waiting on
// the device-1 stream than the pools fence on streams of their own.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"

namespace {

using preload_test::Gate;
using preload_test::wait_at_gate;

constexpr std::size_t kSize = 1 << 20;
constexpr int kMaxAllocations = 32;

// What else happens around the free: `waiting_frees` other frees on the device-1 stream before
// it (more than the pools fence on a stream of their own); a relaxed capture open on another
// device-1 stream from before the free until the late write may run.
struct Around {
  int waiting_frees = 0;
  bool capture_on_device1 = false;
};

// Returns true when a new device-0 buffer was corrupted by the device-1 stream's late write.
bool run_case(const char* name, cudaStream_t device1_stream, int current_at_free,
              bool expect_race, Around around = {}) {
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t device0_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&device0_stream, cudaStreamNonBlocking));
  void* freed = nullptr;
  CHECK_CUDA(cudaMalloc(&freed, kSize));
  CHECK_CUDA(cudaMemset(freed, 0, kSize));
  std::vector<void*> others(around.waiting_frees);
  for (void*& other : others) CHECK_CUDA(cudaMalloc(&other, 4096));
  const std::uint64_t races_before = preload_test::counter("races");

  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t capturing = nullptr;
  if (around.capture_on_device1) {
    CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  }
  Gate gate;
  CHECK_CUDA(cudaLaunchHostFunc(device1_stream, wait_at_gate, &gate));
  CHECK_CUDA(cudaMemsetAsync(freed, 0xaa, kSize, device1_stream));  // held behind the gate
  for (void* other : others) CHECK_CUDA(cudaFreeAsync(other, device1_stream));
  CHECK_CUDA(cudaSetDevice(current_at_free));
  CHECK_CUDA(cudaFreeAsync(freed, device1_stream));

  CHECK_CUDA(cudaSetDevice(0));
  std::vector<void*> taken;
  bool reused = false;
  for (int i = 0; i < kMaxAllocations && !reused; ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, kSize));
    CHECK_CUDA(cudaMemsetAsync(buffer, 0xbb, kSize, device0_stream));
    CHECK_CUDA(cudaStreamSynchronize(device0_stream));
    taken.push_back(buffer);
    reused = buffer == freed;
  }
  if (capturing != nullptr) {
    CHECK_CUDA(cudaSetDevice(1));
    cudaGraph_t graph = nullptr;
    CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
    if (graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamDestroy(capturing));
  }
  gate.open.store(true);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceSynchronize());
  bool corrupted = false;
  for (void* buffer : taken) corrupted |= !preload_test::device_bytes_equal(buffer, kSize, 0xbb);
  const std::uint64_t races = preload_test::counter("races") - races_before;
  std::printf("%s: %zu allocations, reused %d, corrupted %d, races %llu\n", name, taken.size(),
              reused, corrupted, static_cast<unsigned long long>(races));
  if (!expect_race) {
    CHECK_MSG(!corrupted, std::string(name) + ": a new buffer was overwritten by the late write");
    CHECK_MSG(races == 0, std::string(name) + ": the race detector saw the late write");
  }
  for (void* buffer : taken) CHECK_CUDA(cudaFree(buffer));
  CHECK_CUDA(cudaStreamDestroy(device0_stream));
  return corrupted || races != 0;
}

// Managed memory: a slab rewinds only once nothing in it is live, so the new allocations are
// freed as they come until one gets the freed address back (or none does).
constexpr std::size_t kManagedSize = 4096;
constexpr int kManagedTries = 20000;

bool run_managed_case(cudaStream_t device1_stream, bool expect_race) {
  CHECK_CUDA(cudaSetDevice(0));
  void* freed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&freed, kManagedSize));
  const std::uint64_t races_before = preload_test::counter("races");
  CHECK_CUDA(cudaSetDevice(1));
  Gate gate;
  CHECK_CUDA(cudaLaunchHostFunc(device1_stream, wait_at_gate, &gate));
  CHECK_CUDA(cudaMemsetAsync(freed, 0xaa, kManagedSize, device1_stream));  // behind the gate
  CHECK_CUDA(cudaFreeAsync(freed, device1_stream));
  CHECK_CUDA(cudaSetDevice(0));
  void* reused = nullptr;
  int tries = 0;
  for (; tries < kManagedTries && reused == nullptr; ++tries) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMallocManaged(&buffer, kManagedSize));
    if (buffer == freed) {
      reused = buffer;
      CHECK_CUDA(cudaMemset(reused, 0xbb, kManagedSize));
    } else {
      CHECK_CUDA(cudaFree(buffer));
    }
  }
  gate.open.store(true);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceSynchronize());
  const bool corrupted =
      reused != nullptr && !preload_test::device_bytes_equal(reused, kManagedSize, 0xbb);
  const std::uint64_t races = preload_test::counter("races") - races_before;
  std::printf("managed memory: %d allocations, reused %d, corrupted %d, races %llu\n", tries,
              reused != nullptr, corrupted, static_cast<unsigned long long>(races));
  if (!expect_race) {
    CHECK_MSG(!corrupted, "managed memory: a new allocation was overwritten by the late write");
    CHECK_MSG(races == 0, "managed memory: the race detector saw the late write");
  }
  if (reused != nullptr) CHECK_CUDA(cudaFree(reused));
  return corrupted || races != 0;
}

void managed_frees_beside_another_capture() {
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t capturing = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaSetDevice(0));
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  constexpr std::size_t kRound = 4 << 20;
  for (std::size_t done = 0; done < total + total / 4; done += kRound) {
    void* buffer = nullptr;
    CHECK_MSG(cudaMallocManaged(&buffer, kRound) == cudaSuccess,
              "device 0's managed frees did not go back while device 1 captured, after " +
                  std::to_string(done >> 20) + " MiB");
    CHECK_CUDA(cudaFree(buffer));
  }
  CHECK_CUDA(cudaSetDevice(1));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
  if (graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  CHECK_CUDA(cudaSetDevice(0));
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) preload_test::skip("needs two devices");
  const bool expect_race = argc > 1 && std::string(argv[1]) == "expect-race";
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t device1_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&device1_stream, cudaStreamNonBlocking));
  bool caught = true;
  caught &= run_case("non-blocking stream, device 1 current", device1_stream, 1, expect_race);
  caught &= run_case("non-blocking stream, device 0 current", device1_stream, 0, expect_race);
  caught &= run_case("legacy stream", cudaStreamLegacy, 1, expect_race);
  caught &= run_case("per-thread stream", cudaStreamPerThread, 1, expect_race);
  // No fence of device 0's stands in for the device-1 stream's: a capture open on device 1, and
  // more frees waiting than the pools fence on streams of their own, still fence it.
  caught &= run_case("beside a capture on device 1", device1_stream, 1, expect_race,
                     Around{0, true});
  caught &= run_case("after 300 frees waiting", device1_stream, 1, expect_race, Around{300, false});
  caught &= run_managed_case(device1_stream, expect_race);
  if (!expect_race) managed_frees_beside_another_capture();
  if (expect_race) CHECK_MSG(caught, "a case reused the memory without the late write being seen");
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamDestroy(device1_stream));
  std::printf("ok\n");
  return 0;
}
