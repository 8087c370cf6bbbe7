// The device memory code takes (SIMCUDA_CODE_BYTES; Note [Code memory] in code.cpp): a kernel's
// first launch on a device loads its module, which takes that much of the device (the launch is
// out of memory, and remembers nothing, when the device cannot hold it), before the stand-in
// refuses the launch as device code it cannot run; explicit module and library loads take it
// until unloaded; a device reset gives it all back. Through the runtime's launches (the function
// pointer or cudaKernel_t is the kernel) and the driver's (the CUfunction is).
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

TEST_CASE("the resolver's rows for launches and loads") {
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
  simtest::exit_77_without_stand_in(kProgram);
  const char* knob = std::getenv("SIMCUDA_CODE_BYTES");
  if (!knob || std::strcmp(knob, "4M") != 0) {
    std::fprintf(stderr, "%s: expects SIMCUDA_CODE_BYTES=4M (meson.build sets it)\n", kProgram);
    return 1;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
