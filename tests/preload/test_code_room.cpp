// Preload test: code the driver loads finds the room plain CUDA would have left it (Note
// [Launches short of memory] in interpose/hooks.cpp). On the stand-in every module takes
// SIMCUDA_CODE_BYTES (64 MiB here) of the 4 GiB device, a kernel's at its first launch. Before
// each load the program frees a buffer sized to leave half of that free, whose page the pools
// keep idle; every load then succeeds, as it does without the library: the runtime's launches
// (which the stand-in goes on to refuse as device code it cannot run, so the last-error slot must
// hold exactly that refusal), the driver's launches, called and resolved, the calls that ask
// about a kernel or tune it (attributes, cache configuration, occupancy), explicit module and
// library loads, and with lazy loading the calls that load a module's or library's kernels or
// variables (test_static_runtime.cpp has a program whose runtime reaches the driver's launch
// itself). A launch short of memory that only live buffers hold, or a buffer freed onto a parked
// stream, still fails, at once and with the driver's error. Runs on the stand-in only: a GPU
// would need real kernels.
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "check.h"

extern "C" {
cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args,
                                  size_t shared, cudaStream_t stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared, cudaStream_t stream);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void** kernelParams, void** extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void** kernelParams);
}

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

constexpr std::size_t kCode = 64u << 20;  // SIMCUDA_CODE_BYTES in meson.build

// The functions launched: each address is a kernel of its own to the stand-in, whose module
// loads at its first launch.
char g_kernels[64];
int g_next_kernel = 0;

const void* new_kernel() {
  CHECK(g_next_kernel < static_cast<int>(sizeof g_kernels));
  return &g_kernels[g_next_kernel++];
}

CUfunction new_function() { return reinterpret_cast<CUfunction>(const_cast<void*>(new_kernel())); }

// The driver's free bytes, as the real runtime reports them (the library's cudaMemGetInfo
// counts its idle pages as free).
std::size_t driver_free() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK_CUDA(preload_test::real<decltype(&cudaMemGetInfo)>("cudaMemGetInfo")(&free_bytes,
                                                                              &total_bytes));
  return free_bytes;
}

// Frees a buffer that took all but half a module's room: its page stays with the pools, idle,
// and the driver has too little free for the next load.
void leave_too_little_free() {
  const std::size_t buffer = (driver_free() - kCode / 2) & ~((std::size_t{1} << 20) - 1);
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, buffer));
  CHECK_CUDA(cudaFree(ptr));
  CHECK_MSG(driver_free() < kCode, "the freed buffer's page did not stay with the pools");
}

// A runtime launch beside an idle page: refused only as device code the stand-in cannot run, and
// the last-error slot holds that refusal and nothing else.
void runtime_launch(const char* what, const std::function<cudaError_t(const void*)>& launch) {
  leave_too_little_free();
  const cudaError_t result = launch(new_kernel());
  CHECK_MSG(result == cudaErrorNotSupported,
            std::string(what) + " beside idle pages: " + preload_test::error_text(result));
  CHECK_MSG(cudaGetLastError() == cudaErrorNotSupported, std::string(what) + ": last error");
  CHECK_MSG(cudaGetLastError() == cudaSuccess, std::string(what) + ": last error not cleared");
}

// A driver launch or load beside an idle page: `call` answers what the stand-in answers with
// room enough.
void driver_call(const char* what, CUresult expected, const std::function<CUresult()>& call) {
  leave_too_little_free();
  const CUresult result = call();
  CHECK_MSG(result == expected,
            std::string(what) + " beside idle pages: CUresult " + std::to_string(result));
}

constexpr dim3 kOne{1, 1, 1};

void launches_through_the_runtime() {
  runtime_launch("cudaLaunchKernel", [](const void* kernel) {
    return cudaLaunchKernel(kernel, kOne, kOne, nullptr, 0, nullptr);
  });
  runtime_launch("cudaLaunchKernel_ptsz", [](const void* kernel) {
    return cudaLaunchKernel_ptsz(kernel, kOne, kOne, nullptr, 0, nullptr);
  });
  runtime_launch("__cudaLaunchKernel", [](const void* kernel) {
    return __cudaLaunchKernel(reinterpret_cast<cudaKernel_t>(const_cast<void*>(kernel)), kOne,
                              kOne, nullptr, 0, nullptr);
  });
  runtime_launch("cudaLaunchKernelExC", [](const void* kernel) {
    cudaLaunchConfig_t config{};
    config.gridDim = kOne;
    config.blockDim = kOne;
    return cudaLaunchKernelExC(&config, kernel, nullptr);
  });
  runtime_launch("cudaLaunchCooperativeKernel", [](const void* kernel) {
    return cudaLaunchCooperativeKernel(kernel, kOne, kOne, nullptr, 0, nullptr);
  });
}

void launches_through_the_driver() {
  driver_call("cuLaunchKernel", CUDA_ERROR_NOT_SUPPORTED, [] {
    return cuLaunchKernel(new_function(), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  });
  driver_call("cuLaunchKernel_ptsz", CUDA_ERROR_NOT_SUPPORTED, [] {
    return cuLaunchKernel_ptsz(new_function(), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
  });
  driver_call("cuLaunchKernelEx", CUDA_ERROR_NOT_SUPPORTED, [] {
    CUlaunchConfig config{};
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = config.blockDimY = config.blockDimZ = 1;
    return cuLaunchKernelEx(&config, new_function(), nullptr, nullptr);
  });
  driver_call("cuLaunchCooperativeKernel_ptsz", CUDA_ERROR_NOT_SUPPORTED, [] {
    return cuLaunchCooperativeKernel_ptsz(new_function(), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr);
  });
  // As a static runtime finds it: the resolver hands out the library's hook.
  driver_call("cuLaunchKernelEx_ptsz (resolved)", CUDA_ERROR_NOT_SUPPORTED, [] {
    void* fn = nullptr;
    CHECK_CU(cuGetProcAddress_v2("cuLaunchKernelEx", &fn, 13000,
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
    CUlaunchConfig config{};
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = config.blockDimY = config.blockDimZ = 1;
    return reinterpret_cast<decltype(&cuLaunchKernelEx)>(fn)(&config, new_function(), nullptr,
                                                             nullptr);
  });
}

// The calls that ask about a kernel or tune it load it too, where launches have not yet.
void kernels_asked_about() {
  const auto ask = [](const char* what, const std::function<CUresult(CUfunction)>& call) {
    driver_call(what, CUDA_SUCCESS, [&] { return call(new_function()); });
  };
  int value = 0;
  std::size_t bytes = 0;
  ask("cuFuncGetAttribute", [&](CUfunction f) {
    return cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
  });
  ask("cuFuncSetAttribute", [](CUfunction f) {
    return cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024);
  });
  ask("cuFuncSetCacheConfig",
      [](CUfunction f) { return cuFuncSetCacheConfig(f, CU_FUNC_CACHE_PREFER_L1); });
  const auto kernel = [](CUfunction f) { return reinterpret_cast<CUkernel>(f); };
  ask("cuKernelGetAttribute", [&](CUfunction f) {
    return cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel(f), 0);
  });
  ask("cuKernelSetAttribute", [&](CUfunction f) {
    return cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024, kernel(f),
                                0);
  });
  ask("cuKernelSetCacheConfig", [&](CUfunction f) {
    return cuKernelSetCacheConfig(kernel(f), CU_FUNC_CACHE_PREFER_SHARED, 0);
  });
  ask("cuOccupancyMaxActiveBlocksPerMultiprocessor", [&](CUfunction f) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessor(&value, f, 128, 0);
  });
  ask("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", [&](CUfunction f) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&value, f, 128, 0,
                                                                CU_OCCUPANCY_DEFAULT);
  });
  ask("cuOccupancyMaxPotentialBlockSize", [&](CUfunction f) {
    int grid = 0;
    return cuOccupancyMaxPotentialBlockSize(&grid, &value, f, nullptr, 0, 0);
  });
  ask("cuOccupancyMaxPotentialBlockSizeWithFlags", [&](CUfunction f) {
    int grid = 0;
    return cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &value, f, nullptr, 0, 0,
                                                     CU_OCCUPANCY_DEFAULT);
  });
  ask("cuOccupancyAvailableDynamicSMemPerBlock", [&](CUfunction f) {
    return cuOccupancyAvailableDynamicSMemPerBlock(&bytes, f, 1, 128);
  });
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  ask("cuOccupancyMaxPotentialClusterSize",
      [&](CUfunction f) { return cuOccupancyMaxPotentialClusterSize(&value, f, &config); });
  ask("cuOccupancyMaxActiveClusters",
      [&](CUfunction f) { return cuOccupancyMaxActiveClusters(&value, f, &config); });
  // As a runtime finds it: the resolver hands out the library's hook.
  ask("cuKernelGetAttribute (resolved)", [&](CUfunction f) {
    void* fn = nullptr;
    CHECK_CU(cuGetProcAddress_v2("cuKernelGetAttribute", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT,
                                 nullptr));
    return reinterpret_cast<decltype(&cuKernelGetAttribute)>(fn)(
        &value, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel(f), 0);
  });
}

// Any bytes: the stand-in loads no code from them.
const unsigned char kImage[16] = {0x7f, 'E', 'L', 'F'};

void explicit_loads(const char* program) {
  driver_call("cuModuleLoadData", CUDA_SUCCESS, [] {
    CUmodule module = nullptr;
    const CUresult result = cuModuleLoadData(&module, kImage);
    if (result == CUDA_SUCCESS) CHECK_CU(cuModuleUnload(module));
    return result;
  });
  driver_call("cuModuleLoadDataEx", CUDA_SUCCESS, [] {
    CUmodule module = nullptr;
    const CUresult result = cuModuleLoadDataEx(&module, kImage, 0, nullptr, nullptr);
    if (result == CUDA_SUCCESS) CHECK_CU(cuModuleUnload(module));
    return result;
  });
  driver_call("cuModuleLoadFatBinary", CUDA_SUCCESS, [] {
    CUmodule module = nullptr;
    const CUresult result = cuModuleLoadFatBinary(&module, kImage);
    if (result == CUDA_SUCCESS) CHECK_CU(cuModuleUnload(module));
    return result;
  });
  driver_call("cuModuleLoad", CUDA_SUCCESS, [program] {
    CUmodule module = nullptr;
    const CUresult result = cuModuleLoad(&module, program);
    if (result == CUDA_SUCCESS) CHECK_CU(cuModuleUnload(module));
    return result;
  });
  driver_call("cuLibraryLoadData", CUDA_SUCCESS, [] {
    CUlibrary library = nullptr;
    const CUresult result =
        cuLibraryLoadData(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (result == CUDA_SUCCESS) CHECK_CU(cuLibraryUnload(library));
    return result;
  });
  driver_call("cuLibraryLoadFromFile", CUDA_SUCCESS, [program] {
    CUlibrary library = nullptr;
    const CUresult result =
        cuLibraryLoadFromFile(&library, program, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (result == CUDA_SUCCESS) CHECK_CU(cuLibraryUnload(library));
    return result;
  });
}

// Run with CUDA_MODULE_LOADING=LAZY: loads take nothing, and a module's kernel loads when the
// program asks for it, a library's when it is got as a function or loaded: each finds the room.
int lazy_child() {
  CHECK_CUDA(cudaFree(nullptr));
  CUmodule module = nullptr;
  CHECK_CU(cuModuleLoadData(&module, kImage));
  driver_call("cuModuleGetFunction", CUDA_SUCCESS, [module] {
    CUfunction function = nullptr;
    return cuModuleGetFunction(&function, module, "kernel");
  });
  CUlibrary library = nullptr;
  CHECK_CU(cuLibraryLoadData(&library, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel first = nullptr;
  CUkernel second = nullptr;
  driver_call("cuLibraryGetKernel", CUDA_SUCCESS,
              [&] { return cuLibraryGetKernel(&first, library, "first"); });
  CHECK_CU(cuLibraryGetKernel(&second, library, "second"));
  driver_call("cuKernelGetFunction", CUDA_SUCCESS, [first] {
    CUfunction function = nullptr;
    return cuKernelGetFunction(&function, first);
  });
  driver_call("cuFuncLoad", CUDA_SUCCESS,
              [second] { return cuFuncLoad(reinterpret_cast<CUfunction>(second)); });
  // A module's or library's variables load it at their first use.
  CUmodule with_variable = nullptr;
  CHECK_CU(cuModuleLoadData(&with_variable, kImage));
  driver_call("cuModuleGetGlobal", CUDA_SUCCESS, [with_variable] {
    CUdeviceptr variable = 0;
    return cuModuleGetGlobal(&variable, nullptr, with_variable, "variable");
  });
  CHECK_CU(cuModuleUnload(with_variable));
  driver_call("cuLibraryGetGlobal", CUDA_SUCCESS, [library] {
    CUdeviceptr variable = 0;
    std::size_t bytes = 0;
    return cuLibraryGetGlobal(&variable, &bytes, library, "variable");
  });
  CHECK_CU(cuLibraryUnload(library));
  CHECK_CU(cuModuleUnload(module));
  std::printf("lazy child ok\n");
  return 0;
}

// Memory freed onto a stream the program has parked is not free under plain CUDA either: a
// launch short of memory fails at once rather than wait for that stream (10 s, the bound of an
// allocation's give-back), and gets the memory once the stream has passed the free.
void parked_stream_frees() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  preload_test::Gate gate;
  preload_test::park(stream, gate);
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, (driver_free() - kCode / 2) & ~((std::size_t{1} << 20) - 1)));
  CHECK_CUDA(cudaFreeAsync(buffer, stream));
  const auto start = std::chrono::steady_clock::now();
  const cudaError_t result = cudaLaunchKernel(new_kernel(), kOne, kOne, nullptr, 0, nullptr);
  CHECK_MSG(result == cudaErrorMemoryAllocation, preload_test::error_text(result));
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cuLaunchKernel(new_function(), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) ==
        CUDA_ERROR_OUT_OF_MEMORY);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK_MSG(waited < std::chrono::seconds(5), "the launches waited for the parked stream");
  gate.open.store(true);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  runtime_launch("cudaLaunchKernel after the stream passed the free", [](const void* kernel) {
    return cudaLaunchKernel(kernel, kOne, kOne, nullptr, 0, nullptr);
  });
}

// With nothing idle to give back, a launch short of memory fails as the plain one does, and the
// slot holds the refusal.
void no_room_anywhere() {
  void* held = nullptr;
  const std::size_t buffer = (driver_free() - kCode / 2) & ~((std::size_t{1} << 20) - 1);
  CHECK_CUDA(cudaMalloc(&held, buffer));
  const cudaError_t result = cudaLaunchKernel(new_kernel(), kOne, kOne, nullptr, 0, nullptr);
  CHECK_MSG(result == cudaErrorMemoryAllocation, preload_test::error_text(result));
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cuLaunchKernel(new_function(), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) ==
        CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_CUDA(cudaFree(held));
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("launches kernels that do not exist");
  if (argc > 1 && std::string(argv[1]) == "lazy") return lazy_child();
  CHECK_CUDA(cudaFree(nullptr));
  launches_through_the_runtime();
  launches_through_the_driver();
  kernels_asked_about();
  explicit_loads(argv[0]);
  parked_stream_frees();
  no_room_anywhere();
  const preload_test::ChildResult lazy =
      preload_test::run_self("lazy", {"CUDA_MODULE_LOADING=LAZY"});
  CHECK_MSG(lazy.status == 0, lazy.output);
  std::printf("ok\n");
  return 0;
}
