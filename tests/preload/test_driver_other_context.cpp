// Preload test: a driver-only program on two devices frees device 0's pooled memory with
// cuMemFree while a context it made on device 1 is current, and device 1's primary context was
// never used. The driver frees by address (unified addressing), so plain CUDA frees them; the
// pools must take their own memory back, whichever context is current, rather than leave the
// driver to free a pooled page under them (a page the pools still count, and would hand out
// again) or refuse a free the driver would accept. Afterwards nothing is in use in the exit
// report, and a double free under that context is refused. And a cuMemFreeAsync under such a
// context, on a stream of device 1's primary context that still writes the memory, keeps the
// memory from a new owner until the stream has passed the free. Runs on a GPU too.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "exit_report.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

int child() {
  CHECK_CU(cuInit(0));
  CUcontext primary = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&primary, 0));
  CHECK_CU(cuCtxSetCurrent(primary));
  CUdeviceptr small = 0, page = 0;
  CHECK_CU(cuMemAlloc_v2(&small, 1000));     // a slice of a shared page
  CHECK_CU(cuMemAlloc_v2(&page, 8u << 20));  // a page of its own

  CUcontext other = nullptr;
  CHECK_CU(cuCtxCreate(&other, nullptr, 0, 1));
  CHECK_CU(cuMemFree_v2(small));
  CHECK_CU(cuMemFree_v2(page));
  CHECK(cuMemFree_v2(small) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuCtxDestroy_v2(other));

  // The pools hand the memory out again, and it holds data.
  CHECK_CU(cuCtxSetCurrent(primary));
  std::vector<unsigned char> data(8u << 20, 0x5a), back(8u << 20, 0);
  CUdeviceptr again = 0;
  CHECK_CU(cuMemAlloc_v2(&again, data.size()));
  CHECK_CU(cuMemcpyHtoD_v2(again, data.data(), data.size()));
  CHECK_CU(cuMemcpyDtoH_v2(back.data(), again, back.size()));
  CHECK(back == data);
  CHECK_CU(cuMemFree_v2(again));
  std::printf("child ok\n");
  return 0;
}

void CUDA_CB wait_for_gate(void* gate) {
  while (!static_cast<std::atomic<bool>*>(gate)->load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A stream-ordered free made under a context of cuCtxCreate, on a stream made in device 1's
// primary context, of device 0's memory that the stream still writes (behind a host function
// that returns 50 ms later): the pools must not hand the memory out before the stream has passed
// the free. On a 3 MiB stand-in device the next allocation needs that memory.
int ordered_child() {
  constexpr std::size_t kSize = 1u << 20;
  CHECK_CU(cuInit(0));
  CUcontext primary[2] = {};
  for (int device = 0; device < 2; ++device)
    CHECK_CU(cuDevicePrimaryCtxRetain(&primary[device], device));
  CHECK_CU(cuCtxSetCurrent(primary[1]));
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK_CU(cuCtxSetCurrent(primary[0]));
  CUdeviceptr filler = 0;  // on a 3 MiB device, the new buffer must take the old one's place
  CUdeviceptr old_buffer = 0;
  CHECK_CU(cuMemAlloc_v2(&filler, kSize));
  CHECK_CU(cuMemAlloc_v2(&old_buffer, kSize));
  std::atomic<bool> gate{false};
  CHECK_CU(cuLaunchHostFunc(stream, &wait_for_gate, &gate));
  const std::vector<unsigned char> old_bytes(kSize, 0xaa), new_bytes(kSize, 0x55);
  CHECK_CU(cuMemcpyHtoDAsync_v2(old_buffer, old_bytes.data(), kSize, stream));
  CUcontext other = nullptr;
  CHECK_CU(cuCtxCreate(&other, nullptr, 0, 1));
  CHECK_CU(cuMemFreeAsync(old_buffer, stream));
  CHECK_CU(cuCtxSetCurrent(primary[0]));
  CHECK_CU(cuCtxSynchronize());  // device 0's own work is done; the stream is device 1's
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.store(true);
  });
  CUdeviceptr buffer = 0;
  CHECK_CU(cuMemAlloc_v2(&buffer, kSize));
  CHECK_CU(cuMemcpyHtoD_v2(buffer, new_bytes.data(), kSize));
  opener.join();
  CHECK_CU(cuStreamSynchronize(stream));
  std::vector<unsigned char> back(kSize, 0);
  CHECK_CU(cuMemcpyDtoH_v2(back.data(), buffer, kSize));
  CHECK_MSG(back == new_bytes, "the old owner's write reached the new owner's memory");
  CHECK_CU(cuMemFree_v2(buffer));
  CHECK_CU(cuMemFree_v2(filler));
  CHECK_CU(cuCtxDestroy_v2(other));
  CHECK_CU(cuCtxSetCurrent(primary[1]));
  CHECK_CU(cuStreamDestroy_v2(stream));
  std::printf("child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  if (argc > 1 && std::string(argv[1]) == "ordered") return ordered_child();
  int devices = 0;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGetCount(&devices));
  if (devices < 2) preload_test::skip("needs two devices");
  preload_test::ExitReport report = preload_test::run_with_exit_report("child");
  CHECK_MSG(preload_test::sum_of(report.json, "bytes_in_use") == 0,
            "the pools still count memory in use:\n" + report.json);
  CHECK(report.forwarded_mallocs == 0);
  const preload_test::ChildResult ordered =
      preload_test::run_self("ordered", {"SIMCUDA_DEVICE_MEMORY=3M"});
  CHECK_MSG(ordered.status == 0, ordered.output);
  std::printf("ok\n");
  return 0;
}
