// Preload test: a managed allocation of device 0 freed with cudaFreeAsync on a device-1 stream
// is held until that stream runs past the free (Note [Managed frees on another device's stream]
// in interpose/pooling.cpp); to the program it is freed at once. Each case runs in a child of
// its own, with the device-1 stream parked at a gate while the free is held:
//   reset        cudaDeviceReset of device 0 meanwhile: the held free goes with device 0's
//                memory, and never frees what the reset device hands out later at that address
//                (it used to, once the stream ran: a later allocation overlapped a live one);
//   double-free  a second free of the held allocation is refused as a double free, as for
//                pooled memory (it used to be taken, and the held free then freed the next
//                allocation at that address);
//   queries      once the stream has run, the pointer answers as freed memory: unregistered to
//                cudaPointerGetAttributes, CUDA_ERROR_NOT_FOUND from cuMemGetAddressRange,
//                refused by cudaMemAdvise (they answered as for a live allocation until the
//                next free or memory query).
#include <cuda.h>

#include <cstring>
#include <string>

#include "check.h"

namespace {

using preload_test::Gate;

constexpr std::size_t kSize = 1000;

// Frees a new device-0 managed allocation on a device-1 stream parked at `gate`; device 0 is
// current on return.
void* free_on_parked_stream(cudaStream_t device1_stream, Gate& gate) {
  CHECK_CUDA(cudaSetDevice(0));
  void* freed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&freed, kSize));
  CHECK_CUDA(cudaSetDevice(1));
  preload_test::park(device1_stream, gate);
  CHECK_CUDA(cudaFreeAsync(freed, device1_stream));
  CHECK_CUDA(cudaSetDevice(0));
  return freed;
}

void run_stream_past(cudaStream_t device1_stream, Gate& gate) {
  gate.open.store(true);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamSynchronize(device1_stream));
  CHECK_CUDA(cudaSetDevice(0));
}

// Managed allocations of device 0, each written with `byte`, until one overlaps `keep` or
// `tries` were made; returns whether `keep` kept its byte `kept`.
bool allocations_leave_alone(const unsigned char* keep, unsigned char kept, int tries) {
  for (int i = 0; i < tries; ++i) {
    unsigned char* other = nullptr;
    CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&other), kSize));
    std::memset(other, 0x17, kSize);
    const bool overlaps = other < keep + kSize && keep < other + kSize;
    CHECK_CUDA(cudaFree(other));
    if (overlaps || keep[0] != kept) return false;
  }
  return true;
}

void reset_case(cudaStream_t device1_stream) {
  Gate gate;
  void* freed = free_on_parked_stream(device1_stream, gate);
  CHECK_CUDA(cudaDeviceReset());
  unsigned char* fresh = nullptr;
  CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&fresh), kSize));
  std::memset(fresh, 0x42, kSize);
  std::printf("new allocation at the freed address: %s\n", fresh == freed ? "yes" : "no");
  run_stream_past(device1_stream, gate);
  CHECK_MSG(allocations_leave_alone(fresh, 0x42, 64),
            "after the reset, the held free freed a new allocation at its address");
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, fresh));
  CHECK_MSG(attributes.type == cudaMemoryTypeManaged, "the new allocation is not managed memory");
  CHECK_CUDA(cudaFree(fresh));
}

void double_free_case(cudaStream_t device1_stream) {
  Gate gate;
  void* freed = free_on_parked_stream(device1_stream, gate);
  CHECK_MSG(cudaFree(freed) == cudaErrorInvalidValue,
            "a second free of the held allocation was taken");
  CHECK_MSG(cudaGetLastError() == cudaErrorInvalidValue, "the refusal left no error");
  run_stream_past(device1_stream, gate);
  unsigned char* fresh = nullptr;
  CHECK_CUDA(cudaMallocManaged(reinterpret_cast<void**>(&fresh), kSize));
  std::memset(fresh, 0x42, kSize);
  CHECK_MSG(allocations_leave_alone(fresh, 0x42, 64), "a new allocation was freed behind its back");
  CHECK_CUDA(cudaFree(fresh));
}

void queries_case(cudaStream_t device1_stream) {
  Gate gate;
  void* freed = free_on_parked_stream(device1_stream, gate);
  run_stream_past(device1_stream, gate);
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, freed));
  CHECK_MSG(attributes.type == cudaMemoryTypeUnregistered,
            "cudaPointerGetAttributes: the freed allocation is still type " +
                std::to_string(attributes.type));
  CUdeviceptr base = 0;
  std::size_t size = 0;
  CHECK_MSG(cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(freed)) ==
                CUDA_ERROR_NOT_FOUND,
            "cuMemGetAddressRange found the freed allocation");
  cudaMemLocation location{};
  location.type = cudaMemLocationTypeDevice;
  location.id = 0;
  CHECK_MSG(cudaMemAdvise(freed, kSize, cudaMemAdviseSetReadMostly, location) ==
                cudaErrorInvalidValue,
            "cudaMemAdvise took the freed allocation");
  cudaGetLastError();
}

int run_case(const std::string& name) {
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) preload_test::skip("needs two devices");
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t device1_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&device1_stream, cudaStreamNonBlocking));
  if (name == "reset") reset_case(device1_stream);
  if (name == "double-free") double_free_case(device1_stream);
  if (name == "queries") queries_case(device1_stream);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamDestroy(device1_stream));
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) preload_test::skip("needs two devices");
  preload_test::run_cases_in_children({"reset", "double-free", "queries"});
  std::printf("ok\n");
  return 0;
}
