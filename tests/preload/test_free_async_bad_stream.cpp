// Preload test: a stream-ordered free of pooled memory on a stream handle CUDA does not know
// (never created, or destroyed) fails as the plain call does and frees nothing (Note [Stream
// handles] in interpose/hooks.cpp). Afterwards the memory is still the program's: it keeps its
// bytes, the next allocations of its size get other memory, and freeing it the right way
// succeeds. Covers a slice of a shared page, a page of its own, a managed allocation, and
// cuMemFreeAsync.
//
// Each case runs in two children, without the library and with it, which print what the free
// answered and the last error. The stand-in refuses such a handle (cudaErrorInvalidResourceHandle,
// left in the last-error slot; CUDA_ERROR_INVALID_HANDLE through the driver). To a real runtime
// the handle is undefined behaviour: a case whose plain child does not survive it is skipped;
// one it survives must end the same way with the library.

#include <cuda.h>

#include <string>
#include <vector>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

// Still the program's after the refused free: its bytes are intact, and allocations of its size
// made now, written all over, neither alias it nor change it.
void still_owned(void* ptr, std::size_t size, unsigned char byte) {
  CHECK_MSG(preload_test::device_bytes_equal(ptr, size, byte), "a refused free lost the bytes");
  std::vector<void*> others;
  for (int i = 0; i < 8; ++i) {
    void* other = nullptr;
    CHECK_CUDA(cudaMalloc(&other, size));
    CHECK_MSG(other != ptr, "a refused free handed the memory out again");
    CHECK_CUDA(cudaMemset(other, 0x5A, size));
    others.push_back(other);
  }
  CHECK_MSG(preload_test::device_bytes_equal(ptr, size, byte), "another allocation overwrote it");
  for (void* other : others) CHECK_CUDA(cudaFree(other));
}

// What the free answered, as a line both children print.
void answered(int result, int last) {
  std::printf("answer %d, last error %d\n", result, last);
}

cudaStream_t bad_stream(const std::string& kind) {
  if (kind == "never") return reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234});
  cudaStream_t destroyed = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&destroyed, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamDestroy(destroyed));
  return destroyed;
}

void through_runtime(cudaStream_t bad, std::size_t size, unsigned char byte) {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, size));
  CHECK_CUDA(cudaMemset(ptr, byte, size));
  const cudaError_t result = cudaFreeAsync(ptr, bad);
  answered(result, cudaGetLastError());
  if (result == cudaSuccess) return;
  still_owned(ptr, size, byte);
  CHECK_CUDA(cudaFree(ptr));
}

// Managed memory: still readable from the host after a refusal.
void managed(cudaStream_t bad) {
  void* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&managed, 4096));
  std::memset(managed, 0x3C, 4096);
  const cudaError_t result = cudaFreeAsync(managed, bad);
  answered(result, cudaGetLastError());
  if (result == cudaSuccess) return;
  CHECK(static_cast<unsigned char*>(managed)[4095] == 0x3C);
  void* next_managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&next_managed, 4096));
  CHECK_MSG(next_managed != managed, "a refused free handed managed memory out again");
  CHECK_CUDA(cudaFree(next_managed));
  CHECK_CUDA(cudaFree(managed));
}

// The driver: cuMemFree succeeds after a refusal.
void through_driver(cudaStream_t bad) {
  CUdeviceptr dptr = 0;
  CHECK_CU(cuMemAlloc_v2(&dptr, 4096));
  CHECK_CU(cuMemsetD8_v2(dptr, 0xEF, 4096));
  const CUresult result = cuMemFreeAsync(dptr, reinterpret_cast<CUstream>(bad));
  answered(result, 0);
  if (result == CUDA_SUCCESS) return;
  still_owned(reinterpret_cast<void*>(dptr), 4096, 0xEF);
  CHECK_CU(cuMemFree_v2(dptr));
}

// One case, "WHAT-KIND": WHAT is slice, page, managed or driver, KIND never or destroyed.
int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  const std::string what = name.substr(0, name.find('-'));
  const cudaStream_t bad = bad_stream(name.substr(name.find('-') + 1));
  if (what == "slice") through_runtime(bad, 4096, 0xAB);  // a slice of a shared page
  if (what == "page") through_runtime(bad, 3 << 20, 0xCD);  // a page of its own
  if (what == "managed") managed(bad);
  if (what == "driver") through_driver(bad);
  std::printf("case done\n");
  return 0;
}

// The "answer" line of a child's output.
std::string answer_of(const std::string& output) {
  const std::size_t at = output.find("answer ");
  if (at == std::string::npos) return "";
  return output.substr(at, output.find('\n', at) - at);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  const bool stand_in = preload_test::on_stand_in();
  int skipped = 0;
  for (const char* name : {"slice-never", "page-never", "slice-destroyed", "page-destroyed",
                           "managed-never", "driver-never"}) {
    const preload_test::ChildResult plain = preload_test::run_self(name, {"LD_PRELOAD"}, 60);
    if (!stand_in && plain.status != 0) {
      std::printf("%s: without the library the free does not survive the handle (status %d): "
                  "skipped\n", name, plain.status);
      ++skipped;
      continue;
    }
    CHECK_MSG(plain.status == 0, std::string(name) + " without the library: " + plain.output);
    const preload_test::ChildResult pooled = preload_test::run_self(name, {}, 60);
    CHECK_MSG(pooled.status == 0, std::string(name) + " with the library: " + pooled.output);
    const std::string expected = answer_of(plain.output);
    CHECK_MSG(answer_of(pooled.output) == expected,
              std::string(name) + ": " + answer_of(pooled.output) + " with the library, " +
                  expected + " without");
    if (stand_in) {
      const bool driver = std::string(name).starts_with("driver");
      const int refused = driver ? static_cast<int>(CUDA_ERROR_INVALID_HANDLE)
                                 : static_cast<int>(cudaErrorInvalidResourceHandle);
      CHECK_MSG(expected == "answer " + std::to_string(refused) + ", last error " +
                                std::to_string(driver ? 0 : refused),
                std::string(name) + ": the stand-in answered " + expected);
    }
    std::printf("%s: %s, as without the library\n", name, expected.c_str());
  }
  if (skipped > 0) preload_test::skip("undefined for this runtime: a made-up stream handle");
  std::printf("ok\n");
  return 0;
}
