// Preload test: what a program sees around calls the library answers or looks into must be what
// the plain call leaves. Each case runs in two children, without the library and with it, which
// print every answer, the runtime's last-error slot after it, and the outputs the call wrote;
// the two must print the same.
//  - stream-calls: driver calls on a destroyed stream handle (cuStreamDestroy, its _v2,
//    cuStreamBeginCapture_v2, cuStreamEndCapture) answer CUDA_ERROR_INVALID_HANDLE; the driver
//    keeps no last error, so the runtime's slot stays clean, and an error of the program's
//    waiting there stays (the library's capture queries are runtime calls, and left theirs).
//    A destroyed handle is undefined to a real driver: when the plain child does not survive
//    it, the case is skipped.
//  - address-range: cuMemGetAddressRange of freed managed memory whose slab lives on is refused
//    (CUDA_ERROR_NOT_FOUND, as for any freed memory) and leaves the outputs as they were.
//  - no-device (the stand-in with no device): calls that succeed leave the slot clean, though
//    the library's own queries of the device failed; a refused free leaves its own error there,
//    not theirs.
#include <cuda.h>

#include <string>
#include <vector>

#include "check.h"

namespace {

void report(const char* what, int answer) {
  std::printf("= %s: answer %d, last error %d\n", what, answer,
              static_cast<int>(cudaGetLastError()));
}

void stream_calls() {
  CUstream dead = nullptr;
  CHECK(cuStreamCreate(&dead, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(dead) == CUDA_SUCCESS);
  CUgraph graph = nullptr;
  report("cuStreamDestroy", cuStreamDestroy(dead));
  report("cuStreamDestroy_v2", cuStreamDestroy_v2(dead));
  report("cuStreamBeginCapture_v2",
         cuStreamBeginCapture_v2(dead, CU_STREAM_CAPTURE_MODE_RELAXED));
  report("cuStreamEndCapture", cuStreamEndCapture(dead, &graph));
  void* huge = nullptr;
  const cudaError_t refused = cudaMalloc(&huge, std::size_t{1} << 60);  // the program's error
  const CUresult destroyed = cuStreamDestroy(dead);
  std::printf("= cudaMalloc of 2^60 bytes: answer %d\n", static_cast<int>(refused));
  report("cuStreamDestroy with the program's error waiting", destroyed);
}

void address_range() {
  void* freed = nullptr;
  void* kept = nullptr;
  CHECK(cudaMallocManaged(&freed, 4096) == cudaSuccess);
  CHECK(cudaMallocManaged(&kept, 4096) == cudaSuccess);
  CHECK(cudaFree(freed) == cudaSuccess);
  CUdeviceptr base = 0xAAAA;
  std::size_t size = 0xBBBB;
  const CUresult answer = cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(freed));
  std::printf("= cuMemGetAddressRange of freed managed memory: answer %d, outputs %s\n",
              static_cast<int>(answer),
              answer == CUDA_SUCCESS ? "set"
              : base == 0xAAAA && size == 0xBBBB ? "untouched"
                                                 : "written");
  CHECK(cudaFree(kept) == cudaSuccess);
}

void no_device() {
  void* managed = nullptr;
  report("cudaMallocManaged of 0 bytes", cudaMallocManaged(&managed, 0));
  report("cudaFree(NULL)", cudaFree(nullptr));
  std::size_t free_bytes = 0, total_bytes = 0;
  report("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes));
  report("cudaFree of an address no allocation starts", cudaFree(reinterpret_cast<void*>(0x1000)));
}

int run_case(const std::string& name) {
  if (name != "no-device") CHECK(cudaFree(nullptr) == cudaSuccess);
  if (name == "stream-calls") stream_calls();
  if (name == "address-range") address_range();
  if (name == "no-device") no_device();
  std::printf("case done\n");
  return 0;
}

// The "= " lines of a child's output.
std::string answers(const std::string& output) {
  std::string lines;
  for (std::size_t at = 0; (at = output.find("= ", at)) != std::string::npos;) {
    const std::size_t end = output.find('\n', at);
    lines += output.substr(at, end - at) + "\n";
    at = end;
  }
  return lines;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  const bool stand_in = preload_test::on_stand_in();
  bool skipped = false;
  for (const char* name : {"stream-calls", "address-range", "no-device"}) {
    std::vector<std::string> env;
    if (std::string(name) == "no-device") {
      if (!stand_in) continue;
      env.push_back("SIMCUDA_DEVICES=0");
    }
    std::vector<std::string> plain_env = env;
    plain_env.push_back("LD_PRELOAD=" + preload_test::preload_without_library());
    const preload_test::ChildResult plain = preload_test::run_self(name, plain_env, 60);
    if (!stand_in && plain.status != 0) {
      std::printf("%s: the plain child did not survive (status %d): skipped\n", name,
                  plain.status);
      skipped = true;
      continue;
    }
    CHECK_MSG(plain.status == 0, std::string(name) + " without the library: " + plain.output);
    const preload_test::ChildResult pooled = preload_test::run_self(name, env, 60);
    CHECK_MSG(pooled.status == 0, std::string(name) + " with the library: " + pooled.output);
    CHECK_MSG(answers(pooled.output) == answers(plain.output),
              std::string(name) + ": with the library\n" + answers(pooled.output) +
                  "without it\n" + answers(plain.output));
    std::printf("%s: as without the library\n%s", name, answers(plain.output).c_str());
  }
  if (skipped) preload_test::skip("undefined for this runtime: a destroyed stream handle");
  std::printf("ok\n");
  return 0;
}
