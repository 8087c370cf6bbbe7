// Device memory outside cudaMalloc / cuMemAlloc: physical allocations (cuMemCreate), CUDA arrays
// and mipmapped arrays (driver and runtime) and explicit memory pools (driver and runtime). Each
// charges a device, runs out of memory past what is free, and gives its memory back when freed.
// The exact accounting holds on the stand-in only; a real GPU rounds and caches.
#include <cstdint>

#include "driver_test.h"

using simtest::counter;
using simtest::driver;
using simtest::free_bytes;
using simtest::free_on;
using simtest::stand_in;

extern "C" cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t pool,
                                                    cudaStream_t stream);

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// The stand-in's documented code; a real driver only has to refuse.
void check_refused(CUresult r, CUresult expected) {
  if (stand_in())
    CHECK_EQ(r, expected);
  else
    CHECK_NE(r, CUDA_SUCCESS);
}

// What the stand-in refuses and a real driver may take (an H200 took some of these; which is not
// known yet).
void check_refused_here(CUresult r, CUresult expected) {
  if (stand_in()) CHECK_EQ(r, expected);
}

CUmemAllocationProp pinned_on(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUDA_ARRAY_DESCRIPTOR array_desc(size_t width, size_t height, CUarray_format format,
                                 unsigned channels) {
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = width;
  d.Height = height;
  d.Format = format;
  d.NumChannels = channels;
  return d;
}

CUDA_ARRAY3D_DESCRIPTOR array3d_desc(size_t width, size_t height, size_t depth,
                                     CUarray_format format, unsigned channels) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = width;
  d.Height = height;
  d.Depth = depth;
  d.Format = format;
  d.NumChannels = channels;
  return d;
}

// What the stand-in charges for `bytes`: whole 256-byte units, as for cudaMalloc.
size_t charged(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

TEST_CASE("cuMemCreate charges the device its properties name; cuMemRelease gives it back") {
  CUDA_OK(cudaFree(nullptr));
  auto granularity_of = driver().get<decltype(&cuMemGetAllocationGranularity)>(
      "cuMemGetAllocationGranularity", 10020);
  auto create = driver().get<decltype(&cuMemCreate)>("cuMemCreate", 10020);
  auto release = driver().get<decltype(&cuMemRelease)>("cuMemRelease", 10020);
  if (stand_in()) stand_in()->reset_counters();

  CUmemAllocationProp prop = pinned_on(0);
  size_t minimum = 0, recommended = 0;
  REQUIRE_EQ(granularity_of(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  REQUIRE_EQ(granularity_of(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             CUDA_SUCCESS);
  REQUIRE(minimum > 0);
  CHECK_EQ(recommended % minimum, 0u);
  if (stand_in()) {
    CHECK_EQ(minimum, 2 * kMiB);
    CHECK_EQ(recommended, 2 * kMiB);
  }
  CHECK_EQ(granularity_of(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(granularity_of(&minimum, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_ERROR_INVALID_VALUE);

  const size_t before = free_bytes();
  CUmemGenericAllocationHandle handle = 0;
  REQUIRE_EQ(create(&handle, 4 * minimum, &prop, 0), CUDA_SUCCESS);
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), 4 * minimum);
    CHECK_EQ(counter("live_allocations"), 1u);
  }
  CHECK_EQ(release(handle), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(free_bytes(), before);

  // Sizes off the granularity, flags, a bad device or type are refused and charge nothing.
  CHECK_EQ(create(&handle, minimum + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(create(&handle, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  handle = 0;
  CUresult flagged = create(&handle, minimum, &prop, 1);
  check_refused_here(flagged, CUDA_ERROR_INVALID_VALUE);
  if (flagged == CUDA_SUCCESS) CHECK_EQ(release(handle), CUDA_SUCCESS);
  CHECK_EQ(create(nullptr, minimum, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(create(&handle, minimum, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad = pinned_on(simtest::device_count());
  check_refused(create(&handle, minimum, &bad, 0), CUDA_ERROR_INVALID_VALUE);
  size_t ignored = 0;
  check_refused_here(granularity_of(&ignored, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);
  // Host memory is documented for cuMemCreate; it charges no device.
  const size_t before_host = free_bytes();
  CUmemAllocationProp host = pinned_on(0);
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  REQUIRE_EQ(create(&handle, minimum, &host, 0), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(free_bytes(), before_host);
  CHECK_EQ(release(handle), CUDA_SUCCESS);
  bad = pinned_on(0);
  bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  check_refused(create(&handle, minimum, &bad, 0), CUDA_ERROR_INVALID_VALUE);
  check_refused_here(granularity_of(&ignored, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);

  SIM_SKIP_REST_UNLESS(stand_in(), "out of memory and unknown handles need the exact capacity");
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(counter("live_allocations"), 0u);
  const size_t too_much = (before / minimum + 1) * minimum;
  CHECK_EQ(create(&handle, too_much, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(release(handle), CUDA_ERROR_INVALID_VALUE);  // released above
  void* plain = nullptr;
  CUDA_OK(cudaMalloc(&plain, kMiB));
  CHECK_EQ(release(reinterpret_cast<uintptr_t>(plain)), CUDA_ERROR_INVALID_VALUE);  // a pointer
  CUDA_OK(cudaFree(plain));
  CHECK_EQ(counter("cuMemCreate"), 10u);
  CHECK_EQ(counter("cuMemRelease"), 4u);  // the host allocation's too
}

TEST_CASE("cuMemCreate on another device charges that device, not the current one" *
          doctest::skip(simtest::device_count() < 2 || !simtest::stand_in())) {
  CUDA_OK(cudaSetDevice(0));
  auto create = driver().get<decltype(&cuMemCreate)>("cuMemCreate", 10020);
  auto release = driver().get<decltype(&cuMemRelease)>("cuMemRelease", 10020);
  const size_t before0 = free_on(0), before1 = free_on(1);
  CUmemAllocationProp prop = pinned_on(1);
  CUmemGenericAllocationHandle handle = 0;
  REQUIRE_EQ(create(&handle, 8 * kMiB, &prop, 0), CUDA_SUCCESS);
  CHECK_EQ(free_on(0), before0);
  CHECK_EQ(before1 - free_on(1), 8 * kMiB);
  CHECK_EQ(release(handle), CUDA_SUCCESS);
  CHECK_EQ(free_on(1), before1);
}

TEST_CASE("cuArrayCreate_v2 and cuArray3DCreate_v2 charge the current device") {
  CUDA_OK(cudaFree(nullptr));
  auto create = driver().get<decltype(&cuArrayCreate_v2)>("cuArrayCreate", 3020);
  auto create_3d = driver().get<decltype(&cuArray3DCreate_v2)>("cuArray3DCreate", 3020);
  auto destroy = driver().get<decltype(&cuArrayDestroy)>("cuArrayDestroy", 2000);
  if (stand_in()) stand_in()->reset_counters();

  const size_t before = free_bytes();
  CUDA_ARRAY_DESCRIPTOR d = array_desc(1024, 256, CU_AD_FORMAT_FLOAT, 4);
  CUarray array = nullptr;
  REQUIRE_EQ(create(&array, &d), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(before - free_bytes(), 1024u * 256 * 4 * 4);
  CUDA_ARRAY_DESCRIPTOR line = array_desc(4096, 0, CU_AD_FORMAT_HALF, 1);  // 1D
  CUarray line_array = nullptr;
  REQUIRE_EQ(create(&line_array, &line), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(before - free_bytes(), 1024u * 256 * 4 * 4 + 4096 * 2);
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = 64;
  d3.Height = 64;
  d3.Depth = 64;
  d3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d3.NumChannels = 2;
  CUarray volume = nullptr;
  REQUIRE_EQ(create_3d(&volume, &d3), CUDA_SUCCESS);
  if (stand_in())
    CHECK_EQ(before - free_bytes(), 1024u * 256 * 4 * 4 + 4096 * 2 + 64 * 64 * 64 * 2);
  CHECK_EQ(destroy(array), CUDA_SUCCESS);
  CHECK_EQ(destroy(line_array), CUDA_SUCCESS);
  CHECK_EQ(destroy(volume), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(free_bytes(), before);

  CUDA_ARRAY_DESCRIPTOR bad = array_desc(1024, 16, CU_AD_FORMAT_FLOAT, 3);
  check_refused(create(&array, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = array_desc(0, 16, CU_AD_FORMAT_FLOAT, 1);
  check_refused(create(&array, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = array_desc(1024, 16, static_cast<CUarray_format>(0x77), 1);
  check_refused(create(&array, &bad), CUDA_ERROR_INVALID_VALUE);
  check_refused(create(&array, nullptr), CUDA_ERROR_INVALID_VALUE);
  check_refused(create_3d(&array, nullptr), CUDA_ERROR_INVALID_VALUE);

  SIM_SKIP_REST_UNLESS(stand_in(), "out of memory and unknown handles need the exact capacity");
  CHECK_EQ(free_bytes(), before);
  CUDA_ARRAY_DESCRIPTOR huge = array_desc(size_t{1} << 20, 1024, CU_AD_FORMAT_FLOAT, 4);  // 16 GiB
  CHECK_EQ(create(&array, &huge), CUDA_ERROR_OUT_OF_MEMORY);
  huge = array_desc(SIZE_MAX / 2, 4, CU_AD_FORMAT_FLOAT, 4);  // overflows size_t
  CHECK_EQ(create(&array, &huge), CUDA_ERROR_OUT_OF_MEMORY);
  d3.Flags = CUDA_ARRAY3D_LAYERED;
  CHECK_EQ(create_3d(&array, &d3), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(destroy(volume), CUDA_ERROR_INVALID_HANDLE);  // destroyed above
  CHECK_EQ(destroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  void* plain = nullptr;
  CUDA_OK(cudaMalloc(&plain, kMiB));
  CHECK_EQ(destroy(reinterpret_cast<CUarray>(plain)), CUDA_ERROR_INVALID_HANDLE);
  CUDA_OK(cudaFree(plain));
  CHECK_EQ(counter("cuArrayCreate"), 11u);
  CHECK_EQ(counter("cuArrayDestroy"), 6u);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("cudaMallocArray, cudaMalloc3DArray and cudaFreeArray reach the driver") {
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) stand_in()->reset_counters();
  const size_t before = free_bytes();
  const cudaChannelFormatDesc float4_desc =
      cudaCreateChannelDesc(32, 32, 32, 32, cudaChannelFormatKindFloat);
  cudaArray_t array = nullptr;
  CUDA_OK(cudaMallocArray(&array, &float4_desc, 1024, 256, cudaArrayDefault));
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), 1024u * 256 * 16);
    CHECK_EQ(counter("cuArrayCreate"), 1u);  // the driver's entry point made it
  }
  const cudaChannelFormatDesc short2_desc =
      cudaCreateChannelDesc(16, 16, 0, 0, cudaChannelFormatKindSigned);
  cudaArray_t volume = nullptr;
  CUDA_OK(cudaMalloc3DArray(&volume, &short2_desc, cudaExtent{32, 32, 32}, cudaArrayDefault));
  cudaArray_t surface = nullptr;
  CUDA_OK(cudaMallocArray(&surface, &short2_desc, 256, 256, cudaArraySurfaceLoadStore));
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), 1024u * 256 * 16 + 32 * 32 * 32 * 4 + 256 * 256 * 4);
    CHECK_EQ(counter("cuArrayCreate"), 3u);
  }
  CUDA_OK(cudaFreeArray(array));
  CUDA_OK(cudaFreeArray(volume));
  CUDA_OK(cudaFreeArray(surface));
  CUDA_OK(cudaFreeArray(nullptr));
  if (stand_in()) {
    CHECK_EQ(free_bytes(), before);
    CHECK_EQ(counter("cuArrayDestroy"), 3u);
  }

  // A driver array is a runtime array, and the other way round.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuArrayCreate", &fn, 3020, cudaEnableDefault, &status));
  REQUIRE_EQ(status, cudaDriverEntryPointSuccess);
  CUDA_ARRAY_DESCRIPTOR d = array_desc(512, 512, CU_AD_FORMAT_UNSIGNED_INT8, 1);
  CUarray driver_array = nullptr;
  REQUIRE_EQ(reinterpret_cast<decltype(&cuArrayCreate_v2)>(fn)(&driver_array, &d), CUDA_SUCCESS);
  CUDA_OK(cudaFreeArray(reinterpret_cast<cudaArray_t>(driver_array)));
  if (stand_in()) CHECK_EQ(free_bytes(), before);

  const cudaChannelFormatDesc three =
      cudaCreateChannelDesc(8, 8, 8, 0, cudaChannelFormatKindUnsigned);
  const cudaError_t refused = cudaMallocArray(&array, &three, 64, 64, cudaArrayDefault);
  CHECK_NE(refused, cudaSuccess);
  if (stand_in()) CHECK_EQ(refused, cudaErrorInvalidChannelDescriptor);
  CHECK_EQ(cudaGetLastError(), refused);
  CHECK_EQ(cudaMallocArray(&array, nullptr, 64, 64, cudaArrayDefault), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  SIM_SKIP_REST_UNLESS(stand_in(), "out of memory and unknown handles need the exact capacity");
  CHECK_EQ(cudaMallocArray(&array, &float4_desc, size_t{1} << 20, 1024, cudaArrayDefault),
           cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaFreeArray(volume), cudaErrorInvalidResourceHandle);  // freed above
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("cuMipmappedArrayCreate charges every level; cuMipmappedArrayDestroy gives it back") {
  CUDA_OK(cudaFree(nullptr));
  auto create =
      driver().get<decltype(&cuMipmappedArrayCreate)>("cuMipmappedArrayCreate", 5000);
  auto level_of =
      driver().get<decltype(&cuMipmappedArrayGetLevel)>("cuMipmappedArrayGetLevel", 5000);
  auto destroy =
      driver().get<decltype(&cuMipmappedArrayDestroy)>("cuMipmappedArrayDestroy", 5000);
  if (stand_in()) stand_in()->reset_counters();

  const size_t before = free_bytes();
  // 256 x 128 float4, 9 levels down to 1 x 1: the height reaches 1 a level before the width.
  CUDA_ARRAY3D_DESCRIPTOR d = array3d_desc(256, 128, 0, CU_AD_FORMAT_FLOAT, 4);
  CUmipmappedArray image = nullptr;
  REQUIRE_EQ(create(&image, &d, 9), CUDA_SUCCESS);
  const size_t image_bytes =
      16 * (256 * 128 + 128 * 64 + 64 * 32 + 32 * 16 + 16 * 8 + 8 * 4 + 4 * 2 + 2 * 1 + 1 * 1);
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), charged(image_bytes));
    CHECK_EQ(counter("live_allocations"), 1u);  // one allocation holds every level
  }
  CUarray levels[9] = {};
  for (unsigned level = 0; level < 9; ++level)
    REQUIRE_EQ(level_of(&levels[level], image, level), CUDA_SUCCESS);
  for (unsigned level = 1; level < 9; ++level) CHECK(levels[level] != levels[level - 1]);
  CUarray same = nullptr;
  CHECK_EQ(level_of(&same, image, 3), CUDA_SUCCESS);
  CHECK_EQ(same, levels[3]);
  CHECK_EQ(level_of(&same, image, 9), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(level_of(nullptr, image, 0), CUDA_ERROR_INVALID_VALUE);

  // More levels than the extents allow are clamped: 64^3 uchar2 has 7; 0 levels means 1.
  CUDA_ARRAY3D_DESCRIPTOR d3 = array3d_desc(64, 64, 64, CU_AD_FORMAT_UNSIGNED_INT8, 2);
  CUmipmappedArray volume = nullptr;
  REQUIRE_EQ(create(&volume, &d3, 100), CUDA_SUCCESS);
  const size_t volume_bytes = 2 * (64 * 64 * 64 + 32 * 32 * 32 + 16 * 16 * 16 + 8 * 8 * 8 +
                                   4 * 4 * 4 + 2 * 2 * 2 + 1);
  CHECK_EQ(level_of(&same, volume, 6), CUDA_SUCCESS);
  CHECK_EQ(level_of(&same, volume, 7), CUDA_ERROR_INVALID_VALUE);
  CUDA_ARRAY3D_DESCRIPTOR line = array3d_desc(4096, 0, 0, CU_AD_FORMAT_HALF, 1);  // 1D
  CUmipmappedArray single = nullptr;
  REQUIRE_EQ(create(&single, &line, 0), CUDA_SUCCESS);
  CHECK_EQ(level_of(&same, single, 0), CUDA_SUCCESS);
  CHECK_EQ(level_of(&same, single, 1), CUDA_ERROR_INVALID_VALUE);
  if (stand_in())
    CHECK_EQ(before - free_bytes(),
             charged(image_bytes) + charged(volume_bytes) + charged(4096 * 2));
  CHECK_EQ(destroy(image), CUDA_SUCCESS);
  CHECK_EQ(destroy(volume), CUDA_SUCCESS);
  CHECK_EQ(destroy(single), CUDA_SUCCESS);
  if (stand_in()) CHECK_EQ(free_bytes(), before);

  // The format and channel rules of cuArray3DCreate_v2.
  CUDA_ARRAY3D_DESCRIPTOR bad = array3d_desc(256, 256, 0, CU_AD_FORMAT_FLOAT, 3);
  check_refused(create(&image, &bad, 4), CUDA_ERROR_INVALID_VALUE);
  bad = array3d_desc(256, 256, 0, static_cast<CUarray_format>(0x77), 1);
  check_refused(create(&image, &bad, 4), CUDA_ERROR_INVALID_VALUE);
  bad = array3d_desc(0, 256, 0, CU_AD_FORMAT_FLOAT, 1);
  check_refused(create(&image, &bad, 4), CUDA_ERROR_INVALID_VALUE);
  check_refused(create(&image, nullptr, 4), CUDA_ERROR_INVALID_VALUE);
  check_refused(create(nullptr, &d, 4), CUDA_ERROR_INVALID_VALUE);

  SIM_SKIP_REST_UNLESS(stand_in(), "out of memory and unknown handles need the exact capacity");
  CHECK_EQ(free_bytes(), before);
  bad = array3d_desc(256, 256, 6, CU_AD_FORMAT_FLOAT, 1);
  bad.Flags = CUDA_ARRAY3D_CUBEMAP;  // a layout the stand-in does not model
  CHECK_EQ(create(&image, &bad, 4), CUDA_ERROR_NOT_SUPPORTED);
  CUDA_ARRAY3D_DESCRIPTOR huge = array3d_desc(size_t{1} << 20, 1024, 0, CU_AD_FORMAT_FLOAT, 4);
  CHECK_EQ(create(&image, &huge, 1), CUDA_ERROR_OUT_OF_MEMORY);  // 16 GiB
  huge = array3d_desc(SIZE_MAX / 2, 4, 0, CU_AD_FORMAT_FLOAT, 4);  // overflows size_t
  CHECK_EQ(create(&image, &huge, 64), CUDA_ERROR_OUT_OF_MEMORY);
  // With the device full but 1 MiB: the top level of 512 x 512 float fits, the levels do not.
  void* filler = nullptr;
  CUDA_OK(cudaMalloc(&filler, free_bytes() - kMiB));
  CUDA_ARRAY3D_DESCRIPTOR square = array3d_desc(512, 512, 0, CU_AD_FORMAT_FLOAT, 1);
  CHECK_EQ(create(&image, &square, 1), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), 0u);
  CHECK_EQ(destroy(image), CUDA_SUCCESS);
  CHECK_EQ(create(&image, &square, 2), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(free_bytes(), kMiB);
  CUDA_OK(cudaFree(filler));
  CHECK_EQ(free_bytes(), before);

  // Handles it does not know: destroyed, null, a pointer, an array, a level.
  CHECK_EQ(destroy(image), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(destroy(nullptr), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(level_of(&same, image, 0), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(level_of(&same, nullptr, 0), CUDA_ERROR_INVALID_HANDLE);
  void* plain = nullptr;
  CUDA_OK(cudaMalloc(&plain, kMiB));
  CHECK_EQ(destroy(reinterpret_cast<CUmipmappedArray>(plain)), CUDA_ERROR_INVALID_HANDLE);
  CUDA_OK(cudaFree(plain));
  auto array_create = driver().get<decltype(&cuArrayCreate_v2)>("cuArrayCreate", 3020);
  auto array_destroy = driver().get<decltype(&cuArrayDestroy)>("cuArrayDestroy", 2000);
  CUDA_ARRAY_DESCRIPTOR flat = array_desc(64, 64, CU_AD_FORMAT_FLOAT, 1);
  CUarray array = nullptr;
  REQUIRE_EQ(array_create(&array, &flat), CUDA_SUCCESS);
  CHECK_EQ(destroy(reinterpret_cast<CUmipmappedArray>(array)), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(array_destroy(array), CUDA_SUCCESS);
  REQUIRE_EQ(create(&image, &d, 2), CUDA_SUCCESS);
  REQUIRE_EQ(level_of(&same, image, 1), CUDA_SUCCESS);
  CHECK_EQ(array_destroy(same), CUDA_ERROR_INVALID_HANDLE);  // part of its mipmapped array
  CHECK_EQ(destroy(reinterpret_cast<CUmipmappedArray>(same)), CUDA_ERROR_INVALID_HANDLE);
  CHECK_EQ(destroy(image), CUDA_SUCCESS);
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(counter("cuMipmappedArrayCreate"), 14u);
  CHECK_EQ(counter("cuMipmappedArrayDestroy"), 10u);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("cudaMallocMipmappedArray, cudaGetMipmappedArrayLevel and cudaFreeMipmappedArray reach "
          "the driver") {
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) stand_in()->reset_counters();
  const size_t before = free_bytes();
  const cudaChannelFormatDesc float2_desc =
      cudaCreateChannelDesc(32, 32, 0, 0, cudaChannelFormatKindFloat);
  cudaMipmappedArray_t mipmap = nullptr;
  CUDA_OK(cudaMallocMipmappedArray(&mipmap, &float2_desc, cudaExtent{128, 128, 0}, 8,
                                   cudaArrayDefault));
  const size_t mipmap_bytes =
      8 * (128 * 128 + 64 * 64 + 32 * 32 + 16 * 16 + 8 * 8 + 4 * 4 + 2 * 2 + 1);
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), charged(mipmap_bytes));
    CHECK_EQ(counter("cuMipmappedArrayCreate"), 1u);  // the driver's entry point made it
  }
  cudaArray_t level = nullptr;
  CUDA_OK(cudaGetMipmappedArrayLevel(&level, mipmap, 7));
  CHECK(level != nullptr);
  CHECK_EQ(cudaGetMipmappedArrayLevel(&level, mipmap, 8), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetMipmappedArrayLevel(&level, nullptr, 0), cudaErrorInvalidResourceHandle);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  cudaMipmappedArray_t surface = nullptr;
  CUDA_OK(cudaMallocMipmappedArray(&surface, &float2_desc, cudaExtent{64, 64, 64}, 1,
                                   cudaArraySurfaceLoadStore));
  if (stand_in()) CHECK_EQ(before - free_bytes(), charged(mipmap_bytes) + 64 * 64 * 64 * 8);
  CUDA_OK(cudaFreeMipmappedArray(mipmap));
  CUDA_OK(cudaFreeMipmappedArray(surface));
  CUDA_OK(cudaFreeMipmappedArray(nullptr));
  if (stand_in()) {
    CHECK_EQ(free_bytes(), before);
    CHECK_EQ(counter("cuMipmappedArrayDestroy"), 2u);
  }

  // A driver mipmapped array is a runtime one.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuMipmappedArrayCreate", &fn, 5000, cudaEnableDefault,
                                           &status));
  REQUIRE_EQ(status, cudaDriverEntryPointSuccess);
  CUDA_ARRAY3D_DESCRIPTOR d = array3d_desc(512, 512, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1);
  CUmipmappedArray driver_mipmap = nullptr;
  REQUIRE_EQ(reinterpret_cast<decltype(&cuMipmappedArrayCreate)>(fn)(&driver_mipmap, &d, 10),
             CUDA_SUCCESS);
  CUDA_OK(cudaFreeMipmappedArray(reinterpret_cast<cudaMipmappedArray_t>(driver_mipmap)));
  if (stand_in()) CHECK_EQ(free_bytes(), before);

  const cudaChannelFormatDesc three =
      cudaCreateChannelDesc(8, 8, 8, 0, cudaChannelFormatKindUnsigned);
  const cudaError_t refused =
      cudaMallocMipmappedArray(&mipmap, &three, cudaExtent{64, 64, 0}, 2, cudaArrayDefault);
  CHECK_NE(refused, cudaSuccess);
  if (stand_in()) CHECK_EQ(refused, cudaErrorInvalidChannelDescriptor);
  CHECK_EQ(cudaGetLastError(), refused);
  CHECK_EQ(cudaMallocMipmappedArray(&mipmap, nullptr, cudaExtent{64, 64, 0}, 2, cudaArrayDefault),
           cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  SIM_SKIP_REST_UNLESS(stand_in(), "out of memory and unknown handles need the exact capacity");
  CHECK_EQ(cudaMallocMipmappedArray(&mipmap, &float2_desc, cudaExtent{size_t{1} << 16, 1 << 14, 0},
                                    4, cudaArrayDefault),
           cudaErrorMemoryAllocation);  // 8 GiB and its levels
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaFreeMipmappedArray(surface), cudaErrorInvalidResourceHandle);  // freed above
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("a device reset frees the mipmapped arrays it held" * STAND_IN_ONLY) {
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaFree(nullptr));
  const size_t before = free_bytes();
  const cudaChannelFormatDesc texel =
      cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindSigned);
  cudaMipmappedArray_t mipmap = nullptr;
  CUDA_OK(cudaMallocMipmappedArray(&mipmap, &texel, cudaExtent{1024, 1024, 0}, 11,
                                   cudaArrayDefault));
  CHECK(free_bytes() < before);
  CUDA_OK(cudaDeviceReset());
  CUDA_OK(cudaFree(nullptr));
  CHECK_EQ(free_bytes(), before);
  CHECK_EQ(cudaFreeMipmappedArray(mipmap), cudaErrorInvalidResourceHandle);  // gone with it
  cudaGetLastError();
}

TEST_CASE("explicit pools: cuMemAllocFromPoolAsync charges the pool's device") {
  CUDA_OK(cudaFree(nullptr));
  auto pool_create = driver().get<decltype(&cuMemPoolCreate)>("cuMemPoolCreate", 11020);
  auto pool_destroy = driver().get<decltype(&cuMemPoolDestroy)>("cuMemPoolDestroy", 11020);
  auto alloc =
      driver().get<decltype(&cuMemAllocFromPoolAsync)>("cuMemAllocFromPoolAsync", 11020);
  auto alloc_ptsz = driver().get<decltype(&cuMemAllocFromPoolAsync)>(
      "cuMemAllocFromPoolAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  auto free_async = driver().get<decltype(&cuMemFreeAsync)>("cuMemFreeAsync", 11020);
  if (stand_in()) stand_in()->reset_counters();

  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = nullptr;
  REQUIRE_EQ(pool_create(&pool, &props), CUDA_SUCCESS);
  cudaStream_t rt_stream = nullptr;
  CUDA_OK(cudaStreamCreate(&rt_stream));
  auto stream = reinterpret_cast<CUstream>(rt_stream);

  const size_t before = free_bytes();
  CUdeviceptr p = 0, q = 0;
  REQUIRE_EQ(alloc(&p, 8 * kMiB, pool, stream), CUDA_SUCCESS);
  REQUIRE_EQ(alloc_ptsz(&q, 4 * kMiB, pool, nullptr), CUDA_SUCCESS);  // the per-thread stream
  CUDA_OK(cudaMemsetAsync(reinterpret_cast<void*>(p), 0, 8 * kMiB, rt_stream));
  if (stand_in()) CHECK_EQ(before - free_bytes(), 12 * kMiB);
  CHECK_EQ(free_async(p, stream), CUDA_SUCCESS);
  CUDA_OK(cudaFreeAsync(reinterpret_cast<void*>(q), cudaStreamPerThread));
  CUDA_OK(cudaStreamSynchronize(rt_stream));
  CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
  if (stand_in()) CHECK_EQ(free_bytes(), before);  // a real pool may keep it cached

  CHECK_EQ(alloc(nullptr, kMiB, pool, stream), CUDA_ERROR_INVALID_VALUE);
  CUmemPoolProps bad = props;
  bad.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
  CUmemoryPool other = nullptr;
  check_refused(pool_create(&other, &bad), CUDA_ERROR_INVALID_VALUE);
  bad = props;
  bad.location.id = simtest::device_count();
  check_refused(pool_create(&other, &bad), CUDA_ERROR_INVALID_VALUE);
  check_refused(pool_create(&other, nullptr), CUDA_ERROR_INVALID_VALUE);

  if (stand_in()) {
    CHECK_EQ(alloc(&p, before + kMiB, pool, stream), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(free_bytes(), before);
  }
  CHECK_EQ(pool_destroy(pool), CUDA_SUCCESS);
  CUDA_OK(cudaStreamDestroy(rt_stream));
  SIM_SKIP_REST_UNLESS(stand_in(), "a destroyed pool's handle may be reused by a real driver");
  CHECK_EQ(alloc(&p, kMiB, pool, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(pool_destroy(pool), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(counter("cuMemAllocFromPoolAsync"), 5u);
  CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("a pool on another device charges that device whatever the stream's" *
          doctest::skip(simtest::device_count() < 2 || !simtest::stand_in())) {
  CUDA_OK(cudaSetDevice(0));
  const size_t before0 = free_on(0), before1 = free_on(1);
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 1;
  cudaMemPool_t pool = nullptr;
  CUDA_OK(cudaMemPoolCreate(&pool, &props));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));  // on device 0
  void* p = nullptr;
  CUDA_OK(cudaMallocFromPoolAsync(&p, 16 * kMiB, pool, stream));
  CHECK_EQ(free_on(0), before0);
  CHECK_EQ(before1 - free_on(1), 16 * kMiB);
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, p));
  CHECK_EQ(attr.device, 1);
  CUDA_OK(cudaFreeAsync(p, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CHECK_EQ(free_on(1), before1);
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaMemPoolDestroy(pool));
}

TEST_CASE("cudaMemPoolCreate and cudaMallocFromPoolAsync reach the driver") {
  CUDA_OK(cudaFree(nullptr));
  if (stand_in()) stand_in()->reset_counters();
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  CUDA_OK(cudaMemPoolCreate(&pool, &props));
  const size_t before = free_bytes();
  void* p = nullptr;
  void* q = nullptr;
  CUDA_OK(cudaMallocFromPoolAsync(&p, 2 * kMiB, pool, nullptr));
  CUDA_OK(cudaMallocFromPoolAsync_ptsz(&q, 2 * kMiB, pool, nullptr));
  if (stand_in()) {
    CHECK_EQ(before - free_bytes(), 4 * kMiB);
    CHECK_EQ(counter("cuMemAllocFromPoolAsync"), 2u);
  }
  CUDA_OK(cudaFreeAsync(p, nullptr));
  CUDA_OK(cudaFreeAsync(q, cudaStreamPerThread));
  CUDA_OK(cudaDeviceSynchronize());
  if (stand_in()) CHECK_EQ(free_bytes(), before);
  props.allocType = cudaMemAllocationTypeInvalid;
  cudaMemPool_t other = nullptr;
  const cudaError_t bad_pool = cudaMemPoolCreate(&other, &props);
  CHECK_NE(bad_pool, cudaSuccess);
  if (stand_in()) CHECK_EQ(bad_pool, cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), bad_pool);
  if (stand_in()) {
    CHECK_EQ(cudaMallocFromPoolAsync(&p, before + kMiB, pool, nullptr), cudaErrorMemoryAllocation);
    CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  }
  CUDA_OK(cudaMemPoolDestroy(pool));
  if (stand_in()) CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("the resolver's rows for these allocators" * STAND_IN_ONLY) {
  simtest::Driver& drv = driver();
  constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  CHECK_EQ(drv.get<void*>("cuArrayCreate", 3020), dlsym(drv.lib, "cuArrayCreate_v2"));
  CHECK_EQ(drv.get<void*>("cuArrayCreate", 3010), dlsym(drv.lib, "cuArrayCreate"));  // 32-bit v1
  CHECK_EQ(drv.get<void*>("cuArray3DCreate", 13000), dlsym(drv.lib, "cuArray3DCreate_v2"));
  CHECK_EQ(drv.get<void*>("cuArrayDestroy", 2000), dlsym(drv.lib, "cuArrayDestroy"));
  CHECK_EQ(drv.get<void*>("cuMemCreate", 10020), dlsym(drv.lib, "cuMemCreate"));
  CHECK_EQ(drv.get<void*>("cuMemRelease", 13000), dlsym(drv.lib, "cuMemRelease"));
  CHECK_EQ(drv.get<void*>("cuMemGetAllocationGranularity", 13000),
           dlsym(drv.lib, "cuMemGetAllocationGranularity"));
  CHECK_EQ(drv.get<void*>("cuMipmappedArrayCreate", 5000),
           dlsym(drv.lib, "cuMipmappedArrayCreate"));
  CHECK_EQ(drv.get<void*>("cuMipmappedArrayGetLevel", 13000),
           dlsym(drv.lib, "cuMipmappedArrayGetLevel"));
  CHECK_EQ(drv.get<void*>("cuMipmappedArrayDestroy", 13000),
           dlsym(drv.lib, "cuMipmappedArrayDestroy"));
  CHECK_EQ(drv.get<void*>("cuMemPoolCreate", 11020), dlsym(drv.lib, "cuMemPoolCreate"));
  CHECK_EQ(drv.get<void*>("cuMemPoolDestroy", 11020), dlsym(drv.lib, "cuMemPoolDestroy"));
  CHECK_EQ(drv.get<void*>("cuMemAllocFromPoolAsync", 13000),
           dlsym(drv.lib, "cuMemAllocFromPoolAsync"));
  CHECK_EQ(drv.get<void*>("cuMemAllocFromPoolAsync", 13000, kPerThread),
           dlsym(drv.lib, "cuMemAllocFromPoolAsync_ptsz"));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK_EQ(drv.get_proc("cuMemCreate", &fn, 10010, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_EQ(drv.get_proc("cuMemAllocFromPoolAsync", &fn, 11010, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_EQ(drv.get_proc("cuMipmappedArrayCreate", &fn, 4020, 0, &status), CUDA_SUCCESS);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}
