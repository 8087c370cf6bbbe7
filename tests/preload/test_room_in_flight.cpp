// Preload test: an allocation the pools do not serve, refused by the driver while a page the pools
// gave up was still on its way there, is tried again once the page arrived, even when it arrived
// before the library looked for memory to give back (Note [Room that arrived meanwhile] in
// interpose/pooling.cpp). On a 64 MiB stand-in device whose frees take 100 ms and whose
// refusals take 400 ms to return, the program frees a 48 MiB buffer and makes one small
// allocation, whose reservation sends the idle 48 MiB page to the release thread (its pool's
// period is one reservation); then it asks for 32 MiB through cudaMallocAsync, cudaMallocPitch
// and cuMemAllocPitch, each refused while the page is in the driver's free and answered after it
// got there (a round whose page arrived before the call is made again). Plain CUDA serves each:
// its cudaFree had returned the 48 MiB before. On a GPU, where the timings are not forced, the
// same calls must simply succeed.
// With `launch`, `cu_launch`, `module_load`, `library_load` or `lazy_function` (the suite gives
// each kernel, module or library 32 MiB of code, SIMCUDA_CODE_BYTES), the 32 MiB are code: a
// kernel's, loaded at its first launch through the runtime or the driver; a module's, loaded by
// cuModuleLoadData; a library's, loaded by cuLibraryLoadData; or, with lazy loading
// (CUDA_MODULE_LOADING=LAZY, where a module load takes nothing), a module's kernel, loaded by
// cuModuleGetFunction. One round only, since loaded code stays. Stand-in only: a GPU would need
// real device code.
#include <cuda.h>

#include <cstdio>
#include <functional>
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kBig = 48u << 20;
constexpr std::size_t kAsked = 32u << 20;

// Leaves the pools' 48 MiB page on its way to the driver: freed, then released at the next
// reservation, which the returned small buffer holds.
void* send_a_page_to_the_driver() {
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, kBig));
  CHECK_CUDA(cudaFree(big));
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 4096));
  return small;
}

// On the stand-in, whether the 48 MiB are still allocated there: the release thread's free takes
// 100 ms, so only a program thread that lost its CPU that long finds the page back already.
bool page_on_its_way() {
  return !preload_test::on_stand_in() || preload_test::counter("live_bytes") >= kBig;
}

void check_served(const char* what, const std::function<bool(std::function<void()>*)>& allocate) {
  // A round whose page arrived before the call tests nothing: it is made again.
  for (int round = 0; round < 5; ++round) {
    void* small = send_a_page_to_the_driver();
    const bool racing = page_on_its_way();
    std::function<void()> release;
    CHECK_MSG(allocate(&release), std::string(what) + " of 32 MiB failed beside a page on its "
                                                      "way to the driver");
    CHECK_CUDA(cudaGetLastError());  // the refusal before the retry leaves no error behind
    release();
    CHECK_CUDA(cudaFree(small));
    if (racing) return;
  }
  preload_test::skip("in five rounds, the page reached the driver before the call");
}

// `load` needs 32 MiB of code and answers whether the stand-in loaded it: a launch then refuses
// device code it cannot run (cudaErrorNotSupported), a module load succeeds; either is refused
// for lack of memory instead when no room was found.
void check_code_served(const char* what, const std::function<bool()>& load) {
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's code memory");
  void* small = send_a_page_to_the_driver();
  const bool racing = page_on_its_way();
  CHECK_MSG(load(), std::string(what) + " found no room for its code beside a page on its way "
                                        "to the driver");
  CHECK_CUDA(cudaFree(small));
  if (!racing) preload_test::skip("the page reached the driver before the code was loaded");
}

char g_kernel;  // a kernel to the stand-in, whose code loads at its first launch
const unsigned char kImage[16] = {0x7f, 'E', 'L', 'F'};  // a module to the stand-in

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "launch") {
    check_code_served("cudaLaunchKernel", [] {
      const cudaError_t result = cudaLaunchKernel(&g_kernel, dim3(1), dim3(1), nullptr, 0, 0);
      // The retry leaves only its own answer in the last-error slot.
      CHECK_RESULT(cudaGetLastError(), result);
      return result == cudaErrorNotSupported;
    });
    std::printf("a first launch beside a page on its way to the driver: its code loaded\n");
    return 0;
  }
  if (mode == "cu_launch") {
    check_code_served("cuLaunchKernel", [] {
      const CUresult result = cuLaunchKernel(reinterpret_cast<CUfunction>(&g_kernel), 1, 1, 1, 1,
                                             1, 1, 0, nullptr, nullptr, nullptr);
      return result == CUDA_ERROR_NOT_SUPPORTED;
    });
    std::printf("a first driver launch beside a page on its way to the driver: its code loaded\n");
    return 0;
  }
  if (mode == "module_load") {
    check_code_served("cuModuleLoadData", [] {
      CUmodule module = nullptr;
      return cuModuleLoadData(&module, kImage) == CUDA_SUCCESS;
    });
    std::printf("a module load beside a page on its way to the driver: its code loaded\n");
    return 0;
  }
  if (mode == "library_load") {
    check_code_served("cuLibraryLoadData", [] {
      CUlibrary library = nullptr;
      return cuLibraryLoadData(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0) ==
             CUDA_SUCCESS;
    });
    std::printf("a library load beside a page on its way to the driver: its code loaded\n");
    return 0;
  }
  if (mode == "lazy_function") {
    CUmodule module = nullptr;  // lazy: the load itself takes no device memory
    CHECK(cuModuleLoadData(&module, kImage) == CUDA_SUCCESS);
    check_code_served("cuModuleGetFunction", [module] {
      CUfunction function = nullptr;
      return cuModuleGetFunction(&function, module, "kernel") == CUDA_SUCCESS;
    });
    std::printf("a lazy kernel load beside a page on its way to the driver: its code loaded\n");
    return 0;
  }

  check_served("cudaMallocAsync", [](std::function<void()>* release) {
    void* p = nullptr;
    if (cudaMallocAsync(&p, kAsked, cudaStreamLegacy) != cudaSuccess) return false;
    *release = [p] {
      CHECK_CUDA(cudaFreeAsync(p, cudaStreamLegacy));
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    };
    return true;
  });
  check_served("cudaMallocPitch", [](std::function<void()>* release) {
    void* p = nullptr;
    std::size_t pitch = 0;
    if (cudaMallocPitch(&p, &pitch, 4096, kAsked / 4096) != cudaSuccess) return false;
    *release = [p] { CHECK_CUDA(cudaFree(p)); };
    return true;
  });
  check_served("cuMemAllocPitch", [](std::function<void()>* release) {
    CUdeviceptr p = 0;
    std::size_t pitch = 0;
    if (cuMemAllocPitch(&p, &pitch, 4096, kAsked / 4096, 4) != CUDA_SUCCESS) return false;
    *release = [p] { CHECK(cuMemFree(p) == CUDA_SUCCESS); };
    return true;
  });
  std::printf("allocations beside a page on its way to the driver: served\n");
  return 0;
}
