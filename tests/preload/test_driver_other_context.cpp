// Preload test: a driver-only program on two devices frees device 0's pooled memory with
// cuMemFree while a context it made on device 1 is current, and device 1's primary context was
// never used. The driver frees by address (unified addressing), so plain CUDA frees them; the
// pools must take their own memory back, whichever context is current, rather than leave the
// driver to free a pooled page under them (a page the pools still count, and would hand out
// again) or refuse a free the driver would accept. Afterwards nothing is in use in the exit
// report, and a double free under that context is refused. Runs on a GPU too.
#include <cuda.h>

#include <cstring>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  int devices = 0;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGetCount(&devices));
  if (devices < 2) preload_test::skip("needs two devices");
  preload_test::ExitReport report = preload_test::run_with_exit_report("child");
  CHECK_MSG(preload_test::sum_of(report.json, "bytes_in_use") == 0,
            "the pools still count memory in use:\n" + report.json);
  CHECK(report.forwarded_mallocs == 0);
  std::printf("ok\n");
  return 0;
}
