// The device memory code takes (SIMCUDA_CODE_BYTES; Note [Code memory] in code.cpp): a kernel's
// first launch on a device loads its module, which takes that much of the device (the launch is
// out of memory, and remembers nothing, when the device cannot hold it), before the stand-in
// refuses the launch as device code it cannot run; explicit module and library loads take it
// until unloaded; a device reset gives it all back. Through the runtime's launches (the function
// pointer or cudaKernel_t is the kernel) and the driver's (the CUfunction is). The functions and
// kernels got from loaded code (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction,
// cuFuncLoad) take nothing more when loading is eager (CUDA_MODULE_LOADING unset or EAGER, this
// program); the cases named "lazy: ..." run in a child with CUDA_MODULE_LOADING=LAZY, where loads
// take nothing and each function loads at its first use, and "any mode: ..." in both. Attribute,
// cache and occupancy calls are uses too (cuFuncGetAttribute...: on the current device,
// cuKernelGetAttribute...: on the device named), and a variable (cuModuleGetGlobal,
// cuLibraryGetGlobal) lives in the memory of its code, which its first use loads when lazy.
// Runs with two devices of 1 GiB and 4 MiB a module. Built twice: against libcudart.so.13, and
// (SIMTEST_STATIC_RUNTIME) against the static-runtime archive, whose launches reach the driver's
// cuLaunchKernel through the resolver (Note [Static runtime] in rt_driver.cpp). Stand-in only: a
// GPU would need real kernels.
#define DOCTEST_CONFIG_IMPLEMENT
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "driver_test.h"

extern "C" {
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_bytes, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared_bytes, cudaStream_t stream);
cudaError_t cudaLaunchKernel_ptsz(const void* function, dim3 grid, dim3 block, void** args,
                                  size_t shared_bytes, cudaStream_t stream);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* function,
                                     void** args);
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* function, dim3 grid, dim3 block,
                                             void** args, size_t shared_bytes,
                                             cudaStream_t stream);
}

using simtest::counter;
using simtest::driver;
using simtest::free_bytes;
using simtest::free_on;

namespace {

#ifdef SIMTEST_STATIC_RUNTIME
constexpr bool kStaticRuntime = true;
constexpr const char* kProgram = "test_sim_static_code_memory";
#else
constexpr bool kStaticRuntime = false;
constexpr const char* kProgram = "test_sim_code_memory";
#endif

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kCapacity = size_t{1} << 30;  // SIMCUDA_DEVICE_MEMORY in meson.build
constexpr size_t kCode = 4 * kMiB;              // SIMCUDA_CODE_BYTES in meson.build

// The kernels: to the stand-in each address is a function of its own. Every case takes its own.
char g_kernels[256];
std::atomic<int> g_next_kernel{0};

const void* new_kernel() {
  const int i = g_next_kernel.fetch_add(1);
  REQUIRE(i < static_cast<int>(sizeof g_kernels));
  return &g_kernels[i];
}

CUfunction as_function(const void* kernel) {
  return reinterpret_cast<CUfunction>(const_cast<void*>(kernel));
}

struct Api {
  using Launch = decltype(&cuLaunchKernel);
  using LaunchEx = decltype(&cuLaunchKernelEx);
  using Cooperative = decltype(&cuLaunchCooperativeKernel);
  static constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  Launch launch = driver().get<Launch>("cuLaunchKernel", 4000);
  Launch launch_ptsz = driver().get<Launch>("cuLaunchKernel", 7000, kPerThread);
  LaunchEx launch_ex = driver().get<LaunchEx>("cuLaunchKernelEx", 11060);
  LaunchEx launch_ex_ptsz = driver().get<LaunchEx>("cuLaunchKernelEx", 11060, kPerThread);
  Cooperative cooperative = driver().get<Cooperative>("cuLaunchCooperativeKernel", 9000);
  Cooperative cooperative_ptsz =
      driver().get<Cooperative>("cuLaunchCooperativeKernel", 9000, kPerThread);
  decltype(&cuModuleLoad) module_load = driver().get<decltype(&cuModuleLoad)>("cuModuleLoad", 2000);
  decltype(&cuModuleLoadData) module_load_data =
      driver().get<decltype(&cuModuleLoadData)>("cuModuleLoadData", 2000);
  decltype(&cuModuleLoadDataEx) module_load_data_ex =
      driver().get<decltype(&cuModuleLoadDataEx)>("cuModuleLoadDataEx", 2010);
  decltype(&cuModuleLoadFatBinary) module_load_fat_binary =
      driver().get<decltype(&cuModuleLoadFatBinary)>("cuModuleLoadFatBinary", 2000);
  decltype(&cuModuleUnload) module_unload =
      driver().get<decltype(&cuModuleUnload)>("cuModuleUnload", 2000);
  decltype(&cuLibraryLoadData) library_load_data =
      driver().get<decltype(&cuLibraryLoadData)>("cuLibraryLoadData", 12000);
  decltype(&cuLibraryLoadFromFile) library_load_from_file =
      driver().get<decltype(&cuLibraryLoadFromFile)>("cuLibraryLoadFromFile", 12000);
  decltype(&cuLibraryUnload) library_unload =
      driver().get<decltype(&cuLibraryUnload)>("cuLibraryUnload", 12000);
  decltype(&cuModuleGetFunction) get_function =
      driver().get<decltype(&cuModuleGetFunction)>("cuModuleGetFunction", 2000);
  decltype(&cuLibraryGetKernel) get_kernel =
      driver().get<decltype(&cuLibraryGetKernel)>("cuLibraryGetKernel", 12000);
  decltype(&cuKernelGetFunction) kernel_function =
      driver().get<decltype(&cuKernelGetFunction)>("cuKernelGetFunction", 12000);
  decltype(&cuFuncLoad) func_load = driver().get<decltype(&cuFuncLoad)>("cuFuncLoad", 12040);
  decltype(&cuModuleGetLoadingMode) loading_mode =
      driver().get<decltype(&cuModuleGetLoadingMode)>("cuModuleGetLoadingMode", 11070);
  decltype(&cuFuncGetAttribute) func_get_attribute =
      driver().get<decltype(&cuFuncGetAttribute)>("cuFuncGetAttribute", 2020);
  decltype(&cuFuncSetAttribute) func_set_attribute =
      driver().get<decltype(&cuFuncSetAttribute)>("cuFuncSetAttribute", 9000);
  decltype(&cuFuncSetCacheConfig) func_set_cache_config =
      driver().get<decltype(&cuFuncSetCacheConfig)>("cuFuncSetCacheConfig", 3000);
  decltype(&cuKernelGetAttribute) kernel_get_attribute =
      driver().get<decltype(&cuKernelGetAttribute)>("cuKernelGetAttribute", 12000);
  decltype(&cuKernelSetAttribute) kernel_set_attribute =
      driver().get<decltype(&cuKernelSetAttribute)>("cuKernelSetAttribute", 12000);
  decltype(&cuKernelSetCacheConfig) kernel_set_cache_config =
      driver().get<decltype(&cuKernelSetCacheConfig)>("cuKernelSetCacheConfig", 12000);
  decltype(&cuOccupancyMaxActiveBlocksPerMultiprocessor) active_blocks =
      driver().get<decltype(&cuOccupancyMaxActiveBlocksPerMultiprocessor)>(
          "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050);
  decltype(&cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) active_blocks_flags =
      driver().get<decltype(&cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)>(
          "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000);
  decltype(&cuOccupancyMaxPotentialBlockSize) block_size =
      driver().get<decltype(&cuOccupancyMaxPotentialBlockSize)>("cuOccupancyMaxPotentialBlockSize",
                                                                6050);
  decltype(&cuOccupancyMaxPotentialBlockSizeWithFlags) block_size_flags =
      driver().get<decltype(&cuOccupancyMaxPotentialBlockSizeWithFlags)>(
          "cuOccupancyMaxPotentialBlockSizeWithFlags", 7000);
  decltype(&cuOccupancyAvailableDynamicSMemPerBlock) dynamic_shared =
      driver().get<decltype(&cuOccupancyAvailableDynamicSMemPerBlock)>(
          "cuOccupancyAvailableDynamicSMemPerBlock", 10020);
  decltype(&cuOccupancyMaxPotentialClusterSize) cluster_size =
      driver().get<decltype(&cuOccupancyMaxPotentialClusterSize)>(
          "cuOccupancyMaxPotentialClusterSize", 11070);
  decltype(&cuOccupancyMaxActiveClusters) active_clusters =
      driver().get<decltype(&cuOccupancyMaxActiveClusters)>("cuOccupancyMaxActiveClusters", 11070);
  decltype(&cuModuleGetGlobal_v2) module_global =
      driver().get<decltype(&cuModuleGetGlobal_v2)>("cuModuleGetGlobal", 3020);
  decltype(&cuLibraryGetGlobal) library_global =
      driver().get<decltype(&cuLibraryGetGlobal)>("cuLibraryGetGlobal", 12000);
  decltype(&cuMemcpyHtoD_v2) copy_to =
      driver().get<decltype(&cuMemcpyHtoD_v2)>("cuMemcpyHtoD", 3020);
  decltype(&cuMemcpyDtoH_v2) copy_from =
      driver().get<decltype(&cuMemcpyDtoH_v2)>("cuMemcpyDtoH", 3020);
  decltype(&cuMemGetAddressRange_v2) address_range =
      driver().get<decltype(&cuMemGetAddressRange_v2)>("cuMemGetAddressRange", 3020);
  decltype(&cuDevicePrimaryCtxReset_v2) primary_reset =
      driver().get<decltype(&cuDevicePrimaryCtxReset_v2)>("cuDevicePrimaryCtxReset", 11000);
  decltype(&cuCtxCreate_v4) create = driver().get<decltype(&cuCtxCreate_v4)>("cuCtxCreate", 12050);
  decltype(&cuCtxDestroy_v2) destroy =
      driver().get<decltype(&cuCtxDestroy_v2)>("cuCtxDestroy", 4000);
};

const Api& api() {
  static const Api shared;
  return shared;
}

// Stands for a module image: the stand-in does not read it.
constexpr char kImage[] = "not a cubin";

// Both devices reset (nothing loaded, every byte free); device 0 current.
void fresh() {
  for (int device : {1, 0}) {
    CUDA_OK(cudaSetDevice(device));
    CUDA_OK(cudaDeviceReset());
  }
  CUDA_OK(cudaFree(nullptr));
  CUDA_OK(cudaGetLastError());
  REQUIRE_EQ(free_bytes(), kCapacity);
  REQUIRE_EQ(counter("live_allocations"), 0u);
}

cudaError_t rt_launch(const void* kernel) {
  void* args[1] = {nullptr};
  return cudaLaunchKernel(kernel, dim3(2), dim3(32), args, 0, nullptr);
}

CUresult drv_launch(const void* kernel) {
  return api().launch(as_function(kernel), 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
}

// A runtime launch refused as device code (its module loaded), the error left as the last one.
void refused(cudaError_t result) {
  CHECK_EQ(result, cudaErrorNotSupported);
  CHECK_EQ(cudaGetLastError(), cudaErrorNotSupported);
}

// Fills the current device but `left` bytes; cudaFree the result to give it back.
void* fill_but(size_t left) {
  void* filler = nullptr;
  CUDA_OK(cudaMalloc(&filler, free_bytes() - left));
  REQUIRE_EQ(free_bytes(), left);
  return filler;
}

CUmodule load_module() {
  CUmodule module = nullptr;
  REQUIRE_EQ(api().module_load_data(&module, kImage), CUDA_SUCCESS);
  return module;
}

CUlibrary load_library() {
  CUlibrary library = nullptr;
  REQUIRE_EQ(api().library_load_data(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0),
             CUDA_SUCCESS);
  return library;
}

CUfunction get_function(CUmodule module, const char* name) {
  CUfunction f = nullptr;
  REQUIRE_EQ(api().get_function(&f, module, name), CUDA_SUCCESS);
  REQUIRE(f != nullptr);
  return f;
}

CUkernel get_kernel(CUlibrary library, const char* name) {
  CUkernel k = nullptr;
  REQUIRE_EQ(api().get_kernel(&k, library, name), CUDA_SUCCESS);
  REQUIRE(k != nullptr);
  return k;
}

CUfunction kernel_function(CUkernel kernel) {
  CUfunction f = nullptr;
  REQUIRE_EQ(api().kernel_function(&f, kernel), CUDA_SUCCESS);
  return f;
}

CUresult launch_function(CUfunction f) {
  return api().launch(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
}

CUmoduleLoadingMode loading_mode() {
  CUmoduleLoadingMode mode{};
  REQUIRE_EQ(api().loading_mode(&mode), CUDA_SUCCESS);
  return mode;
}

const auto kUntouchedFunction = reinterpret_cast<CUfunction>(uintptr_t{0x5ca1ab1e});
const auto kUntouchedKernel = reinterpret_cast<CUkernel>(uintptr_t{0x5ca1ab1e});
constexpr CUdeviceptr kUntouchedAddress = 0x5ca1ab1e;

CUkernel as_kernel(const void* kernel) {
  return reinterpret_cast<CUkernel>(const_cast<void*>(kernel));
}

CUfunction as_function(CUkernel kernel) { return reinterpret_cast<CUfunction>(kernel); }

// One block of 32 threads, for the cluster queries.
const CUlaunchConfig* launch_config() {
  static const CUlaunchConfig config = [] {
    CUlaunchConfig c{};
    c.gridDimX = c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = 32;
    c.blockDimY = c.blockDimZ = 1;
    return c;
  }();
  return &config;
}

// The calls that use a function without launching it, on the current context's device (their
// answers are checked on their own).
struct FunctionUse {
  const char* name;
  std::function<CUresult(CUfunction)> call;
};

std::vector<FunctionUse> function_uses() {
  const Api& a = api();
  return {
      {"cuFuncGetAttribute",
       [&a](CUfunction f) {
         int value = 0;
         return a.func_get_attribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, f);
       }},
      {"cuFuncSetAttribute",
       [&a](CUfunction f) {
         return a.func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024);
       }},
      {"cuFuncSetCacheConfig",
       [&a](CUfunction f) { return a.func_set_cache_config(f, CU_FUNC_CACHE_PREFER_L1); }},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessor",
       [&a](CUfunction f) {
         int blocks = 0;
         return a.active_blocks(&blocks, f, 256, 0);
       }},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
       [&a](CUfunction f) {
         int blocks = 0;
         return a.active_blocks_flags(&blocks, f, 256, 0, CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE);
       }},
      {"cuOccupancyMaxPotentialBlockSize",
       [&a](CUfunction f) {
         int grid = 0, block = 0;
         return a.block_size(&grid, &block, f, nullptr, 0, 0);
       }},
      {"cuOccupancyMaxPotentialBlockSizeWithFlags",
       [&a](CUfunction f) {
         int grid = 0, block = 0;
         return a.block_size_flags(&grid, &block, f, nullptr, 0, 0, CU_OCCUPANCY_DEFAULT);
       }},
      {"cuOccupancyAvailableDynamicSMemPerBlock",
       [&a](CUfunction f) {
         size_t bytes = 0;
         return a.dynamic_shared(&bytes, f, 1, 256);
       }},
      {"cuOccupancyMaxPotentialClusterSize",
       [&a](CUfunction f) {
         int size = 0;
         return a.cluster_size(&size, f, launch_config());
       }},
      {"cuOccupancyMaxActiveClusters",
       [&a](CUfunction f) {
         int clusters = 0;
         return a.active_clusters(&clusters, f, launch_config());
       }},
  };
}

// The calls that use a kernel on the device they name.
struct KernelUse {
  const char* name;
  std::function<CUresult(CUkernel, CUdevice)> call;
};

std::vector<KernelUse> kernel_uses() {
  const Api& a = api();
  return {
      {"cuKernelGetAttribute",
       [&a](CUkernel k, CUdevice dev) {
         int value = 0;
         return a.kernel_get_attribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, k, dev);
       }},
      {"cuKernelSetAttribute",
       [&a](CUkernel k, CUdevice dev) {
         return a.kernel_set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024, k,
                                       dev);
       }},
      {"cuKernelSetCacheConfig",
       [&a](CUkernel k, CUdevice dev) {
         return a.kernel_set_cache_config(k, CU_FUNC_CACHE_PREFER_SHARED, dev);
       }},
  };
}

constexpr size_t kVariable = 256;  // every variable's size (Note [Code memory])

CUdeviceptr module_variable(CUmodule module, const char* name) {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  REQUIRE_EQ(api().module_global(&address, &bytes, module, name), CUDA_SUCCESS);
  REQUIRE(address != 0);
  REQUIRE_EQ(bytes, kVariable);
  return address;
}

CUdeviceptr library_variable(CUlibrary library, const char* name) {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  REQUIRE_EQ(api().library_global(&address, &bytes, library, name), CUDA_SUCCESS);
  REQUIRE(address != 0);
  REQUIRE_EQ(bytes, kVariable);
  return address;
}

// The device allocation holding `address`: its base and size.
std::pair<CUdeviceptr, size_t> holder(CUdeviceptr address) {
  CUdeviceptr base = 0;
  size_t size = 0;
  REQUIRE_EQ(api().address_range(&base, &size, address), CUDA_SUCCESS);
  return {base, size};
}

CUresult write_word(CUdeviceptr address, uint64_t value) {
  return api().copy_to(address, &value, sizeof value);
}

uint64_t read_word(CUdeviceptr address) {
  uint64_t value = 0;
  REQUIRE_EQ(api().copy_from(&value, address, sizeof value), CUDA_SUCCESS);
  return value;
}

// The number of "lazy: ..." and "any mode: ..." cases: the lazy child must run them all.
constexpr int kLazyChildCases = 13;

// ---- The child that reports the loading mode --------------------------------------------------
// 1: eager (the mode says so and a load takes SIMCUDA_CODE_BYTES=4M); 2: lazy (it says so and a
// load takes nothing); otherwise the number of the check that failed.
int mode_child() {
  if (cudaFree(nullptr) != cudaSuccess) return 40;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  auto mode_of = reinterpret_cast<decltype(&cuModuleGetLoadingMode)>(
      dlsym(lib, "cuModuleGetLoadingMode"));
  auto load = reinterpret_cast<decltype(&cuModuleLoadData)>(dlsym(lib, "cuModuleLoadData"));
  auto unload = reinterpret_cast<decltype(&cuModuleUnload)>(dlsym(lib, "cuModuleUnload"));
  if (!mode_of || !load || !unload) return 41;
  CUmoduleLoadingMode mode{};
  if (mode_of(&mode) != CUDA_SUCCESS) return 42;
  size_t before = 0, after = 0, total = 0;
  CUmodule module = nullptr;
  if (cudaMemGetInfo(&before, &total) != cudaSuccess) return 43;
  if (load(&module, kImage) != CUDA_SUCCESS) return 44;
  if (cudaMemGetInfo(&after, &total) != cudaSuccess) return 45;
  if (unload(module) != CUDA_SUCCESS) return 46;
  if (mode == CU_MODULE_EAGER_LOADING && before - after == kCode) return 1;
  if (mode == CU_MODULE_LAZY_LOADING && before == after) return 2;
  return 47;
}

// ---- The child with SIMCUDA_CODE_BYTES=0 -------------------------------------------------------
// Returns 0, or the number of the check that failed.
int knob_zero_child() {
  if (cudaFree(nullptr) != cudaSuccess) return 10;
  size_t free0 = 0, total = 0;
  if (cudaMemGetInfo(&free0, &total) != cudaSuccess || free0 != total) return 11;
  static const char kernel = 0;
  void* args[1] = {nullptr};
  for (int i = 0; i < 2; ++i) {
    if (cudaLaunchKernel(&kernel, dim3(1), dim3(1), args, 0, nullptr) != cudaErrorNotSupported)
      return 12;
    if (cudaGetLastError() != cudaErrorNotSupported) return 13;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  auto launch = reinterpret_cast<decltype(&cuLaunchKernel)>(dlsym(lib, "cuLaunchKernel"));
  auto load = reinterpret_cast<decltype(&cuModuleLoadData)>(dlsym(lib, "cuModuleLoadData"));
  auto unload = reinterpret_cast<decltype(&cuModuleUnload)>(dlsym(lib, "cuModuleUnload"));
  if (!launch || !load || !unload) return 14;
  if (launch(as_function(&kernel), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) !=
      CUDA_ERROR_NOT_SUPPORTED)
    return 15;
  CUmodule module = nullptr;
  if (load(&module, kImage) != CUDA_SUCCESS || module == nullptr) return 16;
  size_t free1 = 0;
  if (cudaMemGetInfo(&free1, &total) != cudaSuccess || free1 != total) return 17;
  if (simtest::counter("live_allocations") != 0) return 18;
  // A function's attributes load it, taking nothing; a variable has no code memory to live in.
  auto attribute =
      reinterpret_cast<decltype(&cuFuncGetAttribute)>(dlsym(lib, "cuFuncGetAttribute"));
  auto global =
      reinterpret_cast<decltype(&cuModuleGetGlobal_v2)>(dlsym(lib, "cuModuleGetGlobal_v2"));
  if (!attribute || !global) return 21;
  int registers = 0;
  if (attribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, as_function(&kernel)) != CUDA_SUCCESS ||
      registers != 32)
    return 22;
  CUdeviceptr address = kUntouchedAddress;
  size_t bytes = 0;
  if (global(&address, &bytes, module, "v") != CUDA_ERROR_NOT_SUPPORTED) return 23;
  if (address != kUntouchedAddress) return 24;
  size_t free2 = 0;
  if (cudaMemGetInfo(&free2, &total) != cudaSuccess || free2 != total) return 25;
  if (unload(module) != CUDA_SUCCESS) return 19;
  if (unload(module) != CUDA_ERROR_INVALID_HANDLE) return 20;
  return 0;
}

// ---- The child that shows which entry points report a launch ------------------------------------
int routing_child() {
  static const char kernel = 0;
  void* args[1] = {nullptr};
  if (cudaLaunchKernel(&kernel, dim3(1), dim3(1), args, 0, nullptr) != cudaErrorNotSupported)
    return 30;
  if (cudaLaunchKernel_ptsz(&kernel, dim3(1), dim3(1), args, 0, nullptr) != cudaErrorNotSupported)
    return 31;
  return 0;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("SIMCUDA_CODE_BYTES=0: launches take nothing and are still refused; loads take "
          "nothing; variables are refused") {
  int status = 0;
  const std::string err = simtest::run_child("--knob-zero", {"SIMCUDA_CODE_BYTES=0"}, &status);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  CHECK_EQ(count(err, "simcuda: cuLaunchKernel is not supported by the CUDA stand-in"),
           kStaticRuntime ? 3 : 1);
  CHECK_EQ(count(err, "simcuda: cuModuleGetGlobal(\"v\"): no code memory holds the variable "
                      "(SIMCUDA_CODE_BYTES=0;"),
           1);
}

TEST_CASE("a kernel's first launch on a device takes its module's memory, later ones nothing") {
  fresh();
  const void* kernel = new_kernel();
  refused(rt_launch(kernel));
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(counter("live_allocations"), 1u);
  refused(rt_launch(kernel));
  refused(rt_launch(kernel));
  CHECK_EQ(free_bytes(), kCapacity - kCode);

  // Its cudaKernel_t is the same kernel, in every launch form.
  cudaKernel_t handle = nullptr;
  CUDA_OK(__cudaGetKernel(&handle, kernel));
  refused(__cudaLaunchKernel(handle, dim3(1), dim3(1), nullptr, 0, nullptr));
  refused(__cudaLaunchKernel_ptsz(handle, dim3(1), dim3(1), nullptr, 0, nullptr));
  refused(cudaLaunchKernel_ptsz(kernel, dim3(1), dim3(1), nullptr, 0, nullptr));
  refused(cudaLaunchCooperativeKernel(kernel, dim3(1), dim3(1), nullptr, 0, nullptr));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  refused(cudaLaunchKernelExC(&config, kernel, nullptr));
  CHECK_EQ(free_bytes(), kCapacity - kCode);

  // Each other kernel takes a module of its own, whichever form launches it first.
  refused(rt_launch(new_kernel()));
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  refused(cudaLaunchKernel_ptsz(new_kernel(), dim3(1), dim3(1), nullptr, 0, nullptr));
  refused(cudaLaunchKernelExC(&config, new_kernel(), nullptr));
  refused(cudaLaunchKernelExC_ptsz(&config, new_kernel(), nullptr));
  refused(cudaLaunchCooperativeKernel(new_kernel(), dim3(1), dim3(1), nullptr, 0, nullptr));
  refused(cudaLaunchCooperativeKernel_ptsz(new_kernel(), dim3(1), dim3(1), nullptr, 0, nullptr));
  CUDA_OK(__cudaGetKernel(&handle, new_kernel()));
  refused(__cudaLaunchKernel(handle, dim3(1), dim3(1), nullptr, 0, nullptr));
  CUDA_OK(__cudaGetKernel(&handle, new_kernel()));
  refused(__cudaLaunchKernel_ptsz(handle, dim3(1), dim3(1), nullptr, 0, nullptr));
  CHECK_EQ(free_bytes(), kCapacity - 9 * kCode);
  CHECK_EQ(counter("live_allocations"), 9u);
  CHECK_EQ(counter("live_bytes"), 9 * kCode);

  // The memory is the device's: an allocation can no longer have it.
  void* p = nullptr;
  CHECK_EQ(cudaMalloc(&p, kCapacity - 9 * kCode + 256), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CUDA_OK(cudaMalloc(&p, kCapacity - 9 * kCode));
  CHECK_EQ(free_bytes(), 0u);
  CUDA_OK(cudaFree(p));
}

TEST_CASE("a launch the device cannot load is out of memory, remembers nothing, and loads once "
          "there is room") {
  fresh();
  const void* kernel = new_kernel();
  void* filler = fill_but(kCode / 2);
  for (int attempt = 0; attempt < 2; ++attempt) {
    CHECK_EQ(rt_launch(kernel), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(free_bytes(), kCode / 2);
    CHECK_EQ(counter("live_allocations"), 1u);  // the filler
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  CHECK_EQ(cudaLaunchKernelExC(&config, kernel, nullptr), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaLaunchCooperativeKernel_ptsz(kernel, dim3(1), dim3(1), nullptr, 0, nullptr),
           cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(drv_launch(kernel), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(free_bytes(), kCode / 2);

  CUDA_OK(cudaFree(filler));
  refused(rt_launch(kernel));
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(drv_launch(kernel), CUDA_ERROR_NOT_SUPPORTED);  // loaded: nothing more
  CHECK_EQ(free_bytes(), kCapacity - kCode);

  // Exactly full is enough.
  filler = fill_but(kCode);
  refused(rt_launch(new_kernel()));
  CHECK_EQ(free_bytes(), 0u);
  CUDA_OK(cudaFree(filler));
}

TEST_CASE("bad runtime launches are refused before anything loads") {
  fresh();
  simtest::stand_in()->reset_counters();
  CHECK_EQ(cudaLaunchKernel(nullptr, dim3(1), dim3(1), nullptr, 0, nullptr),
           cudaErrorInvalidDeviceFunction);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
  CHECK_EQ(cudaLaunchKernel_ptsz(nullptr, dim3(1), dim3(1), nullptr, 0, nullptr),
           cudaErrorInvalidDeviceFunction);
  CHECK_EQ(__cudaLaunchKernel(nullptr, dim3(1), dim3(1), nullptr, 0, nullptr),
           cudaErrorInvalidDeviceFunction);
  CHECK_EQ(cudaLaunchCooperativeKernel(nullptr, dim3(1), dim3(1), nullptr, 0, nullptr),
           cudaErrorInvalidDeviceFunction);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  CHECK_EQ(cudaLaunchKernelExC(&config, nullptr, nullptr), cudaErrorInvalidDeviceFunction);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
  CHECK_EQ(cudaLaunchKernelExC(nullptr, new_kernel(), nullptr), cudaErrorInvalidValue);
  CHECK_EQ(cudaLaunchKernelExC_ptsz(nullptr, new_kernel(), nullptr), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(counter("cuLaunchKernel"), 0u);  // none reached the driver
}

TEST_CASE("the driver's launches load the module the same way") {
  fresh();
  const Api& a = api();
  struct Form {
    const char* name;
    std::function<CUresult(CUfunction)> launch;
  };
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  const std::vector<Form> forms = {
      {"cuLaunchKernel",
       [&](CUfunction f) { return a.launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr); }},
      {"cuLaunchKernel_ptsz",
       [&](CUfunction f) {
         return a.launch_ptsz(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
       }},
      {"cuLaunchKernelEx", [&](CUfunction f) { return a.launch_ex(&config, f, nullptr, nullptr); }},
      {"cuLaunchKernelEx_ptsz",
       [&](CUfunction f) { return a.launch_ex_ptsz(&config, f, nullptr, nullptr); }},
      {"cuLaunchCooperativeKernel",
       [&](CUfunction f) { return a.cooperative(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr); }},
      {"cuLaunchCooperativeKernel_ptsz",
       [&](CUfunction f) { return a.cooperative_ptsz(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr); }},
  };
  size_t taken = 0;
  for (const Form& form : forms) {
    CAPTURE(form.name);
    const CUfunction f = as_function(new_kernel());
    CHECK_EQ(form.launch(f), CUDA_ERROR_NOT_SUPPORTED);
    taken += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken);
    CHECK_EQ(form.launch(f), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(free_bytes(), kCapacity - taken);
    CHECK_EQ(form.launch(nullptr), CUDA_ERROR_INVALID_HANDLE);

    const CUfunction starved = as_function(new_kernel());
    void* filler = fill_but(kCode - 256);
    CHECK_EQ(form.launch(starved), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(free_bytes(), kCode - 256);
    CUDA_OK(cudaFree(filler));
    CHECK_EQ(form.launch(starved), CUDA_ERROR_NOT_SUPPORTED);
    taken += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken);
  }
  CHECK_EQ(counter("live_allocations"), 2 * forms.size());
  CUDA_OK(cudaGetLastError());  // the driver leaves the runtime's last error alone

  // Kernel parameters given both ways, and a launch without a configuration.
  void* params[1] = {nullptr};
  void* extra[1] = {CU_LAUNCH_PARAM_END};
  const CUfunction f = as_function(new_kernel());
  CHECK_EQ(a.launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, extra), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.launch_ex(&config, f, params, extra), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.launch_ex(nullptr, f, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.launch_ex_ptsz(nullptr, f, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(free_bytes(), kCapacity - taken);

  // A thread with no current context.
  CUresult without_context = CUDA_SUCCESS;
  const void* other = new_kernel();
  std::thread([&] { without_context = drv_launch(other); }).join();
  CHECK_EQ(without_context, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(free_bytes(), kCapacity - taken);
}

TEST_CASE("a launch loads on the current device") {
  fresh();
  const void* kernel = new_kernel();
  refused(rt_launch(kernel));
  CUDA_OK(cudaSetDevice(1));
  CHECK_EQ(free_bytes(), kCapacity);
  refused(rt_launch(kernel));  // loaded on device 0 only
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(drv_launch(new_kernel()), CUDA_ERROR_NOT_SUPPORTED);  // the runtime's context's device
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(free_on(0), kCapacity - kCode);
  CUDA_OK(cudaSetDevice(0));
}

TEST_CASE("runtime launches reach the driver's cuLaunchKernel in the static runtime only") {
  fresh();
  simtest::stand_in()->reset_counters();
  const void* kernel = new_kernel();
  refused(rt_launch(kernel));
  refused(cudaLaunchKernel_ptsz(new_kernel(), dim3(1), dim3(1), nullptr, 0, nullptr));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  refused(cudaLaunchKernelExC(&config, kernel, nullptr));
  refused(cudaLaunchCooperativeKernel(kernel, dim3(1), dim3(1), nullptr, 0, nullptr));
  cudaKernel_t handle = nullptr;
  CUDA_OK(__cudaGetKernel(&handle, kernel));
  refused(__cudaLaunchKernel(handle, dim3(1), dim3(1), nullptr, 0, nullptr));
  CHECK_EQ(counter("cuLaunchKernel"), kStaticRuntime ? 5u : 0u);
  CHECK_EQ(drv_launch(kernel), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(counter("cuLaunchKernel"), kStaticRuntime ? 6u : 1u);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);

  // Which entry point refused them: the runtime's own, or the driver's cuLaunchKernel and its
  // per-thread form.
  int status = 0;
  const std::string err = simtest::run_child("--routing", {"SIMCUDA_CODE_BYTES=4M"}, &status);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  const int driver_lines = kStaticRuntime ? 1 : 0;
  CHECK_EQ(count(err, "simcuda: cuLaunchKernel is not supported"), driver_lines);
  CHECK_EQ(count(err, "simcuda: cuLaunchKernel_ptsz is not supported"), driver_lines);
  CHECK_EQ(count(err, "simcuda: cudaLaunchKernel: the CUDA stand-in cannot run device code"),
           1 - driver_lines);
  CHECK_EQ(count(err, "simcuda: cudaLaunchKernel_ptsz: the CUDA stand-in cannot run device code"),
           1 - driver_lines);
}

TEST_CASE("a device reset gives the loaded code back and forgets it") {
  fresh();
  const Api& a = api();
  const void* kernel = new_kernel();
  refused(rt_launch(kernel));
  CUDA_OK(cudaSetDevice(1));
  refused(rt_launch(kernel));
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaDeviceReset());
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity - kCode);  // another device keeps its own
  CHECK_EQ(counter("live_allocations"), 1u);
  refused(rt_launch(kernel));  // loads again
  CHECK_EQ(free_bytes(), kCapacity - kCode);

  // The driver's reset of the primary context: lazily loaded code and modules go (a module's
  // handle with them); a library stays loaded, without memory.
  CUmodule module = nullptr;
  CUlibrary library = nullptr;
  REQUIRE_EQ(a.module_load_data(&module, kImage), CUDA_SUCCESS);
  REQUIRE_EQ(a.library_load_data(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0),
             CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(a.primary_reset(0), CUDA_SUCCESS);
  CUDA_OK(cudaFree(nullptr));
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(a.module_unload(module), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(drv_launch(kernel), CUDA_ERROR_NOT_SUPPORTED);  // loads again
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(counter("live_allocations"), 2u);  // and device 1's
}

TEST_CASE("explicit module loads take a module's memory until unloaded") {
  fresh();
  const Api& a = api();
  CUmodule modules[4] = {};
  CUjit_option options[1] = {CU_JIT_MAX_REGISTERS};
  void* values[1] = {reinterpret_cast<void*>(uintptr_t{32})};
  REQUIRE_EQ(a.module_load_data(&modules[0], kImage), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  REQUIRE_EQ(a.module_load_data_ex(&modules[1], kImage, 1, options, values), CUDA_SUCCESS);
  REQUIRE_EQ(a.module_load_fat_binary(&modules[2], kImage), CUDA_SUCCESS);
  REQUIRE_EQ(a.module_load(&modules[3], "/proc/self/exe"), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 4 * kCode);
  CHECK_EQ(counter("live_allocations"), 4u);
  for (int i = 0; i < 4; ++i) {
    CHECK(modules[i] != nullptr);
    for (int j = 0; j < i; ++j) CHECK(modules[i] != modules[j]);
  }

  // Refused loads take nothing and leave the output alone.
  const auto untouched = reinterpret_cast<CUmodule>(uintptr_t{0x5ca1ab1e});
  CUmodule module = untouched;
  CHECK_EQ(a.module_load(&module, "/nonexistent/kernels.cubin"), CUDA_ERROR_FILE_NOT_FOUND);
  CHECK_EQ(a.module_load(&module, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_load(nullptr, "/proc/self/exe"), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_load_data(&module, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_load_data(nullptr, kImage), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_load_data_ex(&module, nullptr, 0, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_load_fat_binary(&module, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(module, untouched);
  void* filler = fill_but(kCode - 256);
  CHECK_EQ(a.module_load_data(&module, kImage), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.module_load_data_ex(&module, kImage, 0, nullptr, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.module_load_fat_binary(&module, kImage), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.module_load(&module, "/proc/self/exe"), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(module, untouched);
  CHECK_EQ(free_bytes(), kCode - 256);
  CUDA_OK(cudaFree(filler));
  CHECK_EQ(free_bytes(), kCapacity - 4 * kCode);

  // Unloads give the memory back, once.
  CHECK_EQ(a.module_unload(modules[0]), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(a.module_unload(modules[0]), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.module_unload(nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_unload(reinterpret_cast<CUmodule>(&module)), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_unload(reinterpret_cast<CUlibrary>(modules[1])), CUDA_ERROR_INVALID_HANDLE);
  for (int i = 1; i < 4; ++i) CHECK_EQ(a.module_unload(modules[i]), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(counter("live_allocations"), 0u);
  // A new load gets a handle never handed out before.
  REQUIRE_EQ(a.module_load_data(&module, kImage), CUDA_SUCCESS);
  for (CUmodule old : modules) CHECK(module != old);
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);

  // The current context's device.
  CUDA_OK(cudaSetDevice(1));
  REQUIRE_EQ(a.module_load_data(&module, kImage), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(free_on(0), kCapacity);
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CUDA_OK(cudaSetDevice(0));

  // No current context.
  CUresult load = CUDA_SUCCESS, unload = CUDA_SUCCESS;
  module = untouched;
  std::thread([&] {
    load = a.module_load_data(&module, kImage);
    unload = a.module_unload(modules[0]);
  }).join();
  CHECK_EQ(load, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(unload, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(module, untouched);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("explicit library loads take a module's memory until unloaded") {
  fresh();
  const Api& a = api();
  CUjit_option jit[1] = {CU_JIT_MAX_REGISTERS};
  void* jit_values[1] = {reinterpret_cast<void*>(uintptr_t{32})};
  CUlibraryOption options[1] = {CU_LIBRARY_BINARY_IS_PRESERVED};
  void* option_values[1] = {reinterpret_cast<void*>(uintptr_t{1})};
  CUlibrary first = nullptr, second = nullptr;
  REQUIRE_EQ(a.library_load_data(&first, kImage, jit, jit_values, 1, options, option_values, 1),
             CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  REQUIRE_EQ(a.library_load_from_file(&second, "/proc/self/exe", nullptr, nullptr, 0, nullptr,
                                      nullptr, 0),
             CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK(first != nullptr);
  CHECK(second != nullptr);
  CHECK(first != second);

  const auto untouched = reinterpret_cast<CUlibrary>(uintptr_t{0x5ca1ab1e});
  CUlibrary library = untouched;
  CHECK_EQ(a.library_load_from_file(&library, "/nonexistent/kernels.fatbin", nullptr, nullptr, 0,
                                    nullptr, nullptr, 0),
           CUDA_ERROR_FILE_NOT_FOUND);
  CHECK_EQ(a.library_load_from_file(&library, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.library_load_data(&library, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.library_load_data(nullptr, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0),
           CUDA_ERROR_INVALID_VALUE);
  void* filler = fill_but(kCode / 2);
  CHECK_EQ(a.library_load_data(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.library_load_from_file(&library, "/proc/self/exe", nullptr, nullptr, 0, nullptr,
                                    nullptr, 0),
           CUDA_ERROR_OUT_OF_MEMORY);
  CUDA_OK(cudaFree(filler));
  CHECK_EQ(library, untouched);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);

  CHECK_EQ(a.library_unload(first), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(a.library_unload(first), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_unload(nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_unload(reinterpret_cast<CUmodule>(second)), CUDA_ERROR_INVALID_HANDLE);
  // A library belongs to no context: a thread without one unloads it, but cannot load one (the
  // stand-in charges the current context's device).
  CUresult unload = CUDA_ERROR_UNKNOWN, load = CUDA_SUCCESS;
  std::thread([&] {
    unload = a.library_unload(second);
    load = a.library_load_data(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0);
  }).join();
  CHECK_EQ(unload, CUDA_SUCCESS);
  CHECK_EQ(load, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(library, untouched);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("destroying a created context unloads its modules, not the libraries") {
  fresh();
  const Api& a = api();
  CUcontext own = nullptr;
  REQUIRE_EQ(a.create(&own, nullptr, 0, 0), CUDA_SUCCESS);  // current now
  CUmodule module = nullptr;
  CUlibrary library = nullptr;
  REQUIRE_EQ(a.module_load_data(&module, kImage), CUDA_SUCCESS);
  REQUIRE_EQ(a.library_load_data(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0),
             CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(a.destroy(own), CUDA_SUCCESS);  // the primary context is current again
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(a.module_unload(module), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("threads launching one kernel at once load it once") {
  fresh();
  constexpr int kThreads = 8;
  constexpr int kLaunches = 10;
  const void* shared = new_kernel();
  std::vector<const void*> own;
  for (int t = 0; t < kThreads; ++t) own.push_back(new_kernel());
  std::atomic<int> ready{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cudaFree(nullptr) != cudaSuccess) wrong.fetch_add(1);  // binds device 0's context
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int i = 0; i < kLaunches; ++i) {
        // Half the threads launch through the runtime, half through the driver.
        const bool ok = t % 2 ? rt_launch(shared) == cudaErrorNotSupported
                              : drv_launch(shared) == CUDA_ERROR_NOT_SUPPORTED;
        if (!ok) wrong.fetch_add(1);
      }
      if (rt_launch(own[static_cast<size_t>(t)]) != cudaErrorNotSupported) wrong.fetch_add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK_EQ(wrong.load(), 0);
  CHECK_EQ(free_bytes(), kCapacity - (kThreads + 1) * kCode);
  CHECK_EQ(counter("live_allocations"), static_cast<uint64_t>(kThreads + 1));
}

TEST_CASE("CUDA_MODULE_LOADING picks eager or lazy loading; other values stop the program") {
  struct Run {
    std::initializer_list<const char*> env;
    int exit_code;
  };
  const Run runs[] = {
      {{"SIMCUDA_CODE_BYTES=4M"}, 1},
      {{"SIMCUDA_CODE_BYTES=4M", "CUDA_MODULE_LOADING=EAGER"}, 1},
      {{"SIMCUDA_CODE_BYTES=4M", "CUDA_MODULE_LOADING=LAZY"}, 2},
  };
  for (const Run& run : runs) {
    CAPTURE(*(run.env.end() - 1));
    int status = 0;
    const std::string err = simtest::run_child("--mode", run.env, &status);
    INFO(err);
    REQUIRE(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), run.exit_code);
  }
  for (const char* bad : {"CUDA_MODULE_LOADING=lazy", "CUDA_MODULE_LOADING=DEFAULT",
                          "CUDA_MODULE_LOADING=", "CUDA_MODULE_LOADING=LAZY "}) {
    CAPTURE(bad);
    int status = 0;
    const std::string err = simtest::run_child("--mode", {"SIMCUDA_CODE_BYTES=4M", bad}, &status);
    CHECK(WIFSIGNALED(status));
    CHECK(err.find("simcuda: CUDA_MODULE_LOADING=") != std::string::npos);
  }
}

TEST_CASE("CUDA_MODULE_LOADING=LAZY: the lazy cases pass in a child") {
  int status = 0;
  const std::string err = simtest::run_child(
      "--lazy",
      {"SIMCUDA_DEVICES=2", "SIMCUDA_DEVICE_MEMORY=1G", "SIMCUDA_CODE_BYTES=4M",
       "CUDA_MODULE_LOADING=LAZY"},
      &status);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  // Every lazy case ran, and passed.
  const size_t at = err.find("[doctest] test cases:");
  REQUIRE(at != std::string::npos);
  int ran = -1, passed = -1, failed = -1;
  REQUIRE_EQ(std::sscanf(err.c_str() + at, "[doctest] test cases: %d | %d passed | %d failed", &ran,
                         &passed, &failed),
             3);
  CHECK_EQ(ran, kLazyChildCases);
  CHECK_EQ(passed, kLazyChildCases);
  CHECK_EQ(failed, 0);
}

TEST_CASE("eager: what is got from loaded code was loaded with it; other functions load as "
          "launched") {
  fresh();
  const Api& a = api();
  CHECK_EQ(loading_mode(), CU_MODULE_EAGER_LOADING);
  const CUmodule module = load_module();
  CHECK_EQ(free_bytes(), kCapacity - kCode);

  // A module's functions: one handle per name, no memory, not even on a full device.
  const CUfunction fa = get_function(module, "a");
  CHECK_EQ(get_function(module, "a"), fa);
  const CUfunction fb = get_function(module, "b");
  CHECK(fb != fa);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(launch_function(fa), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(a.func_load(fb), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  void* filler = fill_but(kCode - 256);
  const CUfunction fc = get_function(module, "c");
  CHECK_EQ(launch_function(fc), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCode - 256);
  CUDA_OK(cudaFree(filler));

  // A library's kernels and their functions, on either device.
  const CUlibrary library = load_library();
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  const CUkernel ka = get_kernel(library, "a");
  CHECK_EQ(get_kernel(library, "a"), ka);
  CHECK(get_kernel(library, "b") != ka);
  CHECK(reinterpret_cast<void*>(ka) != reinterpret_cast<void*>(fa));  // the library's own
  const CUfunction kfa = kernel_function(ka);
  CHECK_EQ(reinterpret_cast<void*>(kfa), reinterpret_cast<void*>(ka));
  CHECK_EQ(launch_function(kfa), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(a.func_load(kfa), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CUDA_OK(cudaSetDevice(1));
  CHECK_EQ(kernel_function(ka), kfa);
  CHECK_EQ(launch_function(fa), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity);
  CUDA_OK(cudaSetDevice(0));

  // Functions the stand-in did not hand out load as their first launch would, once.
  const CUfunction other = as_function(new_kernel());
  CHECK_EQ(a.func_load(other), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(a.func_load(other), CUDA_SUCCESS);
  CHECK_EQ(launch_function(other), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  const auto runtime_kernel = reinterpret_cast<CUkernel>(const_cast<void*>(new_kernel()));
  CHECK_EQ(kernel_function(runtime_kernel), reinterpret_cast<CUfunction>(runtime_kernel));
  CHECK_EQ(free_bytes(), kCapacity - 4 * kCode);
  refused(rt_launch(runtime_kernel));
  CHECK_EQ(free_bytes(), kCapacity - 4 * kCode);
  filler = fill_but(kCode - 256);
  CUfunction f = kUntouchedFunction;
  CHECK_EQ(a.func_load(as_function(new_kernel())), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.kernel_function(&f, reinterpret_cast<CUkernel>(const_cast<void*>(new_kernel()))),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(f, kUntouchedFunction);
  CHECK_EQ(free_bytes(), kCode - 256);
  CUDA_OK(cudaFree(filler));

  // Unloaded, the module's functions and the library's kernels are refused.
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(a.get_function(&f, module, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(launch_function(fa), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_load(fb), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CUkernel k = kUntouchedKernel;
  CHECK_EQ(a.get_kernel(&k, library, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.kernel_function(&f, ka), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(launch_function(kfa), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(f, kUntouchedFunction);
  CHECK_EQ(k, kUntouchedKernel);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
}

TEST_CASE("eager: a reset refuses a module's functions; a library's kernels still take nothing") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUfunction f = get_function(module, "a");
  const CUlibrary library = load_library();
  const CUkernel k = get_kernel(library, "a");
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(a.primary_reset(0), CUDA_SUCCESS);
  CUDA_OK(cudaFree(nullptr));
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(launch_function(f), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_load(f), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(kernel_function(k), reinterpret_cast<CUfunction>(k));
  CHECK_EQ(launch_function(reinterpret_cast<CUfunction>(k)), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
}

TEST_CASE("any mode: the getters' arguments, handles and contexts") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  const size_t loaded = free_bytes();
  CUfunction f = kUntouchedFunction;
  CUkernel k = kUntouchedKernel;
  CHECK_EQ(a.get_function(nullptr, module, "a"), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.get_function(&f, module, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.get_function(&f, nullptr, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.get_function(&f, reinterpret_cast<CUmodule>(library), "a"),
           CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.get_function(&f, reinterpret_cast<CUmodule>(&f), "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.get_kernel(nullptr, library, "a"), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.get_kernel(&k, library, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.get_kernel(&k, nullptr, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.get_kernel(&k, reinterpret_cast<CUlibrary>(module), "a"), CUDA_ERROR_INVALID_HANDLE);
  const CUkernel kernel = get_kernel(library, "a");
  CHECK_EQ(a.kernel_function(nullptr, kernel), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.kernel_function(&f, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.func_load(nullptr), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.loading_mode(nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(f, kUntouchedFunction);
  CHECK_EQ(k, kUntouchedKernel);
  // A module's function never shares a library's kernel's handle, nor another module's.
  const CUmodule other = load_module();
  CHECK(get_function(module, "a") != get_function(other, "a"));
  CHECK(reinterpret_cast<void*>(get_function(module, "a")) != reinterpret_cast<void*>(kernel));

  // Only cuLibraryGetKernel needs no current context.
  CUresult got_function = CUDA_SUCCESS, got_kernel = CUDA_ERROR_UNKNOWN;
  CUresult kernel_function = CUDA_SUCCESS, func_load = CUDA_SUCCESS;
  CUkernel kb = nullptr;
  const size_t before = free_bytes();
  std::thread([&] {
    got_function = a.get_function(&f, module, "z");
    got_kernel = a.get_kernel(&kb, library, "b");
    kernel_function = a.kernel_function(&f, kernel);
    func_load = a.func_load(as_function(new_kernel()));
  }).join();
  CHECK_EQ(got_function, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(got_kernel, CUDA_SUCCESS);
  CHECK_EQ(kb, get_kernel(library, "b"));
  CHECK_EQ(kernel_function, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(func_load, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(f, kUntouchedFunction);
  CHECK_EQ(free_bytes(), before);
  CHECK(before <= loaded);
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(a.module_unload(other), CUDA_SUCCESS);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("lazy: loads take nothing; a module's function loads at its first get, once a name") {
  fresh();
  const Api& a = api();
  CHECK_EQ(loading_mode(), CU_MODULE_LAZY_LOADING);
  CUmodule modules[4] = {};
  REQUIRE_EQ(a.module_load_data(&modules[0], kImage), CUDA_SUCCESS);
  REQUIRE_EQ(a.module_load_data_ex(&modules[1], kImage, 0, nullptr, nullptr), CUDA_SUCCESS);
  REQUIRE_EQ(a.module_load_fat_binary(&modules[2], kImage), CUDA_SUCCESS);
  REQUIRE_EQ(a.module_load(&modules[3], "/proc/self/exe"), CUDA_SUCCESS);
  CUlibrary libraries[2] = {};
  REQUIRE_EQ(a.library_load_data(&libraries[0], kImage, nullptr, nullptr, 0, nullptr, nullptr, 0),
             CUDA_SUCCESS);
  REQUIRE_EQ(a.library_load_from_file(&libraries[1], "/proc/self/exe", nullptr, nullptr, 0,
                                      nullptr, nullptr, 0),
             CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(counter("live_allocations"), 0u);

  const CUfunction fa = get_function(modules[0], "a");
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(counter("live_allocations"), 1u);
  CHECK_EQ(get_function(modules[0], "a"), fa);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  const CUfunction fb = get_function(modules[0], "b");
  CHECK(fb != fa);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  const CUfunction other = get_function(modules[3], "a");
  CHECK(other != fa);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);

  // Loaded: launches and cuFuncLoad take nothing more.
  CHECK_EQ(launch_function(fa), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(drv_launch(fb), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(a.func_load(fa), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  // The runtime's kernels load at their first launch, as when eager.
  refused(rt_launch(new_kernel()));
  CHECK_EQ(free_bytes(), kCapacity - 4 * kCode);

  // An unload gives back what its functions took, and refuses them afterwards.
  CHECK_EQ(a.module_unload(modules[0]), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CUfunction f = kUntouchedFunction;
  CHECK_EQ(a.get_function(&f, modules[0], "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(launch_function(fa), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_load(fb), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(f, kUntouchedFunction);
  for (int i = 1; i < 4; ++i) CHECK_EQ(a.module_unload(modules[i]), CUDA_SUCCESS);
  for (CUlibrary library : libraries) CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(counter("live_allocations"), 1u);
}

TEST_CASE("lazy: a function the device cannot hold is out of memory and remembered nowhere") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  const CUkernel kernel = get_kernel(library, "k");
  const CUkernel launched = get_kernel(library, "launched");
  CUfunction f = kUntouchedFunction;
  void* filler = fill_but(kCode - 256);
  CHECK_EQ(a.get_function(&f, module, "a"), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.kernel_function(&f, kernel), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(f, kUntouchedFunction);
  CHECK_EQ(a.func_load(reinterpret_cast<CUfunction>(kernel)), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(launch_function(reinterpret_cast<CUfunction>(launched)), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(free_bytes(), kCode - 256);
  CHECK_EQ(counter("live_allocations"), 1u);
  CUDA_OK(cudaFree(filler));

  const CUfunction fa = get_function(module, "a");
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(get_function(module, "a"), fa);  // the same handle as the refused get would have had
  CHECK_EQ(a.func_load(reinterpret_cast<CUfunction>(kernel)), CUDA_SUCCESS);
  CHECK_EQ(kernel_function(kernel), reinterpret_cast<CUfunction>(kernel));
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(launch_function(reinterpret_cast<CUfunction>(launched)), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("lazy: a library's kernels load at cuKernelGetFunction, cuFuncLoad or first launch, "
          "once a device") {
  fresh();
  const Api& a = api();
  const CUlibrary library = load_library();
  const CUlibrary other = load_library();
  const CUkernel ka = get_kernel(library, "a");
  CHECK_EQ(get_kernel(library, "a"), ka);
  const CUkernel kb = get_kernel(library, "b");
  const CUkernel kc = get_kernel(library, "c");
  CHECK(kb != ka);
  CHECK(get_kernel(other, "a") != ka);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(counter("live_allocations"), 0u);

  const CUfunction fa = kernel_function(ka);
  CHECK_EQ(reinterpret_cast<void*>(fa), reinterpret_cast<void*>(ka));
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(kernel_function(ka), fa);
  CHECK_EQ(a.func_load(fa), CUDA_SUCCESS);
  CHECK_EQ(launch_function(fa), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity - kCode);

  CHECK_EQ(a.func_load(reinterpret_cast<CUfunction>(kb)), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(kernel_function(kb), reinterpret_cast<CUfunction>(kb));
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);

  CHECK_EQ(launch_function(reinterpret_cast<CUfunction>(kc)), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(kernel_function(kc), reinterpret_cast<CUfunction>(kc));
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);

  // Another device loads its own.
  CUDA_OK(cudaSetDevice(1));
  CHECK_EQ(kernel_function(ka), fa);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(launch_function(fa), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);

  // The library's unload gives back what its kernels took, on every device.
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity);
  CUfunction f = kUntouchedFunction;
  CUkernel k = kUntouchedKernel;
  CHECK_EQ(a.kernel_function(&f, ka), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_load(fa), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.get_kernel(&k, library, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(f, kUntouchedFunction);
  CHECK_EQ(k, kUntouchedKernel);
  CHECK_EQ(a.library_unload(other), CUDA_SUCCESS);
}

TEST_CASE("lazy: a reset forgets what was loaded on the device") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUfunction f = get_function(module, "a");
  const CUlibrary library = load_library();
  const CUkernel k = get_kernel(library, "a");
  CHECK_EQ(kernel_function(k), reinterpret_cast<CUfunction>(k));
  CUDA_OK(cudaSetDevice(1));
  CHECK_EQ(kernel_function(k), reinterpret_cast<CUfunction>(k));
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);

  CHECK_EQ(a.primary_reset(0), CUDA_SUCCESS);
  CUDA_OK(cudaFree(nullptr));
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity - kCode);  // another device keeps its own
  CHECK_EQ(a.module_unload(module), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(launch_function(f), CUDA_ERROR_INVALID_HANDLE);
  // The library stays loaded: its kernel loads again.
  CHECK_EQ(kernel_function(k), reinterpret_cast<CUfunction>(k));
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(kernel_function(k), reinterpret_cast<CUfunction>(k));
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("lazy: destroying a created context gives back its modules' functions") {
  fresh();
  const Api& a = api();
  CUcontext own = nullptr;
  REQUIRE_EQ(a.create(&own, nullptr, 0, 0), CUDA_SUCCESS);  // current now
  const CUmodule module = load_module();
  const CUfunction f = get_function(module, "a");
  get_function(module, "b");
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(a.destroy(own), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(a.module_unload(module), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(launch_function(f), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("lazy: threads getting or using one function or variable at once load it once") {
  fresh();
  constexpr int kThreads = 8;
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  const CUkernel kernel = get_kernel(library, "shared");
  const CUkernel queried = get_kernel(library, "queried");
  std::atomic<int> ready{0};
  std::atomic<int> wrong{0};
  std::vector<CUfunction> got(kThreads);
  std::vector<CUdeviceptr> variables(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (cudaFree(nullptr) != cudaSuccess) wrong.fetch_add(1);  // binds device 0's context
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      CUfunction f = nullptr;
      if (api().get_function(&got[static_cast<size_t>(t)], module, "shared") != CUDA_SUCCESS)
        wrong.fetch_add(1);
      if (api().kernel_function(&f, kernel) != CUDA_SUCCESS) wrong.fetch_add(1);
      if (api().func_load(f) != CUDA_SUCCESS) wrong.fetch_add(1);
      int registers = 0;
      if (api().func_get_attribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS,
                                   as_function(queried)) != CUDA_SUCCESS)
        wrong.fetch_add(1);
      if (api().library_global(&variables[static_cast<size_t>(t)], nullptr, library,
                               "variable") != CUDA_SUCCESS)
        wrong.fetch_add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK_EQ(wrong.load(), 0);
  for (CUfunction f : got) CHECK_EQ(f, got[0]);
  for (CUdeviceptr v : variables) CHECK_EQ(v, variables[0]);
  CHECK_EQ(free_bytes(), kCapacity - 4 * kCode);
  CHECK_EQ(counter("live_allocations"), 4u);
  CHECK_EQ(api().module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(api().library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("any mode: attribute, cache and occupancy calls load a function on the current device, "
          "once, as its first launch would") {
  fresh();
  const Api& a = api();
  const std::vector<FunctionUse> uses = function_uses();
  size_t taken = 0, taken_on_1 = 0;
  for (const FunctionUse& use : uses) {
    CAPTURE(use.name);
    const CUfunction f = as_function(new_kernel());
    CHECK_EQ(use.call(f), CUDA_SUCCESS);
    taken += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken);
    CHECK_EQ(use.call(f), CUDA_SUCCESS);
    CHECK_EQ(launch_function(f), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(a.func_load(f), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(), kCapacity - taken);

    // Another device loads its own.
    CUDA_OK(cudaSetDevice(1));
    CHECK_EQ(use.call(f), CUDA_SUCCESS);
    taken_on_1 += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken_on_1);
    CUDA_OK(cudaSetDevice(0));

    // A device that cannot hold it: out of memory, nothing remembered; with room, loaded.
    const CUfunction starved = as_function(new_kernel());
    void* filler = fill_but(kCode - 256);
    CHECK_EQ(use.call(starved), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(use.call(starved), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(free_bytes(), kCode - 256);
    CUDA_OK(cudaFree(filler));
    CHECK_EQ(use.call(starved), CUDA_SUCCESS);
    taken += kCode;
    CHECK_EQ(launch_function(starved), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(free_bytes(), kCapacity - taken);
  }
  CHECK_EQ(counter("live_allocations"), 3 * uses.size());
}

TEST_CASE("any mode: a kernel's attribute and cache calls load it on the device named, under the "
          "key cuKernelGetFunction uses") {
  fresh();
  const std::vector<KernelUse> uses = kernel_uses();
  size_t taken = 0, taken_on_1 = 0;
  for (const KernelUse& use : uses) {
    CAPTURE(use.name);
    const CUkernel k = as_kernel(new_kernel());
    CHECK_EQ(use.call(k, 1), CUDA_SUCCESS);  // device 0 is current
    taken_on_1 += kCode;
    CHECK_EQ(free_on(1), kCapacity - taken_on_1);
    CHECK_EQ(free_bytes(), kCapacity - taken);
    CHECK_EQ(use.call(k, 1), CUDA_SUCCESS);
    CUDA_OK(cudaSetDevice(1));
    CHECK_EQ(kernel_function(k), as_function(k));  // loaded there already
    CHECK_EQ(free_bytes(), kCapacity - taken_on_1);
    CUDA_OK(cudaSetDevice(0));

    // On device 0, the other way round: cuKernelGetFunction loads it, the call takes nothing.
    CHECK_EQ(kernel_function(k), as_function(k));
    taken += kCode;
    CHECK_EQ(use.call(k, 0), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(), kCapacity - taken);

    const CUkernel starved = as_kernel(new_kernel());
    void* filler = fill_but(kCode - 256);
    CHECK_EQ(use.call(starved, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(use.call(starved, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(free_bytes(), kCode - 256);
    CUDA_OK(cudaFree(filler));
    CHECK_EQ(use.call(starved, 0), CUDA_SUCCESS);
    taken += kCode;
    CHECK_EQ(launch_function(as_function(starved)), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(free_bytes(), kCapacity - taken);
  }
  CHECK_EQ(counter("live_allocations"), 3 * uses.size());
}

TEST_CASE("any mode: the answers of attribute, cache and occupancy calls, and their arguments") {
  fresh();
  const Api& a = api();
  const CUfunction f = as_function(new_kernel());
  const CUkernel k = as_kernel(f);
  int value = -1;
  CHECK_EQ(a.func_get_attribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f), CUDA_SUCCESS);
  CHECK_EQ(value, 1024);
  CHECK_EQ(a.func_get_attribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, f), CUDA_SUCCESS);
  CHECK_EQ(value, 32);
  for (int attrib = 0; attrib < CU_FUNC_ATTRIBUTE_MAX; ++attrib) {
    if (attrib == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK || attrib == CU_FUNC_ATTRIBUTE_NUM_REGS)
      continue;
    CAPTURE(attrib);
    value = -1;
    CHECK_EQ(a.func_get_attribute(&value, static_cast<CUfunction_attribute>(attrib), f),
             CUDA_SUCCESS);
    CHECK_EQ(value, 0);
  }
  CHECK_EQ(a.kernel_get_attribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, k, 0),
           CUDA_SUCCESS);
  CHECK_EQ(value, 1024);
  CHECK_EQ(a.func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0),
           CUDA_SUCCESS);
  CHECK_EQ(a.func_set_cache_config(f, CU_FUNC_CACHE_PREFER_EQUAL), CUDA_SUCCESS);
  CHECK_EQ(a.kernel_set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0, k, 0),
           CUDA_SUCCESS);
  CHECK_EQ(a.kernel_set_cache_config(k, CU_FUNC_CACHE_PREFER_NONE, 0), CUDA_SUCCESS);

  int blocks = -1;
  CHECK_EQ(a.active_blocks(&blocks, f, 256, 0), CUDA_SUCCESS);
  CHECK_EQ(blocks, 8);
  CHECK_EQ(a.active_blocks_flags(&blocks, f, 1024, 4096, CU_OCCUPANCY_DEFAULT), CUDA_SUCCESS);
  CHECK_EQ(blocks, 2);
  int grid = -1, block = -1;
  CHECK_EQ(a.block_size(&grid, &block, f, nullptr, 0, 0), CUDA_SUCCESS);
  CHECK_EQ(block, 1024);
  CHECK_EQ(grid, 132 * 2);
  CHECK_EQ(a.block_size(&grid, &block, f, nullptr, 0, 4096), CUDA_SUCCESS);
  CHECK_EQ(block, 1024);
  CHECK_EQ(a.block_size_flags(&grid, &block, f, nullptr, 0, 128, CU_OCCUPANCY_DEFAULT),
           CUDA_SUCCESS);
  CHECK_EQ(block, 128);
  CHECK_EQ(grid, 132 * 16);
  size_t shared = 0;
  CHECK_EQ(a.dynamic_shared(&shared, f, 4, 256), CUDA_SUCCESS);
  CHECK_EQ(shared, 48u << 10);
  int cluster = -1;
  CHECK_EQ(a.cluster_size(&cluster, f, launch_config()), CUDA_SUCCESS);
  CHECK_EQ(cluster, 8);
  CHECK_EQ(a.active_clusters(&cluster, f, launch_config()), CUDA_SUCCESS);
  CHECK_EQ(cluster, 1);
  CHECK_EQ(free_bytes(), kCapacity - kCode);  // one load for all of them
  CHECK_EQ(free_on(1), kCapacity);

  // Refused before anything loads, the outputs untouched.
  const CUfunction g = as_function(new_kernel());
  const CUkernel kg = as_kernel(g);
  const auto bad_attribute = static_cast<CUfunction_attribute>(CU_FUNC_ATTRIBUTE_MAX);
  const auto negative_attribute = static_cast<CUfunction_attribute>(-1);
  const auto bad_cache = static_cast<CUfunc_cache>(CU_FUNC_CACHE_PREFER_EQUAL + 1);
  const auto regs = CU_FUNC_ATTRIBUTE_NUM_REGS;
  constexpr unsigned kBadFlags = 2;
  value = blocks = grid = block = cluster = -1;
  shared = 7;
  CHECK_EQ(a.func_get_attribute(nullptr, regs, g), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.func_get_attribute(&value, regs, nullptr), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_get_attribute(&value, bad_attribute, g), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.func_get_attribute(&value, negative_attribute, g), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.func_set_attribute(nullptr, regs, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_set_attribute(g, bad_attribute, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.func_set_cache_config(nullptr, CU_FUNC_CACHE_PREFER_L1), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.func_set_cache_config(g, bad_cache), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.kernel_get_attribute(nullptr, regs, kg, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.kernel_get_attribute(&value, regs, nullptr, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.kernel_get_attribute(&value, bad_attribute, kg, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.kernel_get_attribute(&value, regs, kg, 2), CUDA_ERROR_INVALID_DEVICE);
  CHECK_EQ(a.kernel_get_attribute(&value, regs, kg, -1), CUDA_ERROR_INVALID_DEVICE);
  CHECK_EQ(a.kernel_set_attribute(regs, 0, nullptr, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.kernel_set_attribute(bad_attribute, 0, kg, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.kernel_set_attribute(regs, 0, kg, 2), CUDA_ERROR_INVALID_DEVICE);
  CHECK_EQ(a.kernel_set_cache_config(nullptr, CU_FUNC_CACHE_PREFER_L1, 0),
           CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.kernel_set_cache_config(kg, bad_cache, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.kernel_set_cache_config(kg, CU_FUNC_CACHE_PREFER_L1, 2), CUDA_ERROR_INVALID_DEVICE);
  CHECK_EQ(a.active_blocks(nullptr, g, 256, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.active_blocks(&blocks, nullptr, 256, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.active_blocks(&blocks, g, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.active_blocks(&blocks, g, -32, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.active_blocks_flags(&blocks, g, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.active_blocks_flags(&blocks, g, 256, 0, kBadFlags), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.block_size(nullptr, &block, g, nullptr, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.block_size(&grid, nullptr, g, nullptr, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.block_size(&grid, &block, nullptr, nullptr, 0, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.block_size(&grid, &block, g, nullptr, 0, -1), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.block_size_flags(&grid, &block, g, nullptr, 0, 0, kBadFlags),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.dynamic_shared(nullptr, g, 1, 256), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.dynamic_shared(&shared, nullptr, 1, 256), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.dynamic_shared(&shared, g, 0, 256), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.dynamic_shared(&shared, g, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.cluster_size(nullptr, g, launch_config()), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.cluster_size(&cluster, g, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.cluster_size(&cluster, nullptr, launch_config()), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.active_clusters(nullptr, g, launch_config()), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.active_clusters(&cluster, g, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.active_clusters(&cluster, nullptr, launch_config()), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(value, -1);
  CHECK_EQ(blocks, -1);
  CHECK_EQ(grid, -1);
  CHECK_EQ(block, -1);
  CHECK_EQ(cluster, -1);
  CHECK_EQ(shared, 7u);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(free_on(1), kCapacity);

  // Out of memory leaves the outputs alone too.
  void* filler = fill_but(kCode - 256);
  CHECK_EQ(a.func_get_attribute(&value, regs, g), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.kernel_get_attribute(&value, regs, kg, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(a.block_size(&grid, &block, g, nullptr, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(value, -1);
  CHECK_EQ(grid, -1);
  CHECK_EQ(block, -1);
  CUDA_OK(cudaFree(filler));

  // Only the kernel's calls, which name their device, need no current context.
  CUresult got = CUDA_SUCCESS, set = CUDA_SUCCESS, occupancy = CUDA_SUCCESS;
  CUresult kernel_got = CUDA_ERROR_UNKNOWN, kernel_cache = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    got = a.func_get_attribute(&value, regs, g);
    set = a.func_set_cache_config(g, CU_FUNC_CACHE_PREFER_L1);
    occupancy = a.active_blocks(&blocks, g, 256, 0);
    kernel_got = a.kernel_get_attribute(&value, regs, kg, 1);
    kernel_cache = a.kernel_set_cache_config(kg, CU_FUNC_CACHE_PREFER_L1, 1);
  }).join();
  CHECK_EQ(got, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(set, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(occupancy, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(kernel_got, CUDA_SUCCESS);
  CHECK_EQ(kernel_cache, CUDA_SUCCESS);
  CHECK_EQ(value, 32);
  CHECK_EQ(blocks, -1);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(free_on(1), kCapacity - kCode);
}

TEST_CASE("eager: attribute, cache and occupancy calls take nothing for loaded code") {
  fresh();
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  void* filler = fill_but(kCode - 256);  // not even a full device stops them
  for (const FunctionUse& use : function_uses()) {
    CAPTURE(use.name);
    CHECK_EQ(use.call(get_function(module, use.name)), CUDA_SUCCESS);
    CHECK_EQ(use.call(as_function(get_kernel(library, use.name))), CUDA_SUCCESS);
  }
  for (const KernelUse& use : kernel_uses()) {
    CAPTURE(use.name);
    const CUkernel k = get_kernel(library, use.name);
    CHECK_EQ(use.call(k, 0), CUDA_SUCCESS);
    CHECK_EQ(use.call(k, 1), CUDA_SUCCESS);
  }
  CHECK_EQ(free_bytes(), kCode - 256);
  CHECK_EQ(free_on(1), kCapacity);
  CUDA_OK(cudaFree(filler));

  // Unloaded, their functions and kernels are refused.
  const CUfunction f = get_function(module, "f");
  const CUkernel k = get_kernel(library, "k");
  CHECK_EQ(api().module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(api().library_unload(library), CUDA_SUCCESS);
  for (const FunctionUse& use : function_uses()) {
    CAPTURE(use.name);
    CHECK_EQ(use.call(f), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(use.call(as_function(k)), CUDA_ERROR_INVALID_HANDLE);
  }
  for (const KernelUse& use : kernel_uses()) {
    CAPTURE(use.name);
    CHECK_EQ(use.call(k, 1), CUDA_ERROR_INVALID_HANDLE);
  }
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity);
}

TEST_CASE("lazy: a library's kernels load at their first attribute, cache or occupancy call") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  size_t taken = 0, taken_on_1 = 0;
  for (const FunctionUse& use : function_uses()) {
    CAPTURE(use.name);
    const CUkernel k = get_kernel(library, use.name);
    CHECK_EQ(free_bytes(), kCapacity - taken);
    CHECK_EQ(use.call(as_function(k)), CUDA_SUCCESS);
    taken += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken);
    CHECK_EQ(use.call(as_function(k)), CUDA_SUCCESS);
    CHECK_EQ(kernel_function(k), as_function(k));
    CHECK_EQ(free_bytes(), kCapacity - taken);
    // A module's function was loaded by its get.
    const CUfunction f = get_function(module, use.name);
    taken += kCode;
    CHECK_EQ(use.call(f), CUDA_SUCCESS);
    CHECK_EQ(free_bytes(), kCapacity - taken);

    const std::string starved_name = std::string(use.name) + " starved";
    const CUkernel starved = get_kernel(library, starved_name.c_str());
    void* filler = fill_but(kCode - 256);
    CHECK_EQ(use.call(as_function(starved)), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(use.call(as_function(starved)), CUDA_ERROR_OUT_OF_MEMORY);
    CUDA_OK(cudaFree(filler));
    CHECK_EQ(use.call(as_function(starved)), CUDA_SUCCESS);
    taken += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken);
  }
  for (const KernelUse& use : kernel_uses()) {
    CAPTURE(use.name);
    const CUkernel k = get_kernel(library, use.name);
    CHECK_EQ(use.call(k, 1), CUDA_SUCCESS);
    taken_on_1 += kCode;
    CHECK_EQ(use.call(k, 1), CUDA_SUCCESS);
    CHECK_EQ(free_on(1), kCapacity - taken_on_1);
    CHECK_EQ(free_bytes(), kCapacity - taken);

    const std::string starved_name = std::string(use.name) + " starved";
    const CUkernel starved = get_kernel(library, starved_name.c_str());
    void* filler = fill_but(kCode - 256);
    CHECK_EQ(use.call(starved, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CUDA_OK(cudaFree(filler));
    CHECK_EQ(use.call(starved, 0), CUDA_SUCCESS);
    taken += kCode;
    CHECK_EQ(free_bytes(), kCapacity - taken);
  }

  // The unloads give it all back, on both devices, and refuse what they loaded.
  const CUkernel gone = get_kernel(library, "cuKernelGetAttribute");
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity);
  for (const FunctionUse& use : function_uses()) {
    CAPTURE(use.name);
    CHECK_EQ(use.call(as_function(gone)), CUDA_ERROR_INVALID_HANDLE);
  }
  for (const KernelUse& use : kernel_uses()) {
    CAPTURE(use.name);
    CHECK_EQ(use.call(gone, 1), CUDA_ERROR_INVALID_HANDLE);
  }
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("eager: a variable lives in its module's or library's memory and takes nothing more") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  const CUdeviceptr va = module_variable(module, "a");
  CHECK_EQ(holder(va), std::make_pair(va, kCode));  // the module's memory, from its start
  const CUdeviceptr vb = module_variable(module, "b");
  CHECK_EQ(vb, va + kVariable);
  CHECK_EQ(module_variable(module, "a"), va);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(counter("live_allocations"), 1u);

  // It holds what is written there.
  CHECK_EQ(write_word(va, 0x600dcafe), CUDA_SUCCESS);
  CHECK_EQ(write_word(vb, 0xfeed), CUDA_SUCCESS);
  CHECK_EQ(read_word(va), 0x600dcafeu);
  CHECK_EQ(read_word(vb), 0xfeedu);
  CUDA_OK(cudaMemset(reinterpret_cast<void*>(static_cast<uintptr_t>(vb)), 0, sizeof(uint64_t)));
  CHECK_EQ(read_word(vb), 0u);
  CHECK_EQ(read_word(va), 0x600dcafeu);

  // Either output may be null; a full device changes nothing.
  void* filler = fill_but(0);
  size_t bytes = 0;
  CHECK_EQ(a.module_global(nullptr, &bytes, module, "c"), CUDA_SUCCESS);
  CHECK_EQ(bytes, kVariable);
  CUdeviceptr vc = 0;
  CHECK_EQ(a.module_global(&vc, nullptr, module, "c"), CUDA_SUCCESS);
  CHECK_EQ(vc, va + 2 * kVariable);
  CUDA_OK(cudaFree(filler));

  // A library's: in its memory, on the device current at its load, whichever is current now.
  const CUlibrary library = load_library();
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  const CUdeviceptr lv = library_variable(library, "a");
  CHECK_EQ(holder(lv), std::make_pair(lv, kCode));
  CHECK(lv != va);
  CUDA_OK(cudaSetDevice(1));
  CHECK_EQ(library_variable(library, "a"), lv);
  CHECK_EQ(free_bytes(), kCapacity);
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);

  // Unloaded: refused, and the memory gone with the code.
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CUdeviceptr address = kUntouchedAddress;
  CHECK_EQ(a.module_global(&address, &bytes, module, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(write_word(va, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(a.library_global(&address, &bytes, library, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(write_word(lv, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("eager: variables with no memory to live in are refused as unsupported") {
  fresh();
  const Api& a = api();
  // A module's memory holds kCode / kVariable of them.
  const CUmodule module = load_module();
  const CUdeviceptr first = module_variable(module, "v0");
  CUdeviceptr address = 0;
  for (size_t i = 1; i < kCode / kVariable; ++i) {
    const std::string name = "v" + std::to_string(i);
    REQUIRE_EQ(a.module_global(&address, nullptr, module, name.c_str()), CUDA_SUCCESS);
  }
  CHECK_EQ(address, first + kCode - kVariable);
  address = kUntouchedAddress;
  CHECK_EQ(a.module_global(&address, nullptr, module, "one too many"), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(module_variable(module, "v1"), first + kVariable);  // the others stay
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);

  // A library stays loaded through a reset, without memory.
  const CUlibrary library = load_library();
  library_variable(library, "a");
  CHECK_EQ(a.primary_reset(0), CUDA_SUCCESS);
  CUDA_OK(cudaFree(nullptr));
  CHECK_EQ(a.library_global(&address, nullptr, library, "a"), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(a.library_global(&address, nullptr, library, "b"), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
}

TEST_CASE("lazy: a variable's first use loads it, as its function would, once a device") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  CHECK_EQ(free_bytes(), kCapacity);

  const CUdeviceptr va = module_variable(module, "a");
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(counter("live_allocations"), 1u);
  CHECK_EQ(holder(va), std::make_pair(va, kCode));  // at the start of its own load
  CHECK_EQ(module_variable(module, "a"), va);
  get_function(module, "a");  // the same load
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  const CUdeviceptr vb = module_variable(module, "b");
  CHECK(vb != va);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);

  // A library's, on the current context's device: one copy a device, each its own bytes.
  const CUdeviceptr lv0 = library_variable(library, "v");
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CUDA_OK(cudaSetDevice(1));
  const CUdeviceptr lv1 = library_variable(library, "v");
  CHECK(lv1 != lv0);
  CHECK_EQ(library_variable(library, "v"), lv1);
  CHECK_EQ(free_bytes(), kCapacity - kCode);
  CHECK_EQ(kernel_function(get_kernel(library, "v")), as_function(get_kernel(library, "v")));
  CHECK_EQ(free_bytes(), kCapacity - kCode);  // the kernel of that name: the same load
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(free_bytes(), kCapacity - 3 * kCode);
  CHECK_EQ(write_word(lv0, 10), CUDA_SUCCESS);
  CHECK_EQ(write_word(lv1, 11), CUDA_SUCCESS);
  CHECK_EQ(read_word(lv0), 10u);
  CHECK_EQ(read_word(lv1), 11u);

  // A device that cannot hold it: out of memory, the outputs untouched, nothing remembered.
  void* filler = fill_but(kCode - 256);
  CUdeviceptr address = kUntouchedAddress;
  size_t bytes = 7;
  for (int attempt = 0; attempt < 2; ++attempt) {
    CHECK_EQ(a.module_global(&address, &bytes, module, "c"), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(a.library_global(&address, &bytes, library, "c"), CUDA_ERROR_OUT_OF_MEMORY);
  }
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(bytes, 7u);
  CHECK_EQ(free_bytes(), kCode - 256);
  CUDA_OK(cudaFree(filler));
  module_variable(module, "c");
  library_variable(library, "c");
  CHECK_EQ(free_bytes(), kCapacity - 5 * kCode);

  // The unloads give the memory back; the addresses are gone with it.
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(write_word(va, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(write_word(lv0, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(free_bytes(), kCapacity);
  CHECK_EQ(free_on(1), kCapacity);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("any mode: the variable getters' arguments, handles and contexts") {
  fresh();
  const Api& a = api();
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  const size_t loaded = free_bytes();
  CUdeviceptr address = kUntouchedAddress;
  size_t bytes = 7;
  CHECK_EQ(a.module_global(nullptr, nullptr, module, "a"), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_global(&address, &bytes, module, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.module_global(&address, &bytes, nullptr, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.module_global(&address, &bytes, reinterpret_cast<CUmodule>(library), "a"),
           CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_global(nullptr, nullptr, library, "a"), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.library_global(&address, &bytes, library, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(a.library_global(&address, &bytes, nullptr, "a"), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(a.library_global(&address, &bytes, reinterpret_cast<CUlibrary>(module), "a"),
           CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(bytes, 7u);
  CHECK_EQ(free_bytes(), loaded);

  // Both need a current context.
  CUresult from_module = CUDA_SUCCESS, from_library = CUDA_SUCCESS;
  std::thread([&] {
    from_module = a.module_global(&address, &bytes, module, "a");
    from_library = a.library_global(&address, &bytes, library, "a");
  }).join();
  CHECK_EQ(from_module, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(from_library, CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(address, kUntouchedAddress);
  CHECK_EQ(free_bytes(), loaded);
  CHECK_EQ(a.module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(a.library_unload(library), CUDA_SUCCESS);
}

TEST_CASE("the resolver's rows for launches, loads, getters and uses of code") {
  simtest::Driver& drv = driver();
  constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  struct Row {
    const char* name;
    int version;
    const char* legacy;
    const char* per_thread;
  };
  const Row rows[] = {
      {"cuLaunchKernel", 7000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
      {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
      {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel",
       "cuLaunchCooperativeKernel_ptsz"},
      {"cuModuleLoad", 2000, "cuModuleLoad", "cuModuleLoad"},
      {"cuModuleLoadData", 2000, "cuModuleLoadData", "cuModuleLoadData"},
      {"cuModuleLoadDataEx", 2010, "cuModuleLoadDataEx", "cuModuleLoadDataEx"},
      {"cuModuleLoadFatBinary", 2000, "cuModuleLoadFatBinary", "cuModuleLoadFatBinary"},
      {"cuModuleUnload", 2000, "cuModuleUnload", "cuModuleUnload"},
      {"cuLibraryLoadData", 12000, "cuLibraryLoadData", "cuLibraryLoadData"},
      {"cuLibraryLoadFromFile", 12000, "cuLibraryLoadFromFile", "cuLibraryLoadFromFile"},
      {"cuLibraryUnload", 12000, "cuLibraryUnload", "cuLibraryUnload"},
      {"cuModuleGetFunction", 2000, "cuModuleGetFunction", "cuModuleGetFunction"},
      {"cuModuleGetLoadingMode", 11070, "cuModuleGetLoadingMode", "cuModuleGetLoadingMode"},
      {"cuLibraryGetKernel", 12000, "cuLibraryGetKernel", "cuLibraryGetKernel"},
      {"cuKernelGetFunction", 12000, "cuKernelGetFunction", "cuKernelGetFunction"},
      {"cuFuncLoad", 12040, "cuFuncLoad", "cuFuncLoad"},
      {"cuFuncGetAttribute", 2020, "cuFuncGetAttribute", "cuFuncGetAttribute"},
      {"cuFuncSetAttribute", 9000, "cuFuncSetAttribute", "cuFuncSetAttribute"},
      {"cuFuncSetCacheConfig", 3000, "cuFuncSetCacheConfig", "cuFuncSetCacheConfig"},
      {"cuKernelGetAttribute", 12000, "cuKernelGetAttribute", "cuKernelGetAttribute"},
      {"cuKernelSetAttribute", 12000, "cuKernelSetAttribute", "cuKernelSetAttribute"},
      {"cuKernelSetCacheConfig", 12000, "cuKernelSetCacheConfig", "cuKernelSetCacheConfig"},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,
       "cuOccupancyMaxActiveBlocksPerMultiprocessor",
       "cuOccupancyMaxActiveBlocksPerMultiprocessor"},
      {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000,
       "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
       "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"},
      {"cuOccupancyMaxPotentialBlockSize", 6050, "cuOccupancyMaxPotentialBlockSize",
       "cuOccupancyMaxPotentialBlockSize"},
      {"cuOccupancyMaxPotentialBlockSizeWithFlags", 7000,
       "cuOccupancyMaxPotentialBlockSizeWithFlags", "cuOccupancyMaxPotentialBlockSizeWithFlags"},
      {"cuOccupancyAvailableDynamicSMemPerBlock", 10020, "cuOccupancyAvailableDynamicSMemPerBlock",
       "cuOccupancyAvailableDynamicSMemPerBlock"},
      {"cuOccupancyMaxPotentialClusterSize", 11070, "cuOccupancyMaxPotentialClusterSize",
       "cuOccupancyMaxPotentialClusterSize"},
      {"cuOccupancyMaxActiveClusters", 11070, "cuOccupancyMaxActiveClusters",
       "cuOccupancyMaxActiveClusters"},
      {"cuLibraryGetGlobal", 12000, "cuLibraryGetGlobal", "cuLibraryGetGlobal"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    CHECK_EQ(drv.get<void*>(row.name, row.version), dlsym(drv.lib, row.legacy));
    CHECK_EQ(drv.get<void*>(row.name, 13000), dlsym(drv.lib, row.legacy));
    CHECK_EQ(drv.get<void*>(row.name, row.version, kPerThread), dlsym(drv.lib, row.per_thread));
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    // cuLaunchKernel's legacy form is older (4000) than its per-thread one.
    const int before = std::strcmp(row.name, "cuLaunchKernel") == 0 ? 3020 : row.version - 10;
    CHECK_EQ(drv.get_proc(row.name, &fn, before, 0, &status), CUDA_SUCCESS);
    CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  }
  CHECK_EQ(drv.get<void*>("cuLaunchKernel", 4000), dlsym(drv.lib, "cuLaunchKernel"));
  // cuModuleGetGlobal's 32-bit CUDA 2.0 form is the generated fallback, before CUDA 3.2.
  CHECK_EQ(drv.get<void*>("cuModuleGetGlobal", 2000), dlsym(drv.lib, "cuModuleGetGlobal"));
  CHECK_EQ(drv.get<void*>("cuModuleGetGlobal", 3010), dlsym(drv.lib, "cuModuleGetGlobal"));
  CHECK_EQ(drv.get<void*>("cuModuleGetGlobal", 3020), dlsym(drv.lib, "cuModuleGetGlobal_v2"));
  CHECK_EQ(drv.get<void*>("cuModuleGetGlobal", 13000), dlsym(drv.lib, "cuModuleGetGlobal_v2"));
  CHECK(dlsym(drv.lib, "cuModuleGetGlobal") != dlsym(drv.lib, "cuModuleGetGlobal_v2"));
}

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--knob-zero") == 0) return knob_zero_child();
  if (argc == 2 && std::strcmp(argv[1], "--routing") == 0) return routing_child();
  if (argc == 2 && std::strcmp(argv[1], "--mode") == 0) return mode_child();
  if (argc == 2 && std::strcmp(argv[1], "--lazy") == 0) {
    dup2(2, 1);  // doctest's report where run_child reads
    doctest::Context context;
    context.addFilter("test-case", "lazy: *,any mode: *");
    return context.run();
  }
  simtest::exit_77_without_stand_in(kProgram);
  const char* knob = std::getenv("SIMCUDA_CODE_BYTES");
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  if (!knob || std::strcmp(knob, "4M") != 0 || !mode || std::strcmp(mode, "EAGER") != 0) {
    std::fprintf(stderr,
                 "%s: expects SIMCUDA_CODE_BYTES=4M and CUDA_MODULE_LOADING=EAGER (meson.build "
                 "sets them)\n",
                 kProgram);
    return 1;
  }
  doctest::Context context(argc, argv);
  context.addFilter("test-case-exclude", "lazy: *");
  return context.run();
}
