// Preload test: a program linked with -lcuda only (no CUDA runtime in the process) calling
// cuMemAlloc_v2 and friends directly.
//  - In the device's primary context, allocations are pooled: the exit report shows exactly the
//    pooled reservations this program made, a handful of page allocations and nothing passed
//    through; data round-trips; a double free is refused with CUDA_ERROR_INVALID_VALUE.
//  - In a context made with cuCtxCreate, allocations are the driver's (not one more pooled
//    reservation), and a thread with no current context gets the driver's own answer.
//  - The last cuDevicePrimaryCtxRelease and cuDevicePrimaryCtxReset of the primary context
//    destroy the context's memory: the pools forget theirs, so later allocations are valid memory
//    (a stale pool would hand out freed addresses, which the stand-in refuses to copy to).
//  - cuCtxDestroy of the primary context (of either version) is refused by the driver
//    (CUDA_ERROR_INVALID_CONTEXT) and destroys nothing: the pools keep their memory, so an
//    allocation made before it keeps its bytes and its free is the pools' (a pool that forgot it
//    would pass an address inside its page to the driver, which refuses it), and the memory
//    figures do not move. That runs in a child of its own, first without the library: what
//    the device does after a refused destroy is the driver's business (without the library an
//    H200 goes on allocating), and with the library the child must get as far as the plain one.
//  - cuDevicePrimaryCtxReset of a device that does not exist, and one before cuInit, get the
//    driver's answer, and no pools are made for them.
// Runs on a GPU too (no stand-in check).
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "exit_report.h"

namespace {

#define CHECK_CU(expr)                                                         \
  do {                                                                         \
    const CUresult result_ = (expr);                                           \
    CHECK_MSG(result_ == CUDA_SUCCESS, "returned " + std::to_string(result_)); \
  } while (0)

// The pooled allocations the child makes after its last reset; the report counts exactly these.
constexpr int kPooled = 200 + 1;

CUcontext retain_and_bind() {
  CUcontext primary = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&primary, 0));
  CHECK_CU(cuCtxSetCurrent(primary));
  return primary;
}

// 200 allocate/write/read/free rounds of 64 KiB; `when` names the step in a failure.
void churn(const char* when) {
  std::printf("churn %s\n", when);
  std::fflush(stdout);
  std::vector<unsigned char> data(64 << 10), back(64 << 10);
  for (int i = 0; i < 200; ++i) {
    std::memset(data.data(), i & 0xff, data.size());
    CUdeviceptr d = 0;
    CHECK_CU(cuMemAlloc_v2(&d, data.size()));
    CHECK_CU(cuMemcpyHtoD_v2(d, data.data(), data.size()));
    CHECK_CU(cuMemcpyDtoH_v2(back.data(), d, back.size()));
    CHECK(back == data);
    CHECK_CU(cuMemFree_v2(d));
  }
}

// A cuCtxDestroy of the primary context, refused: a 64 KiB slice allocated before it (not at
// its page's start) is still the pools', with its bytes, and nothing went back to the driver.
void refused_destroy(CUresult (*destroy)(CUcontext), CUcontext primary) {
  CUdeviceptr kept = 0;
  CUdeviceptr first = 0;
  CHECK_CU(cuMemAlloc_v2(&first, 64 << 10));
  CHECK_CU(cuMemAlloc_v2(&kept, 64 << 10));
  CHECK_CU(cuMemsetD8_v2(kept, 0x5C, 64 << 10));
  CHECK_CU(cuCtxSynchronize());
  std::size_t free_before = 0, total = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_before, &total));
  CHECK(destroy(primary) == CUDA_ERROR_INVALID_CONTEXT);
  CUcontext current = nullptr;
  CHECK_CU(cuCtxGetCurrent(&current));
  CHECK(current == primary);
  std::size_t free_after = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_after, &total));
  CHECK_MSG(free_after == free_before, "the memory figures moved: " +
                                           std::to_string(free_before) + " before, " +
                                           std::to_string(free_after) + " after");
  std::vector<unsigned char> back(64 << 10);
  CHECK_CU(cuMemcpyDtoH_v2(back.data(), kept, back.size()));
  CHECK(back == std::vector<unsigned char>(64 << 10, 0x5C));
  CHECK_MSG(cuMemFree_v2(kept) == CUDA_SUCCESS, "the pools forgot a live allocation");
  CHECK_MSG(cuMemFree_v2(first) == CUDA_SUCCESS, "the pools forgot a live allocation");
}

// Destroying the primary context is refused, also through the CUDA 2.0 entry point (found by
// its plain name); the device allocates afterwards.
int destroy_child() {
  CHECK_CU(cuInit(0));
  const CUcontext primary = retain_and_bind();
  churn("first");
  using CtxDestroyFn = CUresult (*)(CUcontext);
  const auto destroy_v1 = reinterpret_cast<CtxDestroyFn>(::dlsym(RTLD_DEFAULT, "cuCtxDestroy"));
  CHECK(destroy_v1 != nullptr);
  refused_destroy(destroy_v1, primary);
  refused_destroy(&cuCtxDestroy_v2, primary);
  std::printf("destroys refused\n");
  churn("after the refused destroys");
  std::printf("destroy child ok\n");
  return 0;
}

int child() {
  // Before cuInit the driver refuses a reset, and the library makes no pools for it (it cannot
  // tell which devices exist yet).
  CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK_CU(cuInit(0));
  CUcontext primary = retain_and_bind();
  churn("first");
  // The last release resets the primary context: its memory is gone.
  CHECK_CU(cuDevicePrimaryCtxRelease_v2(0));
  primary = retain_and_bind();
  churn("after the last release");
  CHECK_CU(cuDevicePrimaryCtxReset_v2(0));
  // The reset destroyed the context the old handle names (an H200 then answers 709, context
  // destroyed, to an allocation in it): a program retains the primary context anew.
  primary = retain_and_bind();
  // The exit report counts from the last reset on: these 200 and what follows.
  churn("after the reset");

  // A context of the program's own: not pooled.
  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, 0));
  std::vector<CUdeviceptr> theirs(10);
  for (CUdeviceptr& d : theirs) CHECK_CU(cuMemAlloc_v2(&d, 4096));
  for (CUdeviceptr d : theirs) CHECK_CU(cuMemFree_v2(d));
  CHECK_CU(cuCtxDestroy_v2(own));
  CHECK_CU(cuCtxSetCurrent(primary));

  // No current context: the driver's answer, no guessed device.
  std::thread([] {
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc_v2(&d, 4096) == CUDA_ERROR_INVALID_CONTEXT);
  }).join();

  CUdeviceptr twice = 0;
  CHECK_CU(cuMemAlloc_v2(&twice, 1000));
  CHECK_CU(cuMemFree_v2(twice));
  CHECK(cuMemFree_v2(twice) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuCtxSynchronize());

  // A reset of a device that does not exist (the first number past the last device): the
  // driver's answer, and no pools made for it (their making logged that its memory size could not
  // be read).
  int count = 0;
  CHECK_CU(cuDeviceGetCount(&count));
  CHECK(cuDevicePrimaryCtxReset_v2(count) == CUDA_ERROR_INVALID_DEVICE);
  std::printf("child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  if (argc > 1 && std::string(argv[1]) == "destroy") return destroy_child();
  Dl_info info{};
  void* hook = ::dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  CHECK_MSG(hook != nullptr && ::dladdr(hook, &info) != 0 &&
                std::strstr(info.dli_fname, "poolcuda") != nullptr,
            "cuMemAlloc_v2 does not come from libpoolcuda.so; set LD_PRELOAD");
  preload_test::ExitReport report = preload_test::run_with_exit_report("child");
  CHECK_MSG(report.child.output.find("cannot read its memory size") == std::string::npos,
            report.child.output);
  CHECK(report.reservations == kPooled);
  CHECK(report.device_allocs <= 10);
  CHECK(report.forwarded_mallocs == 0);

  // The refused destroys: with the library, as far as without it (all the way on the stand-in).
  const preload_test::ChildResult plain =
      preload_test::run_self("destroy", {"LD_PRELOAD=" + preload_test::preload_without_library()});
  const preload_test::ChildResult pooled = preload_test::run_self("destroy", {});
  std::printf("without the library:\n%s", plain.output.c_str());
  if (preload_test::on_stand_in()) CHECK_MSG(plain.status == 0, plain.output);
  for (const char* step : {"destroys refused\n", "destroy child ok\n"}) {
    if (plain.output.find(step) == std::string::npos) break;
    CHECK_MSG(pooled.output.find(step) != std::string::npos,
              std::string("with the library the child did not get to \"") + step + "\": " +
                  pooled.output);
  }
  std::printf("ok\n");
  return 0;
}
