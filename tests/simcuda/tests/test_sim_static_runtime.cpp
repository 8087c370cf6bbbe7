// The static-runtime archive (Note [Static runtime] in rt_driver.cpp): this program links
// libcudart_static_sim.a instead of libcudart.so.13, as a program built with nvcc's default
// static cudart does. Its runtime calls are its own (no dynamic cudaMalloc in the process), and
// its memory calls (arrays, mipmapped arrays, pools and device limits included) reach the driver
// through the resolver, where the driver's counters see them; after its first call the driver is
// initialized and the primary context current.
// Stand-in only (suite standin): it is linked with the stand-in.
#include <cuda.h>

#include "sim_test.h"

// The stand-in API is linked in (no dynamic symbol to look up): called directly.

TEST_CASE("the static runtime reaches the driver through cuGetProcAddress only") {
  CHECK(dlsym(RTLD_DEFAULT, "cudaMalloc") == nullptr);  // nothing to interpose
  CUDA_OK(cudaFree(nullptr));
  // No cuInit: the runtime's first call initialized the driver.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);  // loaded by the runtime, as the real static runtime does
  auto resolve =
      reinterpret_cast<decltype(&cuGetProcAddress_v2)>(dlsym(lib, "cuGetProcAddress_v2"));
  void* fn = nullptr;
  REQUIRE_EQ(resolve("cuCtxGetCurrent", &fn, 4000, 0, nullptr), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  CHECK_EQ(reinterpret_cast<decltype(&cuCtxGetCurrent)>(fn)(&ctx), CUDA_SUCCESS);
  CHECK(ctx != nullptr);

  simcuda_reset_counters();
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, 1 << 20));
  CUDA_OK(cudaMemset(p, 7, 1 << 20));
  void* zero = &p;
  CUDA_OK(cudaMalloc(&zero, 0));  // succeeds with NULL, never reaching the driver
  CHECK_EQ(zero, nullptr);
  CUDA_OK(cudaFree(p));
  CHECK_EQ(cudaFree(p), cudaErrorInvalidValue);  // the driver's answer, the runtime's code
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_EQ(simcuda_counter("cudaMalloc"), 2u);
  CHECK_EQ(simcuda_counter("cuMemAlloc"), 1u);
  CHECK_EQ(simcuda_counter("cuMemFree"), 2u);

  size_t free_bytes = 0, total_bytes = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total_bytes));
  CHECK(free_bytes <= total_bytes);
  void* managed = nullptr;
  CUDA_OK(cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal));
  CUDA_OK(cudaFree(managed));
  CHECK_EQ(simcuda_counter("cuMemFree"), 3u);

  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_OK(cudaStreamIsCapturing(stream, &status));
  CHECK_EQ(status, cudaStreamCaptureStatusActive);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CHECK(graph != nullptr);
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  CHECK_EQ(cudaStreamDestroy(stream), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST_CASE("the static runtime's arrays and explicit pools reach the driver too") {
  simcuda_reset_counters();
  const cudaChannelFormatDesc texel =
      cudaCreateChannelDesc(8, 8, 8, 8, cudaChannelFormatKindUnsigned);
  cudaArray_t array = nullptr;
  CUDA_OK(cudaMallocArray(&array, &texel, 256, 256, cudaArrayDefault));
  CUDA_OK(cudaFreeArray(array));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  cudaMemPool_t pool = nullptr;
  CUDA_OK(cudaMemPoolCreate(&pool, &props));
  void* p = nullptr;
  CUDA_OK(cudaMallocFromPoolAsync(&p, 1 << 20, pool, nullptr));
  CUDA_OK(cudaFreeAsync(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemPoolDestroy(pool));
  CHECK_EQ(simcuda_counter("cuArrayCreate"), 1u);
  CHECK_EQ(simcuda_counter("cuArrayDestroy"), 1u);
  CHECK_EQ(simcuda_counter("cuMemAllocFromPoolAsync"), 1u);
  CHECK_EQ(simcuda_counter("live_allocations"), 0u);
}

TEST_CASE("the static runtime's mipmapped arrays and device limits reach the driver too") {
  simcuda_reset_counters();
  size_t free_before = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  const cudaChannelFormatDesc texel =
      cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
  cudaMipmappedArray_t mipmap = nullptr;
  CUDA_OK(cudaMallocMipmappedArray(&mipmap, &texel, cudaExtent{256, 256, 0}, 9, 0));
  cudaArray_t level = nullptr;
  CUDA_OK(cudaGetMipmappedArrayLevel(&level, mipmap, 8));
  CUDA_OK(cudaFreeMipmappedArray(mipmap));
  CUDA_OK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, size_t{16} << 20));
  size_t heap = 0, free_now = 0;
  CUDA_OK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
  CHECK_EQ(heap, size_t{16} << 20);
  CUDA_OK(cudaMemGetInfo(&free_now, &total));
  CHECK_EQ(free_before - free_now, size_t{8} << 20);  // beyond the 8 MiB default
  CUDA_OK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, size_t{8} << 20));
  CHECK_EQ(simcuda_counter("cuMipmappedArrayCreate"), 1u);
  CHECK_EQ(simcuda_counter("cuMipmappedArrayDestroy"), 1u);
  CHECK_EQ(simcuda_counter("cuCtxSetLimit"), 2u);
  CHECK_EQ(simcuda_counter("cuCtxGetLimit"), 1u);
  CHECK_EQ(simcuda_counter("live_allocations"), 0u);
}
