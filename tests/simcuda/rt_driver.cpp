// The runtime stand-in's way to the driver stand-in (see rt_driver.h).
//
// Note [Static runtime]
// nvcc links libcudart_static.a into a program by default. That runtime is part of the program:
// its cudaMalloc is not a dynamic symbol anyone can interpose, and it reaches the driver only by
// dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2"), then one resolver call per entry
// point by base name, CUDA version and stream flavour. The static archive of the stand-in
// (libcudart_static_sim.a, the same rt_*.cpp built with SIMCUDA_STATIC_RUNTIME) does the same
// for the calls an allocator cares about: cudaMalloc, cudaFree, cudaMallocManaged,
// cudaMemGetInfo, the stream create/destroy calls, capture begin/end, and the kernel launches
// (whose first one on a device loads the kernel's module into device memory: cudaLaunchKernel,
// cudaLaunchKernelExC, cudaLaunchCooperativeKernel, __cudaLaunchKernel and their _ptsz forms, all
// through cuLaunchKernel or its _ptsz form). Everything else but the array and explicit-pool
// calls (below) calls the shared core directly (the state the driver stand-in sees too). A test
// program linked with the archive and not with libcudart.so.13 is therefore, to an interposer,
// exactly a program built with nvcc's default static cudart.
//
// Both builds make their array, mipmapped-array, explicit-pool and limit calls (cudaMallocArray,
// cudaMalloc3DArray, cudaFreeArray, cudaMallocMipmappedArray, cudaGetMipmappedArrayLevel,
// cudaFreeMipmappedArray, cudaMemPoolCreate, cudaMemPoolDestroy, cudaMallocFromPoolAsync,
// cudaDeviceSetLimit, cudaDeviceGetLimit) through the resolver, as the real shared runtime does:
// an interposer on libcuda.so.1 sees that memory allocated, and the limits that reserve memory
// set, whichever runtime the program uses.
#include "rt_driver.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstddef>

namespace poolcuda::sim {
namespace {

using Resolver = CUresult (*)(const char*, void**, int, cuuint64_t,
                              CUdriverProcAddressQueryResult*);

Resolver resolver() {
  static const Resolver resolve = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // kept for the process's life
    return lib ? reinterpret_cast<Resolver>(dlsym(lib, "cuGetProcAddress_v2")) : nullptr;
  }();
  return resolve;
}

// The driver's entry point for `name` at `version`, nullptr when there is none.
template <typename Fn>
Fn entry(const char* name, int version, bool per_thread = false) {
  Resolver resolve = resolver();
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  if (!resolve || resolve(name, &fn, version, flags, &status) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<Fn>(fn);
}

// Resolved once per call site, as the real runtime resolves once per process.
#define SIM_DRIVER(var, type, name, version, ...)                               \
  static const auto var = entry<type>(name, version __VA_OPT__(, ) __VA_ARGS__); \
  if (!var) return cudaErrorNotSupported

cudaError_t as_rt(CUresult r) { return static_cast<cudaError_t>(r); }  // the codes coincide

CUdeviceptr* as_dptr(void** p) { return reinterpret_cast<CUdeviceptr*>(p); }
CUstream as_cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }

// The driver's format and channel count for a runtime channel description: 1, 2 or 4 channels,
// each as wide as x; false for a description no CUDA array holds.
bool array_format(const cudaChannelFormatDesc& desc, CUarray_format* format, unsigned* channels) {
  *channels = 0;
  for (int bits : {desc.x, desc.y, desc.z, desc.w}) {
    if (bits == 0) continue;
    if (bits != desc.x) return false;
    ++*channels;
  }
  if (*channels != 1 && *channels != 2 && *channels != 4) return false;
  struct Row {
    cudaChannelFormatKind kind;
    int bits;
    CUarray_format format;
  };
  static constexpr Row kFormats[] = {
      {cudaChannelFormatKindSigned, 8, CU_AD_FORMAT_SIGNED_INT8},
      {cudaChannelFormatKindSigned, 16, CU_AD_FORMAT_SIGNED_INT16},
      {cudaChannelFormatKindSigned, 32, CU_AD_FORMAT_SIGNED_INT32},
      {cudaChannelFormatKindUnsigned, 8, CU_AD_FORMAT_UNSIGNED_INT8},
      {cudaChannelFormatKindUnsigned, 16, CU_AD_FORMAT_UNSIGNED_INT16},
      {cudaChannelFormatKindUnsigned, 32, CU_AD_FORMAT_UNSIGNED_INT32},
      {cudaChannelFormatKindFloat, 16, CU_AD_FORMAT_HALF},
      {cudaChannelFormatKindFloat, 32, CU_AD_FORMAT_FLOAT}};
  for (const Row& row : kFormats)
    if (row.kind == desc.f && row.bits == desc.x) {
      *format = row.format;
      return true;
    }
  return false;
}

// The driver's 3D descriptor for a runtime channel description, extent and flags (the runtime's
// cudaArray* flags are the driver's CUDA_ARRAY3D_* bits); false as array_format().
bool descriptor_3d(const cudaChannelFormatDesc& desc, cudaExtent extent, unsigned flags,
                   CUDA_ARRAY3D_DESCRIPTOR* out) {
  if (!array_format(desc, &out->Format, &out->NumChannels)) return false;
  out->Width = extent.width;
  out->Height = extent.height;
  out->Depth = extent.depth;
  out->Flags = flags;
  return true;
}

CUarray* as_array(cudaArray_t* a) { return reinterpret_cast<CUarray*>(a); }
CUmipmappedArray as_mipmap(cudaMipmappedArray_const_t m) {
  return reinterpret_cast<CUmipmappedArray>(const_cast<cudaMipmappedArray*>(m));
}

// The runtime's and the driver's pool properties are one layout (the headers say so).
static_assert(sizeof(cudaMemPoolProps) == sizeof(CUmemPoolProps));
static_assert(offsetof(cudaMemPoolProps, location) == offsetof(CUmemPoolProps, location));
static_assert(offsetof(cudaMemPoolProps, maxSize) == offsetof(CUmemPoolProps, maxSize));

}  // namespace

namespace rt {

void load_driver() { resolver(); }

cudaError_t driver_entry(const char* symbol, void** fn, unsigned version,
                         unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  if (!symbol || !fn) return cudaErrorInvalidValue;
  *fn = nullptr;
  if (flags & ~0x3ull) return cudaErrorInvalidValue;
  Resolver resolve = resolver();
  if (!resolve) return cudaErrorNotSupported;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult rc = resolve(symbol, fn, static_cast<int>(version), flags, &found);
  if (status) *status = static_cast<cudaDriverEntryPointQueryResult>(found);
  // Nothing found is a success with a NULL function, as for the driver (Note [Unknown names]
  // in drv_api.cpp); only the status says why.
  return as_rt(rc);
}

}  // namespace rt

namespace via_driver {

cudaError_t malloc(void** ptr, size_t size) {
  if (!ptr) return cudaErrorInvalidValue;
  if (size == 0) {  // cudaMalloc(&p, 0) succeeds with NULL and never reaches the driver
    *ptr = nullptr;
    return cudaSuccess;
  }
  SIM_DRIVER(alloc, decltype(&cuMemAlloc_v2), "cuMemAlloc", 3020);
  return as_rt(alloc(as_dptr(ptr), size));
}

cudaError_t malloc_managed(void** ptr, size_t size, unsigned int flags) {
  if (!ptr) return cudaErrorInvalidValue;
  SIM_DRIVER(alloc, decltype(&cuMemAllocManaged), "cuMemAllocManaged", 6000);
  return as_rt(alloc(as_dptr(ptr), size, flags));
}

cudaError_t free(void* ptr) {
  if (!ptr) return cudaSuccess;  // cudaFree(NULL) only creates the context
  SIM_DRIVER(release, decltype(&cuMemFree_v2), "cuMemFree", 3020);
  return as_rt(release(reinterpret_cast<CUdeviceptr>(ptr)));
}

cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread) {
  using Free = decltype(&cuMemFreeAsync);
  if (per_thread) {
    SIM_DRIVER(release, Free, "cuMemFreeAsync", 11020, true);
    return as_rt(release(reinterpret_cast<CUdeviceptr>(ptr), as_cu(stream)));
  }
  SIM_DRIVER(release, Free, "cuMemFreeAsync", 11020);
  return as_rt(release(reinterpret_cast<CUdeviceptr>(ptr), as_cu(stream)));
}

cudaError_t device_reset(int device) {
  SIM_DRIVER(reset, decltype(&cuDevicePrimaryCtxReset_v2), "cuDevicePrimaryCtxReset", 11000);
  return as_rt(reset(device));
}

cudaError_t mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  SIM_DRIVER(info, decltype(&cuMemGetInfo_v2), "cuMemGetInfo", 3020);
  return as_rt(info(free_bytes, total_bytes));
}

cudaError_t stream_create(cudaStream_t* stream, unsigned int flags) {
  SIM_DRIVER(create, decltype(&cuStreamCreate), "cuStreamCreate", 2000);
  return as_rt(create(reinterpret_cast<CUstream*>(stream), flags));
}

cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority) {
  SIM_DRIVER(create, decltype(&cuStreamCreateWithPriority), "cuStreamCreateWithPriority", 5050);
  return as_rt(create(reinterpret_cast<CUstream*>(stream), flags, priority));
}

cudaError_t stream_destroy(cudaStream_t stream) {
  SIM_DRIVER(destroy, decltype(&cuStreamDestroy_v2), "cuStreamDestroy", 4000);
  return as_rt(destroy(as_cu(stream)));
}

cudaError_t begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode, bool per_thread) {
  using Begin = CUresult (*)(CUstream, CUstreamCaptureMode);
  if (per_thread) {
    SIM_DRIVER(begin, Begin, "cuStreamBeginCapture", 10010, true);
    return as_rt(begin(as_cu(stream), static_cast<CUstreamCaptureMode>(mode)));
  }
  SIM_DRIVER(begin, Begin, "cuStreamBeginCapture", 10010);
  return as_rt(begin(as_cu(stream), static_cast<CUstreamCaptureMode>(mode)));
}

cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph, bool per_thread) {
  using End = CUresult (*)(CUstream, CUgraph*);
  if (per_thread) {
    SIM_DRIVER(end, End, "cuStreamEndCapture", 10000, true);
    return as_rt(end(as_cu(stream), reinterpret_cast<CUgraph*>(graph)));
  }
  SIM_DRIVER(end, End, "cuStreamEndCapture", 10000);
  return as_rt(end(as_cu(stream), reinterpret_cast<CUgraph*>(graph)));
}

cudaError_t launch_kernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                          cudaStream_t stream, bool per_thread) {
  if (!func) return cudaErrorInvalidDeviceFunction;
  using Launch = decltype(&cuLaunchKernel);
  auto* f = reinterpret_cast<CUfunction>(const_cast<void*>(func));
  const auto shared = static_cast<unsigned int>(shared_bytes);
  if (per_thread) {
    SIM_DRIVER(launch, Launch, "cuLaunchKernel", 7000, true);
    return as_rt(launch(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared,
                        as_cu(stream), args, nullptr));
  }
  SIM_DRIVER(launch, Launch, "cuLaunchKernel", 4000);
  return as_rt(launch(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared, as_cu(stream),
                      args, nullptr));
}

// cudaMallocArray: the 2D entry point; flags (surface load/store) only fit the 3D descriptor.
cudaError_t malloc_array(cudaArray_t* array, const cudaChannelFormatDesc* desc, size_t width,
                         size_t height, unsigned int flags) {
  if (flags != 0) return malloc_3d_array(array, desc, cudaExtent{width, height, 0}, flags);
  if (!array || !desc) return cudaErrorInvalidValue;
  CUDA_ARRAY_DESCRIPTOR d{};
  if (!array_format(*desc, &d.Format, &d.NumChannels)) return cudaErrorInvalidChannelDescriptor;
  d.Width = width;
  d.Height = height;
  SIM_DRIVER(create, decltype(&cuArrayCreate_v2), "cuArrayCreate", 3020);
  return as_rt(create(as_array(array), &d));
}

cudaError_t malloc_3d_array(cudaArray_t* array, const cudaChannelFormatDesc* desc,
                            cudaExtent extent, unsigned int flags) {
  if (!array || !desc) return cudaErrorInvalidValue;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  if (!descriptor_3d(*desc, extent, flags, &d)) return cudaErrorInvalidChannelDescriptor;
  SIM_DRIVER(create, decltype(&cuArray3DCreate_v2), "cuArray3DCreate", 3020);
  return as_rt(create(as_array(array), &d));
}

cudaError_t free_array(cudaArray_t array) {
  if (!array) return cudaSuccess;  // as cudaFree(NULL)
  SIM_DRIVER(destroy, decltype(&cuArrayDestroy), "cuArrayDestroy", 2000);
  return as_rt(destroy(reinterpret_cast<CUarray>(array)));
}

cudaError_t malloc_mipmapped_array(cudaMipmappedArray_t* array, const cudaChannelFormatDesc* desc,
                                   cudaExtent extent, unsigned int levels, unsigned int flags) {
  if (!array || !desc) return cudaErrorInvalidValue;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  if (!descriptor_3d(*desc, extent, flags, &d)) return cudaErrorInvalidChannelDescriptor;
  SIM_DRIVER(create, decltype(&cuMipmappedArrayCreate), "cuMipmappedArrayCreate", 5000);
  return as_rt(create(reinterpret_cast<CUmipmappedArray*>(array), &d, levels));
}

cudaError_t get_mipmapped_array_level(cudaArray_t* level_array, cudaMipmappedArray_const_t array,
                                      unsigned int level) {
  SIM_DRIVER(get, decltype(&cuMipmappedArrayGetLevel), "cuMipmappedArrayGetLevel", 5000);
  return as_rt(get(as_array(level_array), as_mipmap(array), level));
}

cudaError_t free_mipmapped_array(cudaMipmappedArray_t array) {
  if (!array) return cudaSuccess;  // documented: no operation
  SIM_DRIVER(destroy, decltype(&cuMipmappedArrayDestroy), "cuMipmappedArrayDestroy", 5000);
  return as_rt(destroy(as_mipmap(array)));
}

cudaError_t device_set_limit(cudaLimit limit, size_t value) {
  SIM_DRIVER(set, decltype(&cuCtxSetLimit), "cuCtxSetLimit", 3010);
  return as_rt(set(static_cast<CUlimit>(limit), value));
}

cudaError_t device_get_limit(size_t* value, cudaLimit limit) {
  SIM_DRIVER(get, decltype(&cuCtxGetLimit), "cuCtxGetLimit", 3010);
  return as_rt(get(value, static_cast<CUlimit>(limit)));
}

cudaError_t mem_pool_create(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  SIM_DRIVER(create, decltype(&cuMemPoolCreate), "cuMemPoolCreate", 11020);
  return as_rt(create(reinterpret_cast<CUmemoryPool*>(pool),
                      reinterpret_cast<const CUmemPoolProps*>(props)));
}

cudaError_t mem_pool_destroy(cudaMemPool_t pool) {
  SIM_DRIVER(destroy, decltype(&cuMemPoolDestroy), "cuMemPoolDestroy", 11020);
  return as_rt(destroy(reinterpret_cast<CUmemoryPool>(pool)));
}

cudaError_t malloc_from_pool_async(void** ptr, size_t size, cudaMemPool_t pool,
                                   cudaStream_t stream, bool per_thread) {
  using Alloc = decltype(&cuMemAllocFromPoolAsync);
  auto* p = reinterpret_cast<CUmemoryPool>(pool);
  if (per_thread) {
    SIM_DRIVER(alloc, Alloc, "cuMemAllocFromPoolAsync", 11020, true);
    return as_rt(alloc(as_dptr(ptr), size, p, as_cu(stream)));
  }
  SIM_DRIVER(alloc, Alloc, "cuMemAllocFromPoolAsync", 11020);
  return as_rt(alloc(as_dptr(ptr), size, p, as_cu(stream)));
}

}  // namespace via_driver
}  // namespace poolcuda::sim
