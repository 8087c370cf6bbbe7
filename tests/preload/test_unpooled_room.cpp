// Preload test: allocations the pools do not serve find the room plain CUDA would have left them
// (Note [Room for what the pools do not serve] in interpose/pooling.cpp). On a 1 GiB device the
// program frees a 700 MiB buffer, whose page the pools keep idle, then asks for 700 MiB through
// each allocator that goes to the driver: cudaMallocPitch (also of rows the driver pads),
// cudaMallocManaged past the managed slab, cudaMallocArray, cudaMalloc3DArray, cudaMallocMipmappedArray, cudaMallocFromPoolAsync and
// cudaDeviceSetLimit's heap (which the runtime makes through the driver), cuMemAllocPitch,
// cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemCreate, cuArrayCreate,
// cuArray3DCreate, cuMipmappedArrayCreate and cuCtxSetLimit's heap. Each succeeds, as it does
// without the library, and the runtime's leave the last-error slot as the plain call does:
// clean when it was clean, the program's own error when it held one. A mipmapped array asked for
// more levels than it can have gets the ones it has. On the stand-in, limits weigh what they add
// (a heap larger than the device that adds less than it succeeds), and an array or a stack
// larger than the device fails without taking the pools' idle page from them. A child whose
// layout has no
// pool for 700 MiB does the same with cudaMalloc and cuMemAlloc, which the pools then pass to
// the driver, and with cuMemAlloc in a context of cuCtxCreate, whose memory is never pooled. A
// cudaMallocAsync larger than a budget's limit (which does not charge it) but not than the
// device gets the idle pages back too. And with two devices, physical memory and a memory pool's
// allocation on device 1 while device 0 is current, and stream-ordered allocations on a device-1
// stream (runtime and driver), find the room device 1's pools kept (the
// stand-in's child gets a second device; on a GPU with one, that case is skipped). So does a
// cudaMallocAsync on one stream while another captures, and a cudaMallocPitch made during a
// capture beside memory freed before it whose kernel still runs. And a thread's unpooled
// allocations beside another thread's pooled churn fail no more than without the library.
// Runs on a GPU too, where 700 MiB only needs to fit next to nothing else.
#include <cuda.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include <unistd.h>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

constexpr std::size_t kBig = 700u << 20;

// A 700 MiB pooled buffer, freed: its page stays with the pools, idle.
void leave_an_idle_page() {
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, kBig));
  CHECK_CUDA(cudaFree(buffer));
}

// `allocate` makes a 700 MiB allocation beside an idle page and returns a call that frees it.
void runtime_allocation(const char* what,
                        const std::function<cudaError_t(std::function<void()>*)>& allocate,
                        bool dirty_slot) {
  leave_an_idle_page();
  if (dirty_slot) CHECK(cudaSetDevice(1 << 20) == cudaErrorInvalidDevice);  // the program's own
  std::function<void()> release;
  CHECK_MSG(allocate(&release) == cudaSuccess, std::string(what) + " failed beside idle pages");
  CHECK_MSG(cudaGetLastError() == (dirty_slot ? cudaErrorInvalidDevice : cudaSuccess),
            std::string(what) + " changed the last-error slot");
  release();
}

// For runtime_allocation: an allocation cudaFree frees.
std::function<cudaError_t(std::function<void()>*)> freed_by_cuda_free(
    const std::function<cudaError_t(void**)>& allocate) {
  return [allocate](std::function<void()>* release) {
    void* ptr = nullptr;
    const cudaError_t result = allocate(&ptr);
    *release = [ptr] { CHECK_CUDA(cudaFree(ptr)); };
    return result;
  };
}

// A 700 MiB array of four-byte texels: 16384 wide, 11200 high (or deep, in 3D).
constexpr std::size_t kTexelsWide = 16384;
constexpr std::size_t kTexelRows = kBig / 4 / kTexelsWide;

cudaError_t runtime_array(std::function<void()>* release, bool three_d) {
  const cudaChannelFormatDesc texel =
      cudaCreateChannelDesc(8, 8, 8, 8, cudaChannelFormatKindUnsigned);
  cudaArray_t array = nullptr;
  const cudaError_t result =
      three_d ? cudaMalloc3DArray(&array, &texel, cudaExtent{kTexelsWide, 1, kTexelRows})
              : cudaMallocArray(&array, &texel, kTexelsWide, kTexelRows);
  *release = [array] { CHECK_CUDA(cudaFreeArray(array)); };
  return result;
}

// Two levels of 700 MiB in all: 16384 by 8960 texels (560 MiB), then 8192 by 4480 (140 MiB).
constexpr std::size_t kMipmapRows = kTexelRows * 4 / 5;
constexpr unsigned kMipmapLevels = 2;

// `levels` past the last (1 + log2 of the largest extent) are clamped by the driver: every
// level, 747 MiB in all.
cudaError_t runtime_mipmapped_array(std::function<void()>* release, unsigned levels) {
  const cudaChannelFormatDesc texel =
      cudaCreateChannelDesc(8, 8, 8, 8, cudaChannelFormatKindUnsigned);
  cudaMipmappedArray_t array = nullptr;
  const cudaError_t result = cudaMallocMipmappedArray(
      &array, &texel, cudaExtent{kTexelsWide, kMipmapRows, 0}, levels);
  *release = [array] { CHECK_CUDA(cudaFreeMipmappedArray(array)); };
  return result;
}

// The device-side heap's default, which the limit goes back to.
constexpr std::size_t kDefaultHeap = 8u << 20;

cudaError_t runtime_heap_limit(std::function<void()>* release) {
  const cudaError_t result = cudaDeviceSetLimit(cudaLimitMallocHeapSize, kBig);
  *release = [] { CHECK_CUDA(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kDefaultHeap)); };
  return result;
}

cudaError_t runtime_pool_allocation(std::function<void()>* release) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
  void* ptr = nullptr;
  const cudaError_t result = cudaMallocFromPoolAsync(&ptr, kBig, pool, nullptr);
  *release = [ptr, pool] {
    CHECK_CUDA(cudaFreeAsync(ptr, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemPoolDestroy(pool));
  };
  return result;
}

CUmemAllocationProp device_memory(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUmemoryPool driver_pool(int device) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device;
  CUmemoryPool pool = nullptr;
  CHECK_CU(cuMemPoolCreate(&pool, &props));
  return pool;
}

// Allocations that are not device pointers: `allocate` returns the call that frees its handle.
void driver_handle(const char* what, const std::function<CUresult(std::function<void()>*)>& allocate) {
  leave_an_idle_page();
  std::function<void()> release;
  CHECK_MSG(allocate(&release) == CUDA_SUCCESS, std::string(what) + " failed beside idle pages");
  release();
}

void driver_allocation(const char* what, const std::function<CUresult(CUdeviceptr*)>& allocate,
                       bool stream_ordered) {
  leave_an_idle_page();
  CUdeviceptr ptr = 0;
  CHECK_MSG(allocate(&ptr) == CUDA_SUCCESS, std::string(what) + " failed beside idle pages");
  CHECK_CU(stream_ordered ? cuMemFreeAsync(ptr, nullptr) : cuMemFree_v2(ptr));
  CHECK_CU(cuCtxSynchronize());
}

// An array of 2 GiB on the stand-in's 1 GiB device fails whatever the pools give back: they keep their
// idle page (the device's live bytes stay), as they do for a cudaMalloc larger than the device.
void array_beyond_the_device() {
  leave_an_idle_page();
  const std::uint64_t live = preload_test::counter("live_bytes");
  CUDA_ARRAY_DESCRIPTOR shape{};
  shape.Width = kTexelsWide;
  shape.Height = (std::size_t{2} << 30) / 4 / kTexelsWide;
  shape.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  shape.NumChannels = 4;
  CUarray array = nullptr;
  CHECK(cuArrayCreate_v2(&array, &shape) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_MSG(preload_test::counter("live_bytes") == live,
            "an array larger than the device emptied the pools");
}

// A limit costs what it adds (the stand-in charges the excess over the defaults: 8 MiB of heap,
// 1 KiB of stack for each of 132 x 2048 threads). A heap of 1 GiB + 4 MiB adds 1020 MiB, which
// fits the device once the pools give their idle page back; a stack of 4 KiB adds 792 MiB; a
// stack larger than the device (8 KiB adds 1.8 GiB) keeps the pools' idle page, as an array
// larger than the device does.
void limits_by_their_growth() {
  driver_handle("cuCtxSetLimit of a heap larger than the device", [](std::function<void()>* release) {
    const CUresult result = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (1u << 30) + (4u << 20));
    *release = [] { CHECK_CU(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap)); };
    return result;
  });
  driver_handle("cuCtxSetLimit of the stack", [](std::function<void()>* release) {
    const CUresult result = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096);
    *release = [] { CHECK_CU(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024)); };
    return result;
  });
  leave_an_idle_page();
  const std::uint64_t live = preload_test::counter("live_bytes");
  for (const std::size_t stack : {std::size_t{8192}, SIZE_MAX / 2}) {  // 1.8 GiB, and overflow
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_MSG(preload_test::counter("live_bytes") == live,
              "a stack larger than the device emptied the pools: " + std::to_string(stack));
  }
}

// Under a layout whose largest pool takes 512 MiB: two 400 MiB pooled buffers, freed.
void leave_idle_pages_beside_no_pool() {
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 400u << 20));
  CHECK_CUDA(cudaMalloc(&b, 400u << 20));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
}

int passed_through_child() {
  CHECK_CUDA(cudaFree(nullptr));
  leave_idle_pages_beside_no_pool();
  void* ptr = nullptr;
  CHECK_MSG(cudaMalloc(&ptr, kBig) == cudaSuccess,
            "a cudaMalloc no pool serves failed beside idle pages");
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFree(ptr));
  leave_idle_pages_beside_no_pool();
  CUdeviceptr dptr = 0;
  CHECK_MSG(cuMemAlloc_v2(&dptr, kBig) == CUDA_SUCCESS,
            "a cuMemAlloc no pool serves failed beside idle pages");
  CHECK_CU(cuMemFree_v2(dptr));
  leave_idle_pages_beside_no_pool();
  CUcontext own = nullptr;
  CHECK_CU(cuCtxCreate(&own, nullptr, 0, 0));
  CHECK_MSG(cuMemAlloc_v2(&dptr, kBig) == CUDA_SUCCESS,
            "a cuMemAlloc in a context of cuCtxCreate failed beside idle pages");
  CHECK_CU(cuMemFree_v2(dptr));
  CHECK_CU(cuCtxDestroy_v2(own));
  std::printf("passed-through child ok\n");
  return 0;
}

// Under limit:650M on the 1 GiB device: a 400 MiB pooled buffer, freed, then 700 MiB through
// cudaMallocAsync, which the budget does not charge: more than the limit, less than the device.
int beside_budget_child() {
  void* pooled = nullptr;
  CHECK_CUDA(cudaMalloc(&pooled, 400u << 20));
  CHECK_CUDA(cudaFree(pooled));
  void* ptr = nullptr;
  CHECK_MSG(cudaMallocAsync(&ptr, kBig, nullptr) == cudaSuccess,
            "a cudaMallocAsync above the budget's limit failed beside idle pages");
  CHECK_CUDA(cudaFreeAsync(ptr, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("beside-budget child ok\n");
  return 0;
}

// With two devices, device 0 current: device 1's pools keep a 700 MiB page idle, then physical
// memory and a memory pool's allocation are made on device 1.
int other_device_child() {
  CHECK_CUDA(cudaSetDevice(1));
  leave_an_idle_page();
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));
  CUmemGenericAllocationHandle handle = 0;
  const CUmemAllocationProp prop = device_memory(1);
  CHECK_MSG(cuMemCreate(&handle, kBig, &prop, 0) == CUDA_SUCCESS,
            "cuMemCreate on device 1 failed beside its idle pages");
  CHECK_CU(cuMemRelease(handle));
  CHECK_CUDA(cudaSetDevice(1));
  leave_an_idle_page();
  CHECK_CUDA(cudaSetDevice(0));
  const CUmemoryPool pool = driver_pool(1);
  CUdeviceptr ptr = 0;
  CHECK_MSG(cuMemAllocFromPoolAsync(&ptr, kBig, pool, nullptr) == CUDA_SUCCESS,
            "cuMemAllocFromPoolAsync from device 1's pool failed beside its idle pages");
  CHECK_CU(cuMemFreeAsync(ptr, nullptr));
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuMemPoolDestroy(pool));
  // Stream-ordered allocations on a device-1 stream come from device 1, whatever is current.
  CHECK_CUDA(cudaSetDevice(1));
  cudaStream_t device1_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&device1_stream, cudaStreamNonBlocking));
  leave_an_idle_page();
  CHECK_CUDA(cudaSetDevice(0));
  void* async = nullptr;
  CHECK_MSG(cudaMallocAsync(&async, kBig, device1_stream) == cudaSuccess,
            "cudaMallocAsync on a device-1 stream failed beside device 1's idle pages");
  CHECK_CUDA(cudaFreeAsync(async, device1_stream));
  CHECK_CUDA(cudaStreamSynchronize(device1_stream));
  CHECK_CUDA(cudaSetDevice(1));
  leave_an_idle_page();
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_MSG(cuMemAllocAsync(&ptr, kBig, reinterpret_cast<CUstream>(device1_stream)) ==
                CUDA_SUCCESS,
            "cuMemAllocAsync on a device-1 stream failed beside device 1's idle pages");
  CHECK_CU(cuMemFreeAsync(ptr, reinterpret_cast<CUstream>(device1_stream)));
  CHECK_CUDA(cudaStreamSynchronize(device1_stream));
  CHECK_CUDA(cudaStreamDestroy(device1_stream));
  std::printf("other-device child ok\n");
  return 0;
}

}  // namespace

// While another stream captures, a stream-ordered allocation on a stream that is not capturing
// (legal in every capture mode) gets the idle page back all the same: no fence is waited for,
// what is idle goes.
void beside_a_capture() {
  cudaStream_t capturing = nullptr;
  cudaStream_t other = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 4096));
  leave_an_idle_page();
  CHECK_CUDA(cudaDeviceSynchronize());  // its free fence has passed: the page is idle
  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(cudaMemsetAsync(small, 1, 4096, capturing));
  void* ptr = nullptr;
  CHECK_MSG(cudaMallocAsync(&ptr, kBig, other) == cudaSuccess,
            "cudaMallocAsync beside a capture failed beside idle pages");
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFreeAsync(ptr, other));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamSynchronize(other));
  CHECK_CUDA(cudaFree(small));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  CHECK_CUDA(cudaStreamDestroy(other));
}

void sleep_300ms(void*) { ::usleep(300000); }

// Two threads on a 256 MiB device, each holding one buffer at a time: a pooled one of a random
// size up to 30% of the device, freed (its page stays idle), then an unpooled one of 30%, freed.
// At most 60% of the device is live, so no call fails without the library; with it, the other
// thread's next growth must not take the room given back for the unpooled call before its retry
// (Note [Room held for the retry] in interpose/pooling.cpp).
int two_threads_child() {
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t share = total / 10 * 3;
  std::atomic<int> failures{0};
  const auto churn = [&](int thread, int kind) {
    std::mt19937_64 random(static_cast<unsigned>(thread + 1));
    for (int round = 0; round < 600; ++round) {
      void* pooled = nullptr;
      if (cudaMalloc(&pooled, 4096 + random() % share) != cudaSuccess ||
          cudaFree(pooled) != cudaSuccess) {
        ++failures;
        continue;
      }
      void* unpooled = nullptr;
      std::size_t pitch = 0;
      const cudaError_t made =
          kind == 0   ? cudaMallocPitch(&unpooled, &pitch, 1 << 16, share >> 16)
          : kind == 1 ? cudaMallocAsync(&unpooled, share, nullptr)
                      : cudaMallocManaged(&unpooled, share);
      if (made != cudaSuccess) {
        std::fprintf(stderr, "thread %d: an unpooled allocation of %zu bytes failed: %s\n", thread,
                     share, cudaGetErrorName(made));
        cudaGetLastError();
        ++failures;
        continue;
      }
      if (kind == 1) {
        CHECK_CUDA(cudaFreeAsync(unpooled, nullptr));
        CHECK_CUDA(cudaStreamSynchronize(nullptr));
      } else {
        CHECK_CUDA(cudaFree(unpooled));
      }
    }
  };
  for (int kind = 0; kind < 3; ++kind) {
    std::thread other(churn, 1, kind);
    churn(0, kind);
    other.join();
  }
  CHECK_MSG(failures.load() == 0, std::to_string(failures.load()) + " allocations failed");
  return 0;
}

// A 700 MiB buffer freed while a kernel on another stream still writes it (plain cudaFree waits
// for the kernel): its fence is recorded as the next capture begins, and an allocation the pools
// do not serve, made while that capture is open, waits for the fence and gets the page. The
// stand-in's kernel only (simcuda_launch_access): on a GPU the case is skipped.
void fenced_beside_a_capture() {
  const preload_test::LaunchAccessFn launch_access = preload_test::launch_access_function();
  if (launch_access == nullptr) return;
  cudaStream_t capturing = nullptr;
  cudaStream_t work = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, kBig));
  CHECK(launch_access(work, buffer, kBig, 1, &sleep_300ms, nullptr) == cudaSuccess);
  CHECK_CUDA(cudaFree(buffer));
  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  void* ptr = nullptr;
  std::size_t pitch = 0;
  CHECK_MSG(cudaMallocPitch(&ptr, &pitch, 1 << 20, kBig >> 20) == cudaSuccess,
            "cudaMallocPitch in a capture failed beside memory freed before it");
  CHECK_CUDA(cudaGetLastError());
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  CHECK_CUDA(cudaStreamDestroy(work));
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "passed-through") return passed_through_child();
  if (argc > 1 && std::string(argv[1]) == "beside-budget") return beside_budget_child();
  if (argc > 1 && std::string(argv[1]) == "other-device") return other_device_child();
  if (argc > 1 && std::string(argv[1]) == "two-threads") return two_threads_child();
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  for (const bool dirty : {false, true}) {
    runtime_allocation("cudaMallocPitch", freed_by_cuda_free([](void** p) {
      std::size_t pitch = 0;
      return cudaMallocPitch(p, &pitch, 1 << 20, kBig >> 20);
    }), dirty);
    // One byte a row, each padded to 512 by the driver: 700 MiB, not 1.4 MB.
    runtime_allocation("cudaMallocPitch of padded rows", freed_by_cuda_free([](void** p) {
      std::size_t pitch = 0;
      return cudaMallocPitch(p, &pitch, 1, kBig / 512);
    }), dirty);
    runtime_allocation("cudaMallocManaged", freed_by_cuda_free([](void** p) {
      return cudaMallocManaged(p, kBig);
    }), dirty);
    runtime_allocation("cudaMallocArray", [](std::function<void()>* release) {
      return runtime_array(release, false);
    }, dirty);
    runtime_allocation("cudaMalloc3DArray", [](std::function<void()>* release) {
      return runtime_array(release, true);
    }, dirty);
    runtime_allocation("cudaMallocMipmappedArray", [](std::function<void()>* release) {
      return runtime_mipmapped_array(release, kMipmapLevels);
    }, dirty);
    runtime_allocation("cudaMallocMipmappedArray of every level", [](std::function<void()>* release) {
      return runtime_mipmapped_array(release, UINT_MAX);
    }, dirty);
    runtime_allocation("cudaMallocFromPoolAsync", runtime_pool_allocation, dirty);
    runtime_allocation("cudaDeviceSetLimit", runtime_heap_limit, dirty);
  }
  driver_allocation("cuMemAllocPitch", [](CUdeviceptr* p) {
    std::size_t pitch = 0;
    return cuMemAllocPitch_v2(p, &pitch, 1 << 20, kBig >> 20, 4);
  }, false);
  driver_allocation("cuMemAllocManaged", [](CUdeviceptr* p) {
    return cuMemAllocManaged(p, kBig, CU_MEM_ATTACH_GLOBAL);
  }, false);
  driver_allocation("cuMemAllocAsync", [](CUdeviceptr* p) {
    return cuMemAllocAsync(p, kBig, nullptr);
  }, true);
  const CUmemoryPool pool = driver_pool(0);
  driver_allocation("cuMemAllocFromPoolAsync", [pool](CUdeviceptr* p) {
    return cuMemAllocFromPoolAsync(p, kBig, pool, nullptr);
  }, true);
  CHECK_CU(cuMemPoolDestroy(pool));
  driver_handle("cuMemCreate", [](std::function<void()>* release) {
    CUmemGenericAllocationHandle handle = 0;
    const CUmemAllocationProp prop = device_memory(0);
    const CUresult result = cuMemCreate(&handle, kBig, &prop, 0);
    *release = [handle] { CHECK_CU(cuMemRelease(handle)); };
    return result;
  });
  driver_handle("cuArrayCreate", [](std::function<void()>* release) {
    CUDA_ARRAY_DESCRIPTOR shape{};
    shape.Width = kTexelsWide;
    shape.Height = kTexelRows;
    shape.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    shape.NumChannels = 4;
    CUarray array = nullptr;
    const CUresult result = cuArrayCreate_v2(&array, &shape);
    *release = [array] { CHECK_CU(cuArrayDestroy(array)); };
    return result;
  });
  driver_handle("cuArray3DCreate", [](std::function<void()>* release) {
    CUDA_ARRAY3D_DESCRIPTOR shape{};
    shape.Width = kTexelsWide;
    shape.Height = 1;
    shape.Depth = kTexelRows;
    shape.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    shape.NumChannels = 4;
    CUarray array = nullptr;
    const CUresult result = cuArray3DCreate_v2(&array, &shape);
    *release = [array] { CHECK_CU(cuArrayDestroy(array)); };
    return result;
  });
  driver_handle("cuMipmappedArrayCreate", [](std::function<void()>* release) {
    CUDA_ARRAY3D_DESCRIPTOR shape{};
    shape.Width = kTexelsWide;
    shape.Height = kMipmapRows;
    shape.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    shape.NumChannels = 4;
    CUmipmappedArray array = nullptr;
    const CUresult result = cuMipmappedArrayCreate(&array, &shape, kMipmapLevels);
    *release = [array] { CHECK_CU(cuMipmappedArrayDestroy(array)); };
    return result;
  });
  driver_handle("cuCtxSetLimit", [](std::function<void()>* release) {
    const CUresult result = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, kBig);
    *release = [] { CHECK_CU(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, kDefaultHeap)); };
    return result;
  });
  beside_a_capture();
  fenced_beside_a_capture();
  if (preload_test::on_stand_in()) {  // a GPU has more than 2 GiB, and other limits' costs
    array_beyond_the_device();
    limits_by_their_growth();
  }
  const preload_test::ChildResult passed = preload_test::run_self(
      "passed-through", {"POOLCUDA_CONF=pools:[sliced(page=2M,slice=512K);exclusive(max=512M)]"});
  CHECK_MSG(passed.status == 0, passed.output);
  const preload_test::ChildResult beside =
      preload_test::run_self("beside-budget", {"POOLCUDA_CONF=limit:650M"});
  CHECK_MSG(beside.status == 0, beside.output);
  if (preload_test::on_stand_in()) {  // a GPU's 30% takes long to allocate and free
    const preload_test::ChildResult threads =
        preload_test::run_self("two-threads", {"SIMCUDA_DEVICE_MEMORY=256M"});
    CHECK_MSG(threads.status == 0, threads.output);
  }
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (!preload_test::on_stand_in() && devices < 2) {
    preload_test::skip("the other-device case needs two devices");
  }
  const preload_test::ChildResult other =
      preload_test::run_self("other-device", {"SIMCUDA_DEVICES=2"});
  CHECK_MSG(other.status == 0, other.output);
  std::printf("ok\n");
  return 0;
}
