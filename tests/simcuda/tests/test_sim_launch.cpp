// Device code, which the stand-in cannot run, is refused with an error and one line on stderr,
// never answered with success: kernel launches through the runtime (the <<<...>>> sequence
// nvcc generates, cudaLaunchKernel) and the driver (cuLaunchKernel). Registering a module (what
// nvcc's start-up code does) is accepted. Every runtime call the stand-in does not implement
// leaves its error as the thread's last error. (The memory launches and module loads take:
// test_sim_code_memory.)
// Stand-in only: on a GPU these calls would need real device code.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda.h>

#include "sim_test.h"

extern "C" {
void** __cudaRegisterFatBinary(void* fatCubin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function,
                            const char* name, int thread_limit, uint3* tid, uint3* bid,
                            dim3* block, dim3* grid, int* warp_size);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_bytes,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_bytes,
                                       void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_bytes, cudaStream_t stream);
}

namespace {

void kernel_stub() {}

// The child scenario: what a program built by nvcc does, on the stand-in.
int launch_child() {
  void** module = __cudaRegisterFatBinary(nullptr);
  __cudaRegisterFunction(module, reinterpret_cast<const char*>(&kernel_stub), nullptr, "kernel",
                         -1, nullptr, nullptr, nullptr, nullptr, nullptr);
  __cudaRegisterFatBinaryEnd(module);
  if (cudaFree(nullptr) != cudaSuccess) return 10;
  // kernel<<<4, 64>>>(): push, then the host stub pops and launches.
  cudaKernel_t handle = nullptr;
  if (__cudaGetKernel(&handle, reinterpret_cast<const void*>(&kernel_stub)) != cudaSuccess)
    return 11;
  if (__cudaPushCallConfiguration(dim3(4), dim3(64), 0, nullptr) != 0) return 12;
  dim3 grid, block;
  size_t shared = 1;
  cudaStream_t stream = nullptr;
  if (__cudaPopCallConfiguration(&grid, &block, &shared, &stream) != cudaSuccess) return 13;
  if (grid.x != 4 || block.x != 64 || shared != 0) return 14;
  if (__cudaLaunchKernel(handle, grid, block, nullptr, shared, stream) != cudaErrorNotSupported)
    return 15;
  if (cudaGetLastError() != cudaErrorNotSupported) return 16;  // what a program checks
  void* args[1] = {nullptr};
  if (cudaLaunchKernel(reinterpret_cast<const void*>(&kernel_stub), dim3(1), dim3(1), args, 0,
                       nullptr) != cudaErrorNotSupported)
    return 17;
  if (cudaPeekAtLastError() != cudaErrorNotSupported) return 18;
  cudaGetLastError();
  // A runtime entry point the stand-in does not implement at all.
  cudaFuncAttributes attributes;
  if (cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(&kernel_stub)) !=
      cudaErrorNotSupported)
    return 19;
  if (cudaGetLastError() != cudaErrorNotSupported) return 20;
  // The driver: a launch (any non-null CUfunction is a function to the stand-in).
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  auto launch = reinterpret_cast<decltype(&cuLaunchKernel)>(dlsym(lib, "cuLaunchKernel"));
  if (!launch) return 21;
  auto function = reinterpret_cast<CUfunction>(&kernel_stub);
  if (launch(function, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) != CUDA_ERROR_NOT_SUPPORTED)
    return 22;
  if (launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) != CUDA_ERROR_INVALID_HANDLE)
    return 23;
  return 0;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("device code is refused with an error and one line each" * STAND_IN_ONLY) {
  int status = 0;
  std::string err = simtest::run_child("launch", {}, &status);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  CHECK_EQ(count(err, "cannot load device code"), 1);  // one module, one line
  CHECK_EQ(count(err, "__cudaLaunchKernel: the CUDA stand-in cannot run device code"), 1);
  CHECK_EQ(count(err, "cudaLaunchKernel: the CUDA stand-in cannot run device code"), 2);
  CHECK_EQ(count(err, "cudaFuncGetAttributes is not supported"), 1);
  CHECK_EQ(count(err, "cuLaunchKernel is not supported"), 1);  // the null function: none
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "launch") return launch_child();
  doctest::Context context(argc, argv);
  return context.run();
}
