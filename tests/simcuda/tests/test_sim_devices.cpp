// Devices, contexts, versions and errors: device count, the per-thread current device,
// properties and attributes, synchronize/reset, versions, last-error and sticky-error rules,
// error names. Runs with SIMCUDA_DEVICES=2; multi-device checks skip on a one-GPU machine.
#include <cstring>
#include <string>

#include "sim_test.h"

using simtest::stand_in;

TEST_CASE("device count and per-thread current device") {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  REQUIRE(count >= 1);
  CHECK_EQ(cudaGetDeviceCount(nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
  int device = -1;
  CUDA_OK(cudaGetDevice(&device));
  CHECK_EQ(device, 0);
  CHECK_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  CHECK_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  CUDA_OK(cudaGetDevice(&device));
  CHECK_EQ(device, 0);  // a refused cudaSetDevice changes nothing
  SIM_SKIP_REST_UNLESS(count >= 2, "the per-thread device needs a second device");
  CUDA_OK(cudaSetDevice(1));
  int other_thread_device = -1;
  std::thread([&] { cudaGetDevice(&other_thread_device); }).join();
  CHECK_EQ(other_thread_device, 0);  // the current device is per host thread
  CUDA_OK(cudaGetDevice(&device));
  CHECK_EQ(device, 1);
  CUDA_OK(cudaSetDevice(0));
}

TEST_CASE("properties and attributes") {
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  CHECK_EQ(prop.totalGlobalMem, total);
  CHECK(std::strlen(prop.name) > 0);
  CHECK(prop.major >= 6);
  int value = -1;
  CUDA_OK(cudaDeviceGetAttribute(&value, cudaDevAttrTexturePitchAlignment, 0));
  CHECK(value > 0);
  CHECK_EQ(static_cast<size_t>(value), prop.texturePitchAlignment);
  CUDA_OK(cudaDeviceGetAttribute(&value, cudaDevAttrConcurrentManagedAccess, 0));
  CHECK_EQ(value, prop.concurrentManagedAccess);
  CUDA_OK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, 0));
  CHECK_EQ(value, prop.multiProcessorCount);
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  CHECK_EQ(cudaGetDeviceProperties(&prop, count), cudaErrorInvalidDevice);
  CHECK_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrWarpSize, count), cudaErrorInvalidDevice);
  CHECK_EQ(cudaDeviceGetAttribute(nullptr, cudaDevAttrWarpSize, 0), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("versions") {
  int runtime = 0, driver = 0;
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  CUDA_OK(cudaDriverGetVersion(&driver));
  CHECK(runtime >= 13000);
  CHECK(driver >= runtime);
  CHECK_EQ(cudaRuntimeGetVersion(nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("last error: set by a failing call, read once, not overwritten by success") {
  cudaGetLastError();
  CHECK_EQ(cudaPeekAtLastError(), cudaSuccess);
  void* p = nullptr;
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  CHECK_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));  // a success does not clear it
  CHECK_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaSuccess);
  // The last error is per host thread.
  CHECK_EQ(cudaFree(reinterpret_cast<void*>(0x1234)), cudaErrorInvalidValue);
  cudaError_t seen = cudaErrorUnknown;
  std::thread([&] { seen = cudaPeekAtLastError(); }).join();
  CHECK_EQ(seen, cudaSuccess);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST_CASE("sticky errors cannot be cleared (stand-in injection)" * STAND_IN_ONLY) {
  if (!stand_in()) return;  // a real sticky error would poison the rest of this process
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, 256));
  stand_in()->set_sticky_error(cudaErrorIllegalAddress);
  CHECK_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  CHECK_EQ(cudaMalloc(&p, 256), cudaErrorIllegalAddress);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // still there
  CHECK_EQ(cudaPeekAtLastError(), cudaErrorIllegalAddress);
  stand_in()->set_sticky_error(cudaSuccess);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // the last call's error, once
  CHECK_EQ(cudaGetLastError(), cudaSuccess);
  CUDA_OK(cudaFree(p));
}

TEST_CASE("error names and strings") {
  CHECK_EQ(std::string(cudaGetErrorName(cudaSuccess)), "cudaSuccess");
  CHECK_EQ(std::string(cudaGetErrorName(cudaErrorMemoryAllocation)), "cudaErrorMemoryAllocation");
  CHECK_EQ(std::string(cudaGetErrorName(cudaErrorStreamCaptureUnsupported)),
           "cudaErrorStreamCaptureUnsupported");
  CHECK_EQ(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)), "out of memory");
  CHECK_EQ(std::string(cudaGetErrorString(cudaErrorInvalidValue)), "invalid argument");
  CHECK(cudaGetErrorString(static_cast<cudaError_t>(9999)) != nullptr);
}

TEST_CASE("device synchronize waits for every stream; reset frees the device's memory") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<int> ran{0};
  auto bump = [](void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); };
  for (int i = 0; i < 10; ++i) CUDA_OK(cudaLaunchHostFunc(s, bump, &ran));
  CUDA_OK(cudaLaunchHostFunc(cudaStreamLegacy, bump, &ran));
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(ran.load(), 11);
  CUDA_OK(cudaStreamDestroy(s));

  size_t free_before = 0, total = 0, free_after = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, 64 << 20));
  CUDA_OK(cudaDeviceReset());
  CUDA_OK(cudaMemGetInfo(&free_after, &total));
  if (stand_in()) {
    CHECK_EQ(free_after, free_before);
    CHECK_EQ(simtest::counter("live_allocations"), 0u);
  } else {
    CHECK(free_after + (32 << 20) >= free_before);  // the real context's own use may vary
  }
}

TEST_CASE("each device has its own memory and capacity" *
          doctest::skip(simtest::device_count() < 2)) {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  REQUIRE(count >= 2);
  void* p0 = nullptr;
  void* p1 = nullptr;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMalloc(&p0, 1 << 20));
  size_t free0 = 0, total = 0, free1 = 0;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  CUDA_OK(cudaSetDevice(1));
  size_t free1_before = 0;
  CUDA_OK(cudaMemGetInfo(&free1_before, &total));
  CUDA_OK(cudaMalloc(&p1, 1 << 20));
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  CHECK(free1_before - free1 >= (1u << 20));
  cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, p0));
  CHECK_EQ(attr.device, 0);
  CUDA_OK(cudaPointerGetAttributes(&attr, p1));
  CHECK_EQ(attr.device, 1);
  cudaStream_t s1;
  CUDA_OK(cudaStreamCreate(&s1));
  int stream_device = -1;
  CUDA_OK(cudaStreamGetDevice(s1, &stream_device));
  CHECK_EQ(stream_device, 1);
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaFree(p1));
  CUDA_OK(cudaSetDevice(0));
  size_t free0_after = 0;
  CUDA_OK(cudaMemGetInfo(&free0_after, &total));
  if (simtest::stand_in()) CHECK_EQ(free0_after, free0);  // device 1's traffic left device 0 alone
  CUDA_OK(cudaFree(p0));
}

TEST_CASE("peer access: asked, enabled once, disabled once" *
          doctest::skip(simtest::device_count() < 2)) {
  int can = -1;
  CUDA_OK(cudaDeviceCanAccessPeer(&can, 0, 0));
  CHECK_EQ(can, 0);  // a device is not its own peer
  CUDA_OK(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (can == 0) return;  // a GPU pair without peer access
  CHECK_EQ(cudaDeviceCanAccessPeer(nullptr, 0, 1), cudaErrorInvalidValue);
  CHECK_EQ(cudaDeviceCanAccessPeer(&can, 0, 64), cudaErrorInvalidDevice);
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
  CHECK_EQ(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
  CHECK_EQ(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
  CUDA_OK(cudaDeviceEnablePeerAccess(1, 0));
  CHECK_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
  CUDA_OK(cudaDeviceDisablePeerAccess(1));
  CHECK_EQ(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
  cudaGetLastError();
}
