// The driver API subset, reached the way a statically linked cudart reaches it: dlopen
// ("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then cuGetProcAddress for every entry point.
// Covers init, devices, contexts (primary context bound by the runtime), allocation, memory info
// shared with the runtime, and cuGetProcAddress's name/version/flags resolution.
#include <string>

#include "driver_test.h"

using simtest::counter;
using simtest::driver;
using simtest::Driver;
using simtest::stand_in;

TEST_CASE("before cuInit the driver is not initialized; cuInit validates its flags") {
  auto count = driver().get<decltype(&cuDeviceGetCount)>("cuDeviceGetCount");
  auto init = driver().get<decltype(&cuInit)>("cuInit");
  int n = -1;
  CHECK_EQ(count(&n), CUDA_ERROR_NOT_INITIALIZED);
  CHECK_EQ(init(1), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(init(0), CUDA_SUCCESS);
  CHECK_EQ(count(&n), CUDA_SUCCESS);
  CHECK(n >= 1);
  int version = 0;
  CHECK_EQ(driver().get<decltype(&cuDriverGetVersion)>("cuDriverGetVersion")(&version),
           CUDA_SUCCESS);
  CHECK(version >= 13000);
}

TEST_CASE("devices and contexts") {
  auto device_get = driver().get<decltype(&cuDeviceGet)>("cuDeviceGet");
  auto total_mem = driver().get<decltype(&cuDeviceTotalMem_v2)>("cuDeviceTotalMem", 3020);
  auto get_current = driver().get<decltype(&cuCtxGetCurrent)>("cuCtxGetCurrent");
  auto set_current = driver().get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent");
  // From version 13000 the name gives cuCtxGetDevice_v2, which takes a context too.
  auto ctx_device = driver().get<decltype(&cuCtxGetDevice)>("cuCtxGetDevice", 2000);
  auto ctx_device_v2 = driver().get<decltype(&cuCtxGetDevice_v2)>("cuCtxGetDevice", 13000);
  auto retain = driver().get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  auto release =
      driver().get<decltype(&cuDevicePrimaryCtxRelease_v2)>("cuDevicePrimaryCtxRelease", 11000);
  auto mem_alloc = driver().get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020);
  CUdevice dev = -1;
  CHECK_EQ(device_get(&dev, 0), CUDA_SUCCESS);
  CHECK_EQ(dev, 0);
  CHECK_EQ(device_get(&dev, 4096), CUDA_ERROR_INVALID_DEVICE);
  size_t total = 0;
  CHECK_EQ(total_mem(&total, 0), CUDA_SUCCESS);
  CHECK(total > 0);

  // A fresh thread has no current context until the runtime (or cuCtxSetCurrent) binds one.
  std::thread([&] {
    CUcontext ctx = reinterpret_cast<CUcontext>(1);
    CHECK_EQ(get_current(&ctx), CUDA_SUCCESS);
    CHECK_EQ(ctx, nullptr);
    CUdevice d;
    CHECK_EQ(ctx_device(&d), CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr p = 0;
    CHECK_EQ(mem_alloc(&p, 256), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext primary = nullptr;
    CHECK_EQ(retain(&primary, 0), CUDA_SUCCESS);
    CHECK(primary != nullptr);
    CHECK_EQ(set_current(primary), CUDA_SUCCESS);
    CHECK_EQ(ctx_device(&d), CUDA_SUCCESS);
    CHECK_EQ(d, 0);
    d = -1;
    CHECK_EQ(ctx_device_v2(&d, nullptr), CUDA_SUCCESS);  // NULL: the current context
    CHECK_EQ(d, 0);
    CHECK_EQ(set_current(nullptr), CUDA_SUCCESS);
    d = -1;
    CHECK_EQ(ctx_device_v2(&d, primary), CUDA_SUCCESS);  // a named one needs none current
    CHECK_EQ(d, 0);
    // The runtime binds the device's primary context.
    CHECK_EQ(cudaFree(nullptr), cudaSuccess);
    CHECK_EQ(get_current(&ctx), CUDA_SUCCESS);
    CHECK_EQ(ctx, primary);
    CHECK_EQ(release(0), CUDA_SUCCESS);
  }).join();
}

TEST_CASE("cuMemAlloc and cudaMalloc share one device capacity") {
  CUDA_OK(cudaFree(nullptr));  // binds the primary context on this thread
  auto mem_alloc = driver().get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020);
  auto mem_free = driver().get<decltype(&cuMemFree_v2)>("cuMemFree", 3020);
  auto mem_info = driver().get<decltype(&cuMemGetInfo_v2)>("cuMemGetInfo", 3020);
  auto managed = driver().get<decltype(&cuMemAllocManaged)>("cuMemAllocManaged");
  if (stand_in()) stand_in()->reset_counters();
  const size_t chunk = 64 << 20;
  size_t free0 = 0, total = 0, free1 = 0, free2 = 0;
  CHECK_EQ(mem_info(&free0, &total), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  CHECK_EQ(mem_alloc(&d, chunk), CUDA_SUCCESS);
  CHECK_EQ(d % 256, 0u);
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  void* r = nullptr;
  CUDA_OK(cudaMalloc(&r, chunk));
  CHECK_EQ(mem_info(&free2, &total), CUDA_SUCCESS);
  CHECK(free0 - free1 >= chunk);
  CHECK(free1 - free2 >= chunk);
  if (stand_in()) {
    CHECK_EQ(free0 - free1, chunk);
    CHECK_EQ(free1 - free2, chunk);
  }
  // Each API frees the other's memory: one address space.
  CUDA_OK(cudaMemset(reinterpret_cast<void*>(d), 0, chunk));
  CHECK_EQ(mem_free(reinterpret_cast<CUdeviceptr>(r)), CUDA_SUCCESS);
  CUDA_OK(cudaFree(reinterpret_cast<void*>(d)));
  CHECK_EQ(mem_free(d), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(mem_alloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(mem_alloc(&d, total + 1), CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr m = 0;
  CHECK_EQ(managed(&m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(m)));
  CHECK_EQ(attr.type, cudaMemoryTypeManaged);
  CHECK_EQ(managed(&m, 4096, 0x40), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(mem_free(m), CUDA_SUCCESS);
  cudaGetLastError();
  if (stand_in()) {
    CHECK_EQ(counter("cuMemAlloc"), 3u);
    CHECK_EQ(counter("cuMemFree"), 3u);
    CHECK_EQ(counter("cudaMalloc"), 1u);
    CHECK_EQ(counter("live_allocations"), 0u);
  }
}

TEST_CASE("cuGetProcAddress: versions, stream flavours, unknown names, bad flags") {
  Driver& drv = driver();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  // Nothing found is a success with a NULL function: only the status says why.
  fn = reinterpret_cast<void*>(1);
  CHECK_EQ(drv.get_proc("cuNoSuchFunction", &fn, 13000, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK_EQ(fn, nullptr);
  fn = reinterpret_cast<void*>(1);
  CHECK_EQ(drv.get_proc("cuMemAllocAsync", &fn, 11000, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_EQ(fn, nullptr);
  CHECK_EQ(drv.get_proc("cuMemAlloc", &fn, 13000, 0x100, &status), CUDA_ERROR_INVALID_VALUE);
  // A GPU's driver dereferences a NULL pfn (SIGSEGV on an H200, driver 580); the stand-in refuses.
  if (stand_in()) {
    CHECK_EQ(drv.get_proc("cuMemAlloc", nullptr, 13000, 0, &status), CUDA_ERROR_INVALID_VALUE);
  }

  CHECK(drv.get<void*>("cuGetProcAddress", 12000) != nullptr);  // it resolves itself
  SIM_SKIP_REST_UNLESS(stand_in(), "the real driver may hand out internal addresses");
  CHECK_EQ(drv.get<void*>("cuGetProcAddress", 12000), reinterpret_cast<void*>(drv.get_proc));
  CHECK_EQ(drv.get<void*>("cuMemAlloc", 3020), dlsym(drv.lib, "cuMemAlloc_v2"));
  CHECK_EQ(drv.get<void*>("cuMemAlloc", 2000), dlsym(drv.lib, "cuMemAlloc"));
  CHECK_EQ(drv.get<void*>("cuMemFree", 12000), dlsym(drv.lib, "cuMemFree_v2"));
  CHECK_EQ(drv.get<void*>("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
           dlsym(drv.lib, "cuMemAllocAsync_ptsz"));
  CHECK_EQ(drv.get<void*>("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM),
           dlsym(drv.lib, "cuMemAllocAsync"));
  // A name with no per-thread flavour serves per-thread requests too.
  CHECK_EQ(drv.get<void*>("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
           dlsym(drv.lib, "cuMemAlloc_v2"));
  CHECK_EQ(drv.get<void*>("cuGetProcAddress", 11030), dlsym(drv.lib, "cuGetProcAddress"));
  // The v1 resolver (no status argument) agrees.
  auto v1 = reinterpret_cast<CUresult (*)(const char*, void**, int, cuuint64_t)>(
      dlsym(drv.lib, "cuGetProcAddress"));
  REQUIRE(static_cast<bool>(v1));
  CHECK_EQ(v1("cuMemFree", &fn, 3020, 0), CUDA_SUCCESS);
  CHECK_EQ(fn, dlsym(drv.lib, "cuMemFree_v2"));
  // Except that it reports nothing found as an error, as CUDA 11 documented it.
  CHECK_EQ(v1("cuNoSuchFunction", &fn, 13000, 0), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(fn, nullptr);
}

TEST_CASE("stream-ordered allocation through the driver") {
  CUDA_OK(cudaFree(nullptr));
  auto alloc = driver().get<decltype(&cuMemAllocAsync)>("cuMemAllocAsync", 11020);
  auto free_async = driver().get<decltype(&cuMemFreeAsync)>("cuMemFreeAsync", 11020);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUdeviceptr p = 0;
  CHECK_EQ(alloc(&p, 1 << 20, reinterpret_cast<CUstream>(s)), CUDA_SUCCESS);
  CUDA_OK(cudaMemsetAsync(reinterpret_cast<void*>(p), 0, 1 << 20, s));
  CHECK_EQ(free_async(p, reinterpret_cast<CUstream>(s)), CUDA_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaStreamDestroy(s));
  if (stand_in()) CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("cudaGetDriverEntryPoint resolves through the driver") {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &status));
  CHECK_EQ(status, cudaDriverEntryPointSuccess);
  CHECK(fn != nullptr);
  SIM_SKIP_REST_UNLESS(stand_in(), "the real driver may hand out internal addresses");
  CHECK_EQ(fn, dlsym(driver().lib, "cuMemAlloc_v2"));
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 11000, cudaEnableDefault,
                                           &status));
  CHECK_EQ(status, cudaDriverEntryPointVersionNotSufficent);
  CHECK_EQ(fn, nullptr);
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 13000, cudaEnableDefault,
                                           &status));
  CHECK_EQ(status, cudaDriverEntryPointSymbolNotFound);
  CHECK_EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 13000, 0x10, &status),
           cudaErrorInvalidValue);
  cudaGetLastError();
}
