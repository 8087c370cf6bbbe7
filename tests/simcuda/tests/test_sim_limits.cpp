// Context limits and the synchronization of a named context. cuCtxSetLimit / cuCtxGetLimit (and
// the runtime's cudaDeviceSetLimit / cudaDeviceGetLimit, which reach them through the driver's
// resolver): the heap, printf FIFO and stack sizes reserve device memory, so a set can run out of
// memory and cuMemGetInfo sees what it took; the other limits are only kept; a device reset
// brings the defaults back. cuCtxSynchronize_v2 (CUDA 13): cuCtxSynchronize on the context it
// names. The exact figures hold on the stand-in only (Note [Limit reservations] in limits.cpp:
// it charges what a limit takes beyond its default, stacks for 132 x 2048 resident threads); a
// real driver rounds, and reserves the defaults too.
// Runs with two devices of 1 GiB.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "driver_test.h"

using simtest::counter;
using simtest::driver;
using simtest::free_bytes;
using simtest::free_on;
using simtest::stand_in;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kDefaultHeap = 8 * kMiB;
constexpr size_t kDefaultFifo = kMiB;
constexpr size_t kDefaultStack = 1024;
constexpr size_t kResidentThreads = size_t{132} * 2048;  // the stand-in's model

struct Api {
  decltype(&cuCtxSetLimit) set = driver().get<decltype(&cuCtxSetLimit)>("cuCtxSetLimit", 3010);
  decltype(&cuCtxGetLimit) get = driver().get<decltype(&cuCtxGetLimit)>("cuCtxGetLimit", 3010);
  decltype(&cuCtxGetCurrent) current =
      driver().get<decltype(&cuCtxGetCurrent)>("cuCtxGetCurrent", 4000);
  decltype(&cuCtxSetCurrent) set_current =
      driver().get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent", 4000);
  decltype(&cuCtxCreate_v4) create = driver().get<decltype(&cuCtxCreate_v4)>("cuCtxCreate", 12050);
  decltype(&cuCtxDestroy_v2) destroy =
      driver().get<decltype(&cuCtxDestroy_v2)>("cuCtxDestroy", 4000);
  decltype(&cuCtxSynchronize_v2) synchronize =
      driver().get<decltype(&cuCtxSynchronize_v2)>("cuCtxSynchronize", 13000);
};

const Api& api() {
  static const Api shared;
  return shared;
}

size_t limit(CUlimit which) {
  size_t value = 0;
  REQUIRE_EQ(api().get(&value, which), CUDA_SUCCESS);
  return value;
}

// The value read back: exactly what was set on the stand-in, at least that on a real driver
// (which may round up).
void check_reads(CUlimit which, size_t value) {
  if (stand_in())
    CHECK_EQ(limit(which), value);
  else
    CHECK(limit(which) >= value);
}

// Heap, FIFO and stack back at their defaults: nothing reserved beyond them.
void restore_defaults() {
  CHECK_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap), CUDA_SUCCESS);
  CHECK_EQ(api().set(CU_LIMIT_PRINTF_FIFO_SIZE, kDefaultFifo), CUDA_SUCCESS);
  CHECK_EQ(api().set(CU_LIMIT_STACK_SIZE, kDefaultStack), CUDA_SUCCESS);
}

CUcontext current() {
  CUcontext ctx = nullptr;
  REQUIRE_EQ(api().current(&ctx), CUDA_SUCCESS);
  return ctx;
}

}  // namespace

TEST_CASE("the heap, printf FIFO and stack sizes charge the device what they take beyond the "
          "defaults") {
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) {
    stand_in()->reset_counters();
    CHECK_EQ(limit(CU_LIMIT_MALLOC_HEAP_SIZE), kDefaultHeap);
    CHECK_EQ(limit(CU_LIMIT_PRINTF_FIFO_SIZE), kDefaultFifo);
    CHECK_EQ(limit(CU_LIMIT_STACK_SIZE), kDefaultStack);
  }
  const size_t before = free_bytes();
  const uint64_t live = counter("live_allocations");

  REQUIRE_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 16 * kMiB), CUDA_SUCCESS);
  check_reads(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 16 * kMiB);
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), 16 * kMiB);
    CHECK_EQ(counter("live_allocations"), live + 1);  // one reservation for the context
  }
  REQUIRE_EQ(api().set(CU_LIMIT_PRINTF_FIFO_SIZE, kDefaultFifo + 2 * kMiB), CUDA_SUCCESS);
  check_reads(CU_LIMIT_PRINTF_FIFO_SIZE, kDefaultFifo + 2 * kMiB);
  if (stand_in()) CHECK_EQ(before - free_bytes(), 18 * kMiB);
  REQUIRE_EQ(api().set(CU_LIMIT_STACK_SIZE, kDefaultStack + 64), CUDA_SUCCESS);
  check_reads(CU_LIMIT_STACK_SIZE, kDefaultStack + 64);
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), 18 * kMiB + 64 * kResidentThreads);
    CHECK_EQ(counter("live_allocations"), live + 1);
  }
  // Below its default a limit gives nothing back: the stand-in never charged the default.
  REQUIRE_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, 4 * kMiB), CUDA_SUCCESS);
  check_reads(CU_LIMIT_MALLOC_HEAP_SIZE, 4 * kMiB);
  if (stand_in()) CHECK_EQ(before - free_bytes(), 2 * kMiB + 64 * kResidentThreads);

  restore_defaults();
  if (stand_in()) {
    CHECK_EQ(free_bytes(), before);
    CHECK_EQ(counter("live_allocations"), live);
    CHECK_EQ(counter("cuCtxSetLimit"), 7u);
  }
}

TEST_CASE("a limit the device cannot hold is out of memory, and changes nothing" *
          STAND_IN_ONLY) {
  CUDA_OK(cudaFree(nullptr));
  const size_t empty = free_bytes();
  REQUIRE_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 16 * kMiB), CUDA_SUCCESS);
  // Fill the device but 8 MiB.
  void* filler = nullptr;
  CUDA_OK(cudaMalloc(&filler, free_bytes() - 8 * kMiB));
  CHECK_EQ(free_bytes(), 8 * kMiB);

  // 32 MiB beyond the default: the 16 MiB held now and the 8 MiB free are not enough.
  CHECK_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 32 * kMiB),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(limit(CU_LIMIT_MALLOC_HEAP_SIZE), kDefaultHeap + 16 * kMiB);
  CHECK_EQ(free_bytes(), 8 * kMiB);
  // 20 MiB fits only because the old reservation is given back first.
  CHECK_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 20 * kMiB), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), 4 * kMiB);
  // A stack of 32 bytes more on every resident thread needs 8.25 MiB.
  CHECK_EQ(api().set(CU_LIMIT_STACK_SIZE, kDefaultStack + 32), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(limit(CU_LIMIT_STACK_SIZE), kDefaultStack);
  CHECK_EQ(api().set(CU_LIMIT_PRINTF_FIFO_SIZE, kDefaultFifo + 4 * kMiB + 1),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api().set(CU_LIMIT_PRINTF_FIFO_SIZE, kDefaultFifo + 4 * kMiB), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), 0u);
  CUDA_OK(cudaFree(filler));

  // More than any device, and more than size_t counts.
  CHECK_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api().set(CU_LIMIT_STACK_SIZE, SIZE_MAX / 2), CUDA_ERROR_OUT_OF_MEMORY);
  // The runtime's code for it: 4 KiB more on each of 270336 threads is 1.03 GiB.
  CHECK_EQ(cudaDeviceSetLimit(cudaLimitStackSize, kDefaultStack + 4096),
           cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(limit(CU_LIMIT_MALLOC_HEAP_SIZE), kDefaultHeap + 20 * kMiB);
  CHECK_EQ(limit(CU_LIMIT_STACK_SIZE), kDefaultStack);
  restore_defaults();
  CHECK_EQ(free_bytes(), empty);
}

TEST_CASE("the other limits are kept without memory; unknown and removed ones are refused") {
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) stand_in()->reset_counters();
  const size_t before = free_bytes();
  const size_t launches = limit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT);
  if (stand_in()) CHECK_EQ(launches, 2048u);
  CHECK_EQ(api().set(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 4096), CUDA_SUCCESS);
  check_reads(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 4096);
  CHECK_EQ(api().set(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, launches), CUDA_SUCCESS);
  const size_t granularity = limit(CU_LIMIT_MAX_L2_FETCH_GRANULARITY);
  CHECK_EQ(api().set(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 32), CUDA_SUCCESS);
  CHECK_EQ(api().set(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, granularity), CUDA_SUCCESS);

  SIM_SKIP_REST_UNLESS(stand_in(), "the stand-in's values, codes and exact capacity");
  CHECK_EQ(granularity, 64u);
  CHECK_EQ(api().set(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 1000), CUDA_SUCCESS);
  CHECK_EQ(limit(CU_LIMIT_MAX_L2_FETCH_GRANULARITY), 128u);  // clamped to the documented range
  CHECK_EQ(api().set(CU_LIMIT_MAX_L2_FETCH_GRANULARITY, granularity), CUDA_SUCCESS);
  CHECK_EQ(limit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), 0u);
  CHECK_EQ(limit(CU_LIMIT_CIG_ENABLED), 0u);
  CHECK_EQ(limit(CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED), 1u);
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(counter("live_allocations"), 0u);

  size_t value = 0;
  // Removed from compute capability 9.0, the stand-in's.
  CHECK_EQ(api().set(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4), CUDA_ERROR_UNSUPPORTED_LIMIT);
  CHECK_EQ(api().get(&value, CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH), CUDA_ERROR_UNSUPPORTED_LIMIT);
  CHECK_EQ(api().get(&value, CU_LIMIT_SHMEM_SIZE), CUDA_ERROR_UNSUPPORTED_LIMIT);  // CIG only
  CHECK_EQ(api().set(CU_LIMIT_CIG_ENABLED, 1), CUDA_ERROR_INVALID_VALUE);  // query only
  const auto unknown = static_cast<CUlimit>(12);  // past CU_LIMIT_MAX
  CHECK_EQ(api().set(unknown, 1), CUDA_ERROR_UNSUPPORTED_LIMIT);
  CHECK_EQ(api().get(&value, unknown), CUDA_ERROR_UNSUPPORTED_LIMIT);
  CHECK_EQ(api().set(CU_LIMIT_MAX, 1), CUDA_ERROR_UNSUPPORTED_LIMIT);
  CHECK_EQ(api().get(nullptr, CU_LIMIT_STACK_SIZE), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(cudaDeviceGetLimit(nullptr, cudaLimitStackSize), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // A value cudaLimit does not name reaches the driver as it is (there: CIG shared memory).
  CHECK_EQ(cudaDeviceSetLimit(static_cast<cudaLimit>(7), 1), cudaErrorUnsupportedLimit);
  CHECK_EQ(cudaGetLastError(), cudaErrorUnsupportedLimit);
  CHECK_EQ(free_bytes(), before);
}

TEST_CASE("cudaDeviceSetLimit and cudaDeviceGetLimit reach the driver") {
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) stand_in()->reset_counters();
  const size_t before = free_bytes();
  CUDA_OK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kDefaultHeap + 32 * kMiB));
  if (stand_in()) {
    CHECK_EQ(counter("cuCtxSetLimit"), 1u);  // the driver's entry point set it
    CHECK_EQ(before - free_bytes(), 32 * kMiB);
  }
  check_reads(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 32 * kMiB);  // the same context's limit
  CHECK_EQ(api().set(CU_LIMIT_PRINTF_FIFO_SIZE, 3 * kMiB), CUDA_SUCCESS);
  size_t fifo = 0;
  CUDA_OK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
  if (stand_in()) {
    CHECK_EQ(fifo, 3 * kMiB);
    CHECK_EQ(counter("cuCtxGetLimit"), 2u);
    CHECK_EQ(before - free_bytes(), 34 * kMiB);
  } else {
    CHECK(fifo >= 3 * kMiB);
  }
  CUDA_OK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kDefaultHeap));
  CUDA_OK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, kDefaultFifo));
  if (stand_in()) CHECK_EQ(free_bytes(), before);

  // What cudaGetDriverEntryPoint hands out is the same function.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuCtxGetLimit", &fn, 3010, cudaEnableDefault,
                                           &status));
  REQUIRE_EQ(status, cudaDriverEntryPointSuccess);
  size_t heap = 0;
  CHECK_EQ(reinterpret_cast<decltype(&cuCtxGetLimit)>(fn)(&heap, CU_LIMIT_MALLOC_HEAP_SIZE),
           CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(heap, kDefaultHeap);
}

TEST_CASE("a device reset gives the reservations back and restores the defaults") {
  CUDA_OK(cudaFree(nullptr));
  const size_t before = free_bytes();
  CUDA_OK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kDefaultHeap + 64 * kMiB));
  CUDA_OK(cudaDeviceSetLimit(cudaLimitStackSize, kDefaultStack + 16));
  CUDA_OK(cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, 8192));
  if (stand_in()) CHECK_EQ(before - free_bytes(), 64 * kMiB + 16 * kResidentThreads);
  CUDA_OK(cudaDeviceReset());
  CUDA_OK(cudaFree(nullptr));  // a new primary context
  if (stand_in()) {
    CHECK_EQ(free_bytes(), before);
    CHECK_EQ(counter("live_allocations"), 0u);
    CHECK_EQ(limit(CU_LIMIT_MALLOC_HEAP_SIZE), kDefaultHeap);
    CHECK_EQ(limit(CU_LIMIT_STACK_SIZE), kDefaultStack);
    CHECK_EQ(limit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT), 2048u);
  } else {
    CHECK(limit(CU_LIMIT_MALLOC_HEAP_SIZE) < kDefaultHeap + 64 * kMiB);
  }

  // The driver's reset of the primary context does the same.
  auto reset =
      driver().get<decltype(&cuDevicePrimaryCtxReset_v2)>("cuDevicePrimaryCtxReset", 11000);
  REQUIRE_EQ(api().set(CU_LIMIT_PRINTF_FIFO_SIZE, kDefaultFifo + 8 * kMiB), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(before - free_bytes(), 8 * kMiB);
  CHECK_EQ(reset(0), CUDA_SUCCESS);
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) {
    CHECK_EQ(free_bytes(), before);
    CHECK_EQ(limit(CU_LIMIT_PRINTF_FIFO_SIZE), kDefaultFifo);
  }
}

TEST_CASE("a created context has limits of its own; destroying it gives its reservation back") {
  CUDA_OK(cudaFree(nullptr));
  const CUcontext primary = current();
  const size_t before = free_bytes();
  CUcontext own = nullptr;
  REQUIRE_EQ(api().create(&own, nullptr, 0, 0), CUDA_SUCCESS);  // current now
  REQUIRE_EQ(api().set(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 24 * kMiB), CUDA_SUCCESS);
  check_reads(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap + 24 * kMiB);
  if (stand_in()) CHECK_EQ(before - free_bytes(), 24 * kMiB);  // the same device
  REQUIRE_EQ(api().set_current(primary), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(limit(CU_LIMIT_MALLOC_HEAP_SIZE), kDefaultHeap);
  REQUIRE_EQ(api().set_current(own), CUDA_SUCCESS);
  CHECK_EQ(api().destroy(own), CUDA_SUCCESS);
  CHECK_EQ(current(), primary);
  if (stand_in()) {
    CHECK_EQ(free_bytes(), before);
    CHECK_EQ(counter("live_allocations"), 0u);
  }
}

TEST_CASE("a limit charges its context's device, not another" *
          doctest::skip(simtest::device_count() < 2 || !simtest::stand_in())) {
  CUDA_OK(cudaSetDevice(0));
  const size_t before0 = free_on(0), before1 = free_on(1);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kDefaultHeap + 40 * kMiB));
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(free_on(0), before0);
  CHECK_EQ(before1 - free_on(1), 40 * kMiB);
  size_t heap = 0;
  CUDA_OK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
  CHECK_EQ(heap, kDefaultHeap);  // device 0's primary context
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaDeviceReset());
  CUDA_OK(cudaSetDevice(0));
  CHECK_EQ(free_on(1), before1);
}

// The stand-in's rule: a reservation is an allocation, as cudaMalloc's.
TEST_CASE("a limit that reserves memory is refused during a global capture" * STAND_IN_ONLY) {
  CUDA_OK(cudaFree(nullptr));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_EQ(cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, 4096), cudaSuccess);
  CHECK_EQ(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kDefaultHeap + kMiB),
           cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  CHECK_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  CHECK_EQ(limit(CU_LIMIT_MALLOC_HEAP_SIZE), kDefaultHeap);
  CUDA_OK(cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, 2048));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_CASE("cuCtxSynchronize_v2 waits for the context it names; NULL is the current one") {
  CUDA_OK(cudaFree(nullptr));
  std::atomic<bool> done{false};
  auto slow = [](void* flag) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    static_cast<std::atomic<bool>*>(flag)->store(true);
  };
  CUDA_OK(cudaLaunchHostFunc(nullptr, slow, &done));
  CHECK_EQ(api().synchronize(nullptr), CUDA_SUCCESS);
  CHECK(done.load());

  done = false;
  CUDA_OK(cudaLaunchHostFunc(nullptr, slow, &done));
  CHECK_EQ(api().synchronize(current()), CUDA_SUCCESS);
  CHECK(done.load());

  // Illegal while the context's device captures, as cuCtxSynchronize.
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_EQ(api().synchronize(nullptr), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  cudaGraph_t graph = nullptr;
  CHECK_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(stream));

  CUcontext own = nullptr;
  REQUIRE_EQ(api().create(&own, nullptr, 0, 0), CUDA_SUCCESS);
  CHECK_EQ(api().synchronize(own), CUDA_SUCCESS);
  CHECK_EQ(api().destroy(own), CUDA_SUCCESS);
  SIM_SKIP_REST_UNLESS(stand_in(), "a destroyed context's handle may be reused by a real driver");
  CHECK_EQ(api().synchronize(own), CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

TEST_CASE("cuCtxSynchronize_v2 on another device's context waits for that device" *
          doctest::skip(simtest::device_count() < 2)) {
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaFree(nullptr));
  const CUcontext other = current();
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  std::atomic<bool> done{false};
  CUDA_OK(cudaLaunchHostFunc(
      stream,
      [](void* flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        static_cast<std::atomic<bool>*>(flag)->store(true);
      },
      &done));
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(nullptr));
  CHECK(current() != other);
  CHECK_EQ(api().synchronize(other), CUDA_SUCCESS);
  CHECK(done.load());
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_CASE("the resolver's rows for limits and synchronization" * STAND_IN_ONLY) {
  simtest::Driver& drv = driver();
  CHECK_EQ(drv.get<void*>("cuCtxSetLimit", 3010), dlsym(drv.lib, "cuCtxSetLimit"));
  CHECK_EQ(drv.get<void*>("cuCtxGetLimit", 13000), dlsym(drv.lib, "cuCtxGetLimit"));
  CHECK_EQ(drv.get<void*>("cuCtxSynchronize", 13000), dlsym(drv.lib, "cuCtxSynchronize_v2"));
  CHECK_EQ(drv.get<void*>("cuCtxSynchronize", 12090), dlsym(drv.lib, "cuCtxSynchronize"));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK_EQ(drv.get_proc("cuCtxSetLimit", &fn, 3000, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_EQ(drv.get_proc("cuCtxGetLimit", &fn, 3000, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}
