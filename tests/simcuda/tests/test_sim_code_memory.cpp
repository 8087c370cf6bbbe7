// The device memory code takes (SIMCUDA_CODE_BYTES; Note [Code memory] in code.cpp): a kernel's
// first launch on a device loads its module, which takes that much of the device (the launch is
// out of memory, and remembers nothing, when the device cannot hold it), before the stand-in
// refuses the launch as device code it cannot run; explicit module and library loads take it
// until unloaded; a device reset gives it all back. Through the runtime's launches (the function
// pointer or cudaKernel_t is the kernel) and the driver's (the CUfunction is). The functions and
// kernels got from loaded code (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction,
// cuFuncLoad) take nothing more when loading is eager (CUDA_MODULE_LOADING unset or EAGER, this
// program); the cases named "lazy: ..." run in a child with CUDA_MODULE_LOADING=LAZY, where loads
// take nothing and each function loads at its first use, and "any mode: ..." in both.
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

// The number of "lazy: ..." and "any mode: ..." cases: the lazy child must run them all.
constexpr int kLazyChildCases = 7;

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
          "nothing") {
  int status = 0;
  const std::string err = simtest::run_child("--knob-zero", {"SIMCUDA_CODE_BYTES=0"}, &status);
  INFO(err);
  REQUIRE(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  CHECK_EQ(count(err, "simcuda: cuLaunchKernel is not supported by the CUDA stand-in"),
           kStaticRuntime ? 3 : 1);
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

TEST_CASE("lazy: threads getting one function at once load it once") {
  fresh();
  constexpr int kThreads = 8;
  const CUmodule module = load_module();
  const CUlibrary library = load_library();
  const CUkernel kernel = get_kernel(library, "shared");
  std::atomic<int> ready{0};
  std::atomic<int> wrong{0};
  std::vector<CUfunction> got(kThreads);
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
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK_EQ(wrong.load(), 0);
  for (CUfunction f : got) CHECK_EQ(f, got[0]);
  CHECK_EQ(free_bytes(), kCapacity - 2 * kCode);
  CHECK_EQ(counter("live_allocations"), 2u);
  CHECK_EQ(api().module_unload(module), CUDA_SUCCESS);
  CHECK_EQ(api().library_unload(library), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), kCapacity);
}

TEST_CASE("the resolver's rows for launches, loads and getters") {
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
    CHECK_EQ(drv.get_proc(row.name, &fn, before, 0, &status), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  }
  CHECK_EQ(drv.get<void*>("cuLaunchKernel", 4000), dlsym(drv.lib, "cuLaunchKernel"));
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
