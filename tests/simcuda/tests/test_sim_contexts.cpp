// Driver initialization and contexts as mixed runtime/driver programs see them: after the
// runtime's first call the driver needs no cuInit and the primary context is current; contexts
// made with cuCtxCreate have their own identity and stack on the thread's current one; a primary
// context's references, its reset, the reset its last release performs, and its destroy refused.
// Runs with two devices: device 1 is never touched by the runtime, so the program alone holds
// references on its primary context.
#include "driver_test.h"

using simtest::counter;
using simtest::driver;
using simtest::stand_in;

namespace {

CUcontext current() {
  CUcontext ctx = nullptr;
  REQUIRE_EQ(driver().get<decltype(&cuCtxGetCurrent)>("cuCtxGetCurrent")(&ctx), CUDA_SUCCESS);
  return ctx;
}

unsigned long long id_of(CUcontext ctx) {
  unsigned long long id = 0;
  REQUIRE_EQ(driver().get<decltype(&cuCtxGetId)>("cuCtxGetId")(ctx, &id), CUDA_SUCCESS);
  return id;
}

bool active(CUdevice dev) {
  unsigned flags = 0;
  int is_active = -1;
  auto state = driver().get<decltype(&cuDevicePrimaryCtxGetState)>("cuDevicePrimaryCtxGetState");
  REQUIRE_EQ(state(dev, &flags, &is_active), CUDA_SUCCESS);
  return is_active != 0;
}

// The entry points the cases share.
struct Api {
  decltype(&cuDevicePrimaryCtxRetain) retain =
      driver().get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  decltype(&cuDevicePrimaryCtxRelease_v2) release =
      driver().get<decltype(&cuDevicePrimaryCtxRelease_v2)>("cuDevicePrimaryCtxRelease", 11000);
  decltype(&cuCtxSetCurrent) set_current =
      driver().get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent");
  decltype(&cuCtxDestroy_v2) destroy =
      driver().get<decltype(&cuCtxDestroy_v2)>("cuCtxDestroy", 4000);
  decltype(&cuMemAlloc_v2) mem_alloc = driver().get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020);
  decltype(&cuMemFree_v2) mem_free = driver().get<decltype(&cuMemFree_v2)>("cuMemFree", 3020);
};

const Api& api() {
  static const Api shared;
  return shared;
}

}  // namespace

// First in this program: nothing has called cuInit.
TEST_CASE("after the runtime's first call the driver is initialized and the context current") {
  CUDA_OK(cudaFree(nullptr));
  CUcontext ctx = current();
  REQUIRE(ctx != nullptr);
  CUdevice dev = -1;
  CHECK_EQ(driver().get<decltype(&cuCtxGetDevice)>("cuCtxGetDevice", 2000)(&dev), CUDA_SUCCESS);
  CHECK_EQ(dev, 0);
  CUdeviceptr p = 0;
  CHECK_EQ(driver().get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020)(&p, 4096), CUDA_SUCCESS);
  CHECK_EQ(driver().get<decltype(&cuMemFree_v2)>("cuMemFree", 3020)(p), CUDA_SUCCESS);
  CHECK(active(0));
}

TEST_CASE("cuCtxCreate: a context of its own, pushed on the thread's current one") {
  CUDA_OK(cudaFree(nullptr));
  CUcontext primary = current();
  auto create = driver().get<decltype(&cuCtxCreate_v4)>("cuCtxCreate", 12050);
  CUcontext own = nullptr;
  REQUIRE_EQ(create(&own, nullptr, 0, 0), CUDA_SUCCESS);
  CHECK(own != primary);
  CHECK_EQ(current(), own);
  CHECK(id_of(own) != id_of(primary));
  CHECK_EQ(id_of(nullptr), id_of(own));  // NULL: the current context
  CUdeviceptr p = 0;
  CHECK_EQ(driver().get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 3020)(&p, 4096), CUDA_SUCCESS);
  CHECK_EQ(driver().get<decltype(&cuMemFree_v2)>("cuMemFree", 3020)(p), CUDA_SUCCESS);
  CHECK_EQ(api().set_current(primary), CUDA_SUCCESS);
  CHECK_EQ(api().set_current(own), CUDA_SUCCESS);
  // Destroying the current context pops it: the one below is current again.
  CHECK_EQ(api().destroy(own), CUDA_SUCCESS);
  CHECK_EQ(current(), primary);
  CHECK_EQ(create(&own, nullptr, 0, 0), CUDA_SUCCESS);
  CHECK_EQ(api().destroy(own), CUDA_SUCCESS);
}

TEST_CASE("the last release of a primary context resets its device" *
          doctest::skip(simtest::device_count() < 2)) {
  std::thread([&] {
    CHECK_FALSE(active(1));
    CUcontext ctx = nullptr;
    REQUIRE_EQ(api().retain(&ctx, 1), CUDA_SUCCESS);
    CHECK_EQ(api().retain(&ctx, 1), CUDA_SUCCESS);
    CHECK(active(1));
    REQUIRE_EQ(api().set_current(ctx), CUDA_SUCCESS);
    CUdeviceptr kept = 0;
    REQUIRE_EQ(api().mem_alloc(&kept, 1 << 20), CUDA_SUCCESS);
    const uint64_t live = counter("live_allocations");
    CHECK_EQ(api().release(1), CUDA_SUCCESS);
    CHECK(active(1));  // one reference left: nothing happened
    CHECK_EQ(api().release(1), CUDA_SUCCESS);
    CHECK_FALSE(active(1));
    if (stand_in()) CHECK_EQ(counter("live_allocations"), live - 1);
    CHECK_EQ(api().release(1), CUDA_ERROR_INVALID_CONTEXT);  // nothing left to release
    REQUIRE_EQ(api().retain(&ctx, 1), CUDA_SUCCESS);
    REQUIRE_EQ(api().set_current(ctx), CUDA_SUCCESS);
    CHECK(api().mem_free(kept) != CUDA_SUCCESS);  // the reset took it
    CUdeviceptr fresh = 0;
    CHECK_EQ(api().mem_alloc(&fresh, 1 << 20), CUDA_SUCCESS);
    CHECK_EQ(api().mem_free(fresh), CUDA_SUCCESS);
    CHECK_EQ(api().release(1), CUDA_SUCCESS);
    CHECK_EQ(api().set_current(nullptr), CUDA_SUCCESS);
  }).join();
}

// As on an H200 (driver 580): the reset destroys the context its old handle names (it can be
// made current, and an allocation in it fails with 709), keeps the references, and a retain
// gives the new primary context.
TEST_CASE("cuDevicePrimaryCtxReset frees the memory and destroys the old handle's context" *
          doctest::skip(simtest::device_count() < 2)) {
  auto reset =
      driver().get<decltype(&cuDevicePrimaryCtxReset_v2)>("cuDevicePrimaryCtxReset", 11000);
  std::thread([&] {
    CUcontext ctx = nullptr;
    REQUIRE_EQ(api().retain(&ctx, 1), CUDA_SUCCESS);
    REQUIRE_EQ(api().set_current(ctx), CUDA_SUCCESS);
    CUdeviceptr gone = 0;
    REQUIRE_EQ(api().mem_alloc(&gone, 1 << 20), CUDA_SUCCESS);
    CHECK_EQ(reset(1), CUDA_SUCCESS);
    CHECK(active(1));  // a reset does not release
    CHECK(api().mem_free(gone) != CUDA_SUCCESS);
    CUdeviceptr fresh = 0;
    REQUIRE_EQ(api().set_current(ctx), CUDA_SUCCESS);
    CHECK_EQ(api().mem_alloc(&fresh, 1 << 20), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CUcontext renewed = nullptr;
    REQUIRE_EQ(api().retain(&renewed, 1), CUDA_SUCCESS);
    CHECK(renewed != ctx);
    REQUIRE_EQ(api().set_current(renewed), CUDA_SUCCESS);
    CHECK_EQ(api().mem_alloc(&fresh, 1 << 20), CUDA_SUCCESS);
    CHECK_EQ(api().mem_free(fresh), CUDA_SUCCESS);
    CHECK_EQ(api().release(1), CUDA_SUCCESS);  // the reference taken before the reset
    CHECK(active(1));
    CHECK_EQ(api().release(1), CUDA_SUCCESS);
    CHECK_EQ(api().set_current(nullptr), CUDA_SUCCESS);
  }).join();
}

// The real driver refuses to destroy a primary context (CUDA 13, driver 580) and leaves it as it
// was: current, its memory live.
TEST_CASE("cuCtxDestroy of a primary context is refused") {
  std::thread([&] {
    CUcontext ctx = nullptr;
    REQUIRE_EQ(api().retain(&ctx, 0), CUDA_SUCCESS);
    REQUIRE_EQ(api().set_current(ctx), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    REQUIRE_EQ(api().mem_alloc(&p, 1 << 20), CUDA_SUCCESS);
    const uint64_t live = stand_in() ? counter("live_allocations") : 0;
    CHECK_EQ(api().destroy(ctx), CUDA_ERROR_INVALID_CONTEXT);
    if (stand_in()) CHECK_EQ(counter("live_allocations"), live);
    CHECK_EQ(current(), ctx);
    CHECK_EQ(api().mem_free(p), CUDA_SUCCESS);
    CHECK_EQ(api().release(0), CUDA_SUCCESS);
    CHECK_EQ(api().set_current(nullptr), CUDA_SUCCESS);
  }).join();
}
