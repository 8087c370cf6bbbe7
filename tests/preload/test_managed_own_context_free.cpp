// Preload test: managed memory is valid in every context, so a stream of a context the program
// made with cuCtxCreate, which the library never sees created, may write a slab allocation. A
// stream-ordered free of it on that stream keeps its bytes from every new allocation until the
// stream has run past the free (Note [Frees on streams the library never saw] in
// interpose/cuda_device.cpp). It used to go back to its slab at once: the slab emptied, rewound,
// and handed the bytes out while the parked stream's memset was still to come, which then
// landed in the new owner's buffer. Each case runs in a child of its own:
//   driver   cuMemFreeAsync on the stream, with its context current;
//   runtime  cudaFreeAsync on the stream, from the primary context.
// Run with 1 MiB slabs: sixteen of the 64 KiB allocations fill one, so slabs empty and rewind
// within a few dozen allocations.
#include <cuda.h>

#include <cstring>
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kSize = 64 << 10;
constexpr int kTries = 200;

#define CHECK_CU(call) CHECK_MSG((call) == CUDA_SUCCESS, #call)

// Allocates and frees managed buffers, four live at a time, each filled with 0x44 and checked
// to start zeroed, for `tries` allocations or until one overlaps `freed`; returns whether one
// did.
bool some_allocation_overlaps(const unsigned char* freed, int tries) {
  std::vector<unsigned char*> live;
  bool overlapped = false;
  for (int i = 0; i < tries && !overlapped; ++i) {
    unsigned char* buffer = nullptr;
    CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&buffer), kSize));
    for (std::size_t k = 0; k < kSize; ++k) CHECK_MSG(buffer[k] == 0, "not zeroed");
    std::memset(buffer, 0x44, kSize);
    overlapped = buffer < freed + kSize && freed < buffer + kSize;
    live.push_back(buffer);
    if (live.size() > 4) {
      CHECK_CUDA(cudaFree(live.front()));
      live.erase(live.begin());
    }
  }
  for (unsigned char* buffer : live) CHECK_CUDA(cudaFree(buffer));
  return overlapped;
}

int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  CUcontext primary = nullptr;
  CHECK_CU(cuCtxGetCurrent(&primary));
  CUdevice device = 0;
  CHECK_CU(cuDeviceGet(&device, 0));
  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, device));  // current now
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK_CU(cuCtxSetCurrent(primary));

  unsigned char* freed = nullptr;
  CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&freed), kSize));
  CHECK_CU(cuCtxSetCurrent(own));
  preload_test::Gate gate;
  CHECK_CU(cuLaunchHostFunc(stream, &preload_test::wait_at_gate, &gate));
  CHECK_CU(cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(freed), 0x33, kSize, stream));
  if (name == "driver") {
    CHECK_CU(cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(freed), stream));
    CHECK_CU(cuCtxSetCurrent(primary));
  } else {
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CUDA(cudaFreeAsync(freed, reinterpret_cast<cudaStream_t>(stream)));
  }
  CHECK_MSG(!some_allocation_overlaps(freed, kTries),
            "an allocation took the freed bytes while the stream had yet to run past the free");

  gate.open.store(true);
  CHECK_CU(cuCtxSetCurrent(own));
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK_CU(cuCtxSetCurrent(primary));
  // Passed: the bytes come back.
  CHECK_MSG(some_allocation_overlaps(freed, kTries), "the freed bytes never came back");
  CHECK_CU(cuCtxSetCurrent(own));
  CHECK_CU(cuStreamDestroy(stream));
  CHECK_CU(cuCtxDestroy(own));
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1) return run_case(argv[1]);
  preload_test::run_cases_in_children({"driver", "runtime"});
  std::printf("ok\n");
  return 0;
}
