// The exported driver entry points: every hooked variant under its own symbol (driver_variants.h),
// for programs linked with -lcuda and as the targets the hooked resolvers hand out. Thin shims:
// calls made from inside the library or in a forked child (hook_guard.h) go straight to the real
// variant; everything else is one call into driver_hooks.cpp. The resolvers always map what the
// real one found, whoever asks: the real runtime caches what it gets for the life of the process.
//
// Host functions and callbacks give the pools' idle memory back first, as the runtime's do
// (Note [Idle memory before a park] in pools/memory_manager.cpp).
//
// Capture begin and end go through the same capture layer as the runtime's (hooks.h): a driver
// capture opens and closes a capture window exactly like cudaStreamBeginCapture. The mode-less
// cuStreamBeginCapture is a global-mode capture to the driver; the capture layer does not look
// at the mode.
//
// Depends on driver_hooks.h, driver_variants.h, hooks.h and exports_common.h.
#include "interpose/driver_context.h"
#include "interpose/driver_hooks.h"
#include "interpose/driver_variants.h"
#include "interpose/exports_common.h"
#include "interpose/hooks.h"
#include "interpose/pooling.h"
#include "interpose/stream_order.h"
#include "pools/work_since_free.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace pc = poolcuda;
namespace dh = poolcuda::driver_hooks;
namespace dr = poolcuda::driver_real;

POOLCUDA_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* symbolStatus) {
  const CUresult result = dr::cuGetProcAddress_v2()(symbol, pfn, cudaVersion, flags, symbolStatus);
  dh::map_resolved(result == CUDA_SUCCESS, pfn);
  return result;
}

POOLCUDA_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                          cuuint64_t flags) {
  const CUresult result = dr::cuGetProcAddress()(symbol, pfn, cudaVersion, flags);
  dh::map_resolved(result == CUDA_SUCCESS, pfn);
  return result;
}

POOLCUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (pc::bypass()) return dr::cuMemAlloc_v2()(dptr, bytesize);
  return pc::guarded([&] { return dh::mem_alloc(dptr, bytesize); });
}

POOLCUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (pc::bypass()) return dr::cuMemFree_v2()(dptr);
  return pc::guarded([&] { return dh::mem_free(dptr); });
}

// A stream-ordered free of pooled memory takes the pools' path (driver_hooks.cpp); the real
// call would free a whole page, or refuse a slice inside one.
POOLCUDA_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  if (pc::bypass()) return dr::cuMemFreeAsync()(dptr, hStream);
  return pc::guarded([&] { return dh::mem_free_async(dptr, hStream, false); });
}

POOLCUDA_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  if (pc::bypass()) return dr::cuMemFreeAsync_ptsz()(dptr, hStream);
  return pc::guarded([&] { return dh::mem_free_async(dptr, hStream, true); });
}

POOLCUDA_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (pc::bypass()) return dr::cuMemGetInfo_v2()(free, total);
  return pc::guarded([&] { return dh::mem_get_info(free, total); });
}

// A managed slab allocation's own range, not its slab's (Note [Managed address ranges] in
// driver_hooks.cpp).
POOLCUDA_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                 CUdeviceptr dptr) {
  if (pc::bypass()) return dr::cuMemGetAddressRange_v2()(pbase, psize, dptr);
  return pc::guarded([&] { return dh::mem_get_address_range(pbase, psize, dptr); });
}

// A handle of a slice inside a pooled page would open the wrong bytes (Note [IPC handles] in
// pooling.cpp).
POOLCUDA_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  if (pc::bypass()) return dr::cuIpcGetMemHandle()(pHandle, dptr);
  return pc::guarded([&] { return dh::ipc_get_mem_handle(pHandle, dptr); });
}

// Pitched, driver-managed and stream-ordered allocations are not pooled: passed through, and
// tried once more after the pools gave their idle memory back when the driver refused them for
// lack of memory (Note [Room for what the pools do not serve] in pooling.cpp). Pooling managed
// memory here would also need the driver's attach, advise, prefetch and attribute calls to treat
// a slab allocation as a whole allocation, as managed_hooks.cpp does for the runtime's.
POOLCUDA_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                            size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes) {
  auto real = [&] {
    return dr::cuMemAllocPitch_v2()(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  };
  if (pc::bypass()) return real();
  // Only weighed against the device's size: a product that overflows is more than any has.
  const std::size_t size = Height != 0 && WidthInBytes > SIZE_MAX / Height
                               ? SIZE_MAX
                               : WidthInBytes * Height;
  return pc::guarded([&] { return dh::with_room(size, real); });
}

POOLCUDA_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
                                           unsigned int flags) {
  auto real = [&] { return dr::cuMemAllocManaged()(dptr, bytesize, flags); };
  if (pc::bypass()) return real();
  return pc::guarded([&] { return dh::with_room(bytesize, real); });
}

POOLCUDA_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  auto real = [&] { return dr::cuMemAllocAsync()(dptr, bytesize, hStream); };
  if (pc::bypass()) return real();
  // The stream's device's memory, which need not be the current context's.
  return pc::guarded([&] {
    return dh::with_room_on([&] { return dh::stream_device(hStream); }, bytesize, real, true);
  });
}

POOLCUDA_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                              CUstream hStream) {
  auto real = [&] { return dr::cuMemAllocAsync_ptsz()(dptr, bytesize, hStream); };
  if (pc::bypass()) return real();
  // The stream's device's memory, which need not be the current context's.
  return pc::guarded([&] {
    return dh::with_room_on([&] { return dh::stream_device(hStream); }, bytesize, real, true);
  });
}

// Memory the pools never see, which draws on the same device: a stream-ordered pool's, physical
// memory of the virtual memory management API, arrays. Each is tried once more after the pools
// gave their idle memory back when the driver refused it for lack of memory (Note [Room for what
// the pools do not serve] in pooling.cpp). The runtime's cudaMallocFromPoolAsync,
// cudaMallocArray and cudaMalloc3DArray reach these through the driver.
POOLCUDA_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream hStream) {
  auto real = [&] { return dr::cuMemAllocFromPoolAsync()(dptr, bytesize, pool, hStream); };
  if (pc::bypass()) return real();
  return pc::guarded([&] { return dh::with_room_anywhere(bytesize, real); });
}

POOLCUDA_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                      CUmemoryPool pool, CUstream hStream) {
  auto real = [&] { return dr::cuMemAllocFromPoolAsync_ptsz()(dptr, bytesize, pool, hStream); };
  if (pc::bypass()) return real();
  return pc::guarded([&] { return dh::with_room_anywhere(bytesize, real); });
}

POOLCUDA_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags) {
  auto real = [&] { return dr::cuMemCreate()(handle, size, prop, flags); };
  if (pc::bypass()) return real();
  // Only device memory competes with the pools; the device is the one named, not the current.
  const int device = prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                         ? prop->location.id
                         : -1;
  return pc::guarded([&] { return dh::with_room_on(device, size, real); });
}

namespace {

// An array's bytes, as far as its shape tells (dh::kSizeUnknown for formats of another kind),
// only to weigh it against the device's size: a product that overflows is more than any has.
std::size_t array_bytes(std::size_t width, std::size_t height, std::size_t depth,
                        CUarray_format format, unsigned int channels) {
  std::size_t element = 0;
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: element = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: element = 2; break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: element = 4; break;
    default: return dh::kSizeUnknown;
  }
  std::size_t bytes = element;
  for (const std::size_t factor : {width, std::max<std::size_t>(height, 1),
                                   std::max<std::size_t>(depth, 1), std::size_t{channels}}) {
    if (factor != 0 && bytes > SIZE_MAX / factor) return SIZE_MAX;
    bytes *= factor;
  }
  return bytes;
}

}  // namespace

POOLCUDA_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle,
                                          const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  auto real = [&] { return dr::cuArrayCreate_v2()(pHandle, pAllocateArray); };
  if (pc::bypass()) return real();
  const CUDA_ARRAY_DESCRIPTOR* shape = pAllocateArray;
  const std::size_t size = shape == nullptr ? dh::kSizeUnknown
                                            : array_bytes(shape->Width, shape->Height, 1,
                                                          shape->Format, shape->NumChannels);
  return pc::guarded([&] { return dh::with_room(size, real); });
}

POOLCUDA_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  auto real = [&] { return dr::cuArray3DCreate_v2()(pHandle, pAllocateArray); };
  if (pc::bypass()) return real();
  const CUDA_ARRAY3D_DESCRIPTOR* shape = pAllocateArray;
  const std::size_t size =
      shape == nullptr ? dh::kSizeUnknown
                       : array_bytes(shape->Width, shape->Height, shape->Depth, shape->Format,
                                     shape->NumChannels);
  return pc::guarded([&] { return dh::with_room(size, real); });
}

// A mipmapped array holds every level: each halves the extents of the one before, to 1.
POOLCUDA_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle,
                                                const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
                                                unsigned int numMipmapLevels) {
  auto real = [&] {
    return dr::cuMipmappedArrayCreate()(pHandle, pMipmappedArrayDesc, numMipmapLevels);
  };
  if (pc::bypass()) return real();
  std::size_t size = dh::kSizeUnknown;
  if (const CUDA_ARRAY3D_DESCRIPTOR* shape = pMipmappedArrayDesc; shape != nullptr) {
    // A layered or cube map array's depth counts its layers, which every level keeps.
    const bool layered = (shape->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    std::size_t width = shape->Width, height = shape->Height, depth = shape->Depth;
    // The driver clamps the count to 1 + floor(log2(largest extent)); layers left out, so that
    // the sum never exceeds what the driver takes.
    const std::size_t largest = std::max({width, height, layered ? 0 : depth, std::size_t{1}});
    const unsigned int levels = std::clamp<unsigned int>(
        numMipmapLevels, 1, static_cast<unsigned int>(std::bit_width(largest)));
    // An extent of 0 (a 1D or 2D array's) stays 0.
    auto halved = [](std::size_t extent) {
      return extent == 0 ? 0 : std::max<std::size_t>(extent / 2, 1);
    };
    size = 0;
    for (unsigned int level = 0; level < levels && size != SIZE_MAX; ++level) {
      const std::size_t bytes =
          array_bytes(width, height, depth, shape->Format, shape->NumChannels);
      if (bytes == dh::kSizeUnknown) {
        size = dh::kSizeUnknown;
        break;
      }
      size = bytes > SIZE_MAX - size ? SIZE_MAX : size + bytes;
      width = halved(width);
      height = halved(height);
      if (!layered) depth = halved(depth);
    }
  }
  return pc::guarded([&] { return dh::with_room(size, real); });
}

POOLCUDA_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  auto real = [&] { return dr::cuCtxSetLimit()(limit, value); };
  if (pc::bypass()) return real();
  return pc::guarded([&] { return dh::with_room(dh::limit_growth(limit, value), real); });
}

// Code takes device memory too: a kernel's module at its first launch, a module or library the
// program loads, a kernel it asks for when loading is lazy. Refused for lack of memory, the call
// is tried once more after the pools gave their idle memory back (Note [Launches short of
// memory] in hooks.cpp). A call the driver accepts pays the hook's call, one atomic load (Note
// [Room that arrived meanwhile] in pooling.cpp) and one comparison (a load also a copy of its
// option values, a launch four more loads: Note [Memory info after a free] in
// pools/manager_api.cpp), and never marks the process as one that used CUDA through the library
// (Note [Silent processes] in lifecycle.cpp).
namespace {

template <typename Call>
CUresult launch_with_room(CUstream stream, Call&& real) {
  // Noted before and once queued (Note [Memory info after a free] in pools/manager_api.cpp).
  const pc::work_since_free::NoteWorkAround noted_around_call(!pc::bypass());
  const pc::pooling::ReturnsSince returns;
  const CUresult result = real();
  if (result != CUDA_ERROR_OUT_OF_MEMORY || pc::bypass()) return result;
  return pc::guarded(
      [&] { return dh::again_with_room_on(dh::stream_device(stream), returns, real); });
}

// The option values a load was given, for its retry: the driver writes some back (the sizes of
// the JIT's log buffers, the threads per block it chose). Kept without allocating, so that a
// load the driver accepts runs no code of the library's that could fail; CUjit_option has about
// thirty kinds, and a longer list is not kept.
class OptionValues {
 public:
  OptionValues(void** values, unsigned int count)
      : values_(values), count_(values != nullptr && count <= kMostKept ? count : 0) {
    std::copy_n(values_, count_, kept_.begin());
  }
  void restore() const { std::copy_n(kept_.begin(), count_, values_); }

 private:
  static constexpr unsigned int kMostKept = 64;
  void** values_;
  unsigned int count_;
  std::array<void*, kMostKept> kept_;  // the first count_ only: no fill on every load
};

enum class Loads { into_current, into_every_context };

// As launch_with_room, for a load into the current context or, for a library, into every one.
template <typename Call>
CUresult load_with_room(Loads where, void** values, unsigned int count, Call&& real) {
  const OptionValues given(values, count);
  const pc::pooling::ReturnsSince returns;
  const CUresult result = real();
  if (result != CUDA_ERROR_OUT_OF_MEMORY || pc::bypass()) return result;
  return pc::guarded([&] {
    const auto again = [&] {
      given.restore();
      return real();
    };
    return where == Loads::into_every_context
               ? dh::again_with_room_anywhere(returns, again)
               : dh::again_with_room_on(dh::stream_device(nullptr), returns, again);
  });
}

// As launch_with_room, for code that loads into device `device`'s context.
template <typename Call>
CUresult load_on_with_room(CUdevice device, Call&& real) {
  const pc::pooling::ReturnsSince returns;
  const CUresult result = real();
  if (result != CUDA_ERROR_OUT_OF_MEMORY || pc::bypass()) return result;
  return pc::guarded([&] { return dh::again_with_room_on(device, returns, real); });
}

}  // namespace

POOLCUDA_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void** kernelParams, void** extra) {
  return launch_with_room(hStream, [&] {
    return dr::cuLaunchKernel()(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
  });
}

POOLCUDA_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                             unsigned int gridDimY, unsigned int gridDimZ,
                                             unsigned int blockDimX, unsigned int blockDimY,
                                             unsigned int blockDimZ, unsigned int sharedMemBytes,
                                             CUstream hStream, void** kernelParams,
                                             void** extra) {
  return launch_with_room(hStream, [&] {
    return dr::cuLaunchKernel_ptsz()(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                     blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
  });
}

POOLCUDA_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                          void** kernelParams, void** extra) {
  return launch_with_room(config != nullptr ? config->hStream : nullptr,
                          [&] { return dr::cuLaunchKernelEx()(config, f, kernelParams, extra); });
}

POOLCUDA_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                               void** kernelParams, void** extra) {
  return launch_with_room(config != nullptr ? config->hStream : nullptr, [&] {
    return dr::cuLaunchKernelEx_ptsz()(config, f, kernelParams, extra);
  });
}

POOLCUDA_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                                   unsigned int gridDimY, unsigned int gridDimZ,
                                                   unsigned int blockDimX, unsigned int blockDimY,
                                                   unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void** kernelParams) {
  return launch_with_room(hStream, [&] {
    return dr::cuLaunchCooperativeKernel()(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                           blockDimZ, sharedMemBytes, hStream, kernelParams);
  });
}

POOLCUDA_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
    unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
    unsigned int sharedMemBytes, CUstream hStream, void** kernelParams) {
  return launch_with_room(hStream, [&] {
    return dr::cuLaunchCooperativeKernel_ptsz()(f, gridDimX, gridDimY, gridDimZ, blockDimX,
                                                blockDimY, blockDimZ, sharedMemBytes, hStream,
                                                kernelParams);
  });
}

POOLCUDA_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuModuleLoad()(module, fname); });
}

POOLCUDA_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuModuleLoadData()(module, image); });
}

POOLCUDA_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image,
                                            unsigned int numOptions, CUjit_option* options,
                                            void** optionValues) {
  return load_with_room(Loads::into_current, optionValues, numOptions, [&] {
    return dr::cuModuleLoadDataEx()(module, image, numOptions, options, optionValues);
  });
}

POOLCUDA_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuModuleLoadFatBinary()(module, fatCubin); });
}

POOLCUDA_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code,
                                           CUjit_option* jitOptions, void** jitOptionsValues,
                                           unsigned int numJitOptions,
                                           CUlibraryOption* libraryOptions,
                                           void** libraryOptionValues,
                                           unsigned int numLibraryOptions) {
  return load_with_room(Loads::into_every_context, jitOptionsValues, numJitOptions, [&] {
    return dr::cuLibraryLoadData()(library, code, jitOptions, jitOptionsValues, numJitOptions,
                                   libraryOptions, libraryOptionValues, numLibraryOptions);
  });
}

POOLCUDA_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName,
                                               CUjit_option* jitOptions, void** jitOptionsValues,
                                               unsigned int numJitOptions,
                                               CUlibraryOption* libraryOptions,
                                               void** libraryOptionValues,
                                               unsigned int numLibraryOptions) {
  return load_with_room(Loads::into_every_context, jitOptionsValues, numJitOptions, [&] {
    return dr::cuLibraryLoadFromFile()(library, fileName, jitOptions, jitOptionsValues,
                                       numJitOptions, libraryOptions, libraryOptionValues,
                                       numLibraryOptions);
  });
}

// With lazy loading a module's kernels load when the program asks for them, not with the module.
POOLCUDA_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuModuleGetFunction()(hfunc, hmod, name); });
}

POOLCUDA_EXPORT CUresult cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library,
                                            const char* name) {
  return load_with_room(Loads::into_every_context, nullptr, 0,
                        [&] { return dr::cuLibraryGetKernel()(pKernel, library, name); });
}

POOLCUDA_EXPORT CUresult cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuKernelGetFunction()(pFunc, kernel); });
}

POOLCUDA_EXPORT CUresult cuFuncLoad(CUfunction function) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuFuncLoad()(function); });
}

// With lazy loading a kernel also loads when the program first asks about it or tunes it, and a
// module when one of its variables is first used (Note [Launches short of memory] in hooks.cpp).
POOLCUDA_EXPORT CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib,
                                            CUfunction hfunc) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuFuncGetAttribute()(pi, attrib, hfunc); });
}

POOLCUDA_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib,
                                            int value) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuFuncSetAttribute()(hfunc, attrib, value); });
}

POOLCUDA_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuFuncSetCacheConfig()(hfunc, config); });
}

// A CUkernel's attributes are per device: it loads into the device named.
POOLCUDA_EXPORT CUresult cuKernelGetAttribute(int* pi, CUfunction_attribute attrib,
                                              CUkernel kernel, CUdevice dev) {
  return load_on_with_room(dev,
                           [&] { return dr::cuKernelGetAttribute()(pi, attrib, kernel, dev); });
}

POOLCUDA_EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val,
                                              CUkernel kernel, CUdevice dev) {
  return load_on_with_room(dev,
                           [&] { return dr::cuKernelSetAttribute()(attrib, val, kernel, dev); });
}

POOLCUDA_EXPORT CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config,
                                                CUdevice dev) {
  return load_on_with_room(dev,
                           [&] { return dr::cuKernelSetCacheConfig()(kernel, config, dev); });
}

POOLCUDA_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks,
                                                                     CUfunction func,
                                                                     int blockSize,
                                                                     size_t dynamicSMemSize) {
  return load_with_room(Loads::into_current, nullptr, 0, [&] {
    return dr::cuOccupancyMaxActiveBlocksPerMultiprocessor()(numBlocks, func, blockSize,
                                                             dynamicSMemSize);
  });
}

POOLCUDA_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize, unsigned int flags) {
  return load_with_room(Loads::into_current, nullptr, 0, [&] {
    return dr::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags()(numBlocks, func, blockSize,
                                                                      dynamicSMemSize, flags);
  });
}

POOLCUDA_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(
    int* minGridSize, int* blockSize, CUfunction func,
    CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize, int blockSizeLimit) {
  return load_with_room(Loads::into_current, nullptr, 0, [&] {
    return dr::cuOccupancyMaxPotentialBlockSize()(minGridSize, blockSize, func,
                                                  blockSizeToDynamicSMemSize, dynamicSMemSize,
                                                  blockSizeLimit);
  });
}

POOLCUDA_EXPORT CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(
    int* minGridSize, int* blockSize, CUfunction func,
    CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize, int blockSizeLimit,
    unsigned int flags) {
  return load_with_room(Loads::into_current, nullptr, 0, [&] {
    return dr::cuOccupancyMaxPotentialBlockSizeWithFlags()(minGridSize, blockSize, func,
                                                           blockSizeToDynamicSMemSize,
                                                           dynamicSMemSize, blockSizeLimit,
                                                           flags);
  });
}

POOLCUDA_EXPORT CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize,
                                                                 CUfunction func, int numBlocks,
                                                                 int blockSize) {
  return load_with_room(Loads::into_current, nullptr, 0, [&] {
    return dr::cuOccupancyAvailableDynamicSMemPerBlock()(dynamicSmemSize, func, numBlocks,
                                                         blockSize);
  });
}

// The cluster queries take a launch's configuration: its stream's device, as a launch's.
POOLCUDA_EXPORT CUresult cuOccupancyMaxPotentialClusterSize(int* clusterSize, CUfunction func,
                                                            const CUlaunchConfig* config) {
  return launch_with_room(config != nullptr ? config->hStream : nullptr, [&] {
    return dr::cuOccupancyMaxPotentialClusterSize()(clusterSize, func, config);
  });
}

POOLCUDA_EXPORT CUresult cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                                      const CUlaunchConfig* config) {
  return launch_with_room(config != nullptr ? config->hStream : nullptr, [&] {
    return dr::cuOccupancyMaxActiveClusters()(numClusters, func, config);
  });
}

POOLCUDA_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                              const char* name) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuModuleGetGlobal_v2()(dptr, bytes, hmod, name); });
}

POOLCUDA_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library,
                                            const char* name) {
  return load_with_room(Loads::into_current, nullptr, 0,
                        [&] { return dr::cuLibraryGetGlobal()(dptr, bytes, library, name); });
}

POOLCUDA_EXPORT CUresult cuCtxSynchronize() {
  if (pc::bypass()) return dr::cuCtxSynchronize()();
  return pc::guarded([&] { return dh::ctx_synchronize(); });
}

// CUDA 13's synchronize of a named context (null: the current one).
POOLCUDA_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxSynchronize_v2()(ctx);
  return pc::guarded([&] { return dh::ctx_synchronize_named(ctx); });
}

POOLCUDA_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  if (pc::bypass()) return dr::cuStreamCreate()(phStream, Flags);
  return pc::guarded([&] { return dh::stream_create(phStream, Flags); });
}

POOLCUDA_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                                    int priority) {
  if (pc::bypass()) return dr::cuStreamCreateWithPriority()(phStream, flags, priority);
  return pc::guarded([&] { return dh::stream_create_with_priority(phStream, flags, priority); });
}

POOLCUDA_EXPORT CUresult cuStreamDestroy(CUstream hStream) {
  if (pc::bypass()) return dr::cuStreamDestroy()(hStream);
  return pc::guarded([&] { return dh::stream_destroy(dr::cuStreamDestroy(), hStream); });
}

POOLCUDA_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  if (pc::bypass()) return dr::cuStreamDestroy_v2()(hStream);
  return pc::guarded([&] { return dh::stream_destroy(dr::cuStreamDestroy_v2(), hStream); });
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxReset()(dev);
  return pc::guarded([&] { return dh::primary_ctx_reset(dr::cuDevicePrimaryCtxReset(), dev); });
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxReset_v2()(dev);
  return pc::guarded([&] { return dh::primary_ctx_reset(dr::cuDevicePrimaryCtxReset_v2(), dev); });
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxRelease()(dev);
  return pc::guarded([&] { return dh::primary_ctx_release(dr::cuDevicePrimaryCtxRelease(), dev); });
}

POOLCUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (pc::bypass()) return dr::cuDevicePrimaryCtxRelease_v2()(dev);
  return pc::guarded([&] { return dh::primary_ctx_release(dr::cuDevicePrimaryCtxRelease_v2(), dev); });
}

// Note [Graphs dying] in pooling.cpp: the memory a graph pins comes back a little later.
POOLCUDA_EXPORT CUresult cuGraphDestroy(CUgraph graph) {
  const CUresult result = dr::cuGraphDestroy()(graph);
  if (result == CUDA_SUCCESS) poolcuda::pooling::graph_destroyed();
  return result;
}

POOLCUDA_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  const CUresult result = dr::cuGraphExecDestroy()(exec);
  if (result == CUDA_SUCCESS) poolcuda::pooling::graph_destroyed();
  return result;
}

// Contexts of the program's own (Note [Contexts of the program's] in driver_context.cpp). Those
// of cuCtxCreate are made current: a switch of context (below) as well.
namespace {
template <typename Real>
CUresult make_context(Real&& real, bool made_current = true) {
  if (pc::bypass()) return real();  // a forked child's passes through untouched
  return pc::guarded([&] {
    const CUresult result = real();
    if (result != CUDA_SUCCESS) return result;
    pc::driver::note_program_context();
    if (made_current) pc::stream_order::context_switched();
    return result;
  });
}
}  // namespace

POOLCUDA_EXPORT CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return make_context([&] { return dr::cuCtxCreate()(pctx, flags, dev); });
}

POOLCUDA_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return make_context([&] { return dr::cuCtxCreate_v2()(pctx, flags, dev); });
}

POOLCUDA_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params,
                                        int count, unsigned int flags, CUdevice dev) {
  return make_context([&] { return dr::cuCtxCreate_v3()(pctx, params, count, flags, dev); });
}

POOLCUDA_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params,
                                        unsigned int flags, CUdevice dev) {
  return make_context([&] { return dr::cuCtxCreate_v4()(pctx, params, flags, dev); });
}

POOLCUDA_EXPORT CUresult cuCtxFromGreenCtx(CUcontext* pctx, CUgreenCtx green) {
  return make_context([&] { return dr::cuCtxFromGreenCtx()(pctx, green); }, false);
}

// A switch of the thread's context: its device's work is the next to count (free_fence:auto).
namespace {
CUresult switched(CUresult result) {
  if (result == CUDA_SUCCESS) pc::stream_order::context_switched();
  return result;
}
}  // namespace

POOLCUDA_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxSetCurrent()(ctx);
  return pc::guarded([&] { return switched(dr::cuCtxSetCurrent()(ctx)); });
}

POOLCUDA_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxPushCurrent()(ctx);
  return pc::guarded([&] { return switched(dr::cuCtxPushCurrent()(ctx)); });
}

POOLCUDA_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxPushCurrent_v2()(ctx);
  return pc::guarded([&] { return switched(dr::cuCtxPushCurrent_v2()(ctx)); });
}

POOLCUDA_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) {
  if (pc::bypass()) return dr::cuCtxPopCurrent()(pctx);
  return pc::guarded([&] { return switched(dr::cuCtxPopCurrent()(pctx)); });
}

POOLCUDA_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (pc::bypass()) return dr::cuCtxPopCurrent_v2()(pctx);
  return pc::guarded([&] { return switched(dr::cuCtxPopCurrent_v2()(pctx)); });
}

POOLCUDA_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxDestroy()(ctx);
  return pc::guarded([&] { return dh::ctx_destroy(dr::cuCtxDestroy(), ctx); });
}

POOLCUDA_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (pc::bypass()) return dr::cuCtxDestroy_v2()(ctx);
  return pc::guarded([&] { return dh::ctx_destroy(dr::cuCtxDestroy_v2(), ctx); });
}

// ---- Capture: the capture layer's begin and end (capture_hooks.cpp) -------------------------

namespace {

// `real` makes the variant the program called; `per_thread`: the 0 handle is the per-thread
// default stream. A handle the driver refuses, and an end where the driver sees no capture, go
// to the driver alone (dh::DriverStream: the capture layer's queries would leave an error in the
// program's last-error slot).
template <typename Real>
CUresult begin_capture(CUstream stream, bool per_thread, CUstreamCaptureMode mode,
                       Real&& real) {
  if (pc::bypass()) return real();
  return pc::guarded([&] {
    if (!dh::driver_stream(stream, per_thread).known) return real();
    return static_cast<CUresult>(poolcuda::hooks::begin_capture(
        reinterpret_cast<cudaStream_t>(stream), per_thread,
        static_cast<cudaStreamCaptureMode>(mode), [&] { return int(real()); }));
  });
}

template <typename Real>
CUresult end_capture(CUstream stream, bool per_thread, CUgraph* graph, Real&& real) {
  if (pc::bypass()) return real();
  return pc::guarded([&] {
    if (!dh::driver_stream(stream, per_thread).capturing) return real();
    return static_cast<CUresult>(poolcuda::hooks::end_capture(
        reinterpret_cast<cudaStream_t>(stream), per_thread,
        reinterpret_cast<cudaGraph_t*>(graph), [&] { return int(real()); }));
  });
}

}  // namespace

POOLCUDA_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  return begin_capture(hStream, false, CU_STREAM_CAPTURE_MODE_GLOBAL,
                       [&] { return dr::cuStreamBeginCapture()(hStream); });
}

POOLCUDA_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return begin_capture(hStream, true, CU_STREAM_CAPTURE_MODE_GLOBAL,
                       [&] { return dr::cuStreamBeginCapture_ptsz()(hStream); });
}

POOLCUDA_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture(hStream, false, mode,
                       [&] { return dr::cuStreamBeginCapture_v2()(hStream, mode); });
}

POOLCUDA_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture(hStream, true, mode,
                       [&] { return dr::cuStreamBeginCapture_v2_ptsz()(hStream, mode); });
}

POOLCUDA_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                     const CUgraphNode* dependencies,
                                                     const CUgraphEdgeData* dependencyData,
                                                     size_t numDependencies,
                                                     CUstreamCaptureMode mode) {
  return begin_capture(hStream, false, mode, [&] {
    return dr::cuStreamBeginCaptureToGraph()(hStream, hGraph, dependencies, dependencyData,
                                             numDependencies, mode);
  });
}

POOLCUDA_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                          const CUgraphNode* dependencies,
                                                          const CUgraphEdgeData* dependencyData,
                                                          size_t numDependencies,
                                                          CUstreamCaptureMode mode) {
  return begin_capture(hStream, true, mode, [&] {
    return dr::cuStreamBeginCaptureToGraph_ptsz()(hStream, hGraph, dependencies, dependencyData,
                                                  numDependencies, mode);
  });
}

POOLCUDA_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return end_capture(hStream, false, phGraph,
                     [&] { return dr::cuStreamEndCapture()(hStream, phGraph); });
}

POOLCUDA_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return end_capture(hStream, true, phGraph,
                     [&] { return dr::cuStreamEndCapture_ptsz()(hStream, phGraph); });
}

namespace {

// `per_thread`: the _ptsz entry point, whose null handle is the per-thread stream.
template <typename Call>
CUresult host_function(CUstream stream, bool per_thread, Call&& real) {
  if (pc::bypass()) return real();
  (void)pc::guarded([&] {
    pc::pooling::before_host_function(per_thread && stream == nullptr
                                          ? cudaStreamPerThread
                                          : reinterpret_cast<cudaStream_t>(stream));
    return CUDA_SUCCESS;
  });
  return pc::guarded([&] { return real(); });
}

// A graph launch may park its stream on a host node: earlier frees' fences are recorded first,
// as for the runtime's cudaGraphLaunch (Note [Idle memory before a park] in
// pools/memory_manager.cpp), and nothing more (waiting for the device before every launch would
// undo what graphs are for).
template <typename Call>
CUresult graph_launch(Call&& real) {
  const pc::work_since_free::NoteWorkAround noted_around_call(!pc::bypass());
  if (!pc::bypass()) {
    (void)pc::guarded([] {
      pc::pooling::fence_before_host_work();
      return CUDA_SUCCESS;
    });
  }
  return real();
}

}  // namespace

POOLCUDA_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return graph_launch([&] { return dr::cuGraphLaunch()(hGraphExec, hStream); });
}

POOLCUDA_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return graph_launch([&] { return dr::cuGraphLaunch_ptsz()(hGraphExec, hStream); });
}

POOLCUDA_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return host_function(hStream, false,
                       [&] { return dr::cuLaunchHostFunc()(hStream, fn, userData); });
}

POOLCUDA_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  return host_function(hStream, true,
                       [&] { return dr::cuLaunchHostFunc_ptsz()(hStream, fn, userData); });
}

POOLCUDA_EXPORT CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback,
                                             void* userData, unsigned int flags) {
  return host_function(
      hStream, false,
      [&] { return dr::cuStreamAddCallback()(hStream, callback, userData, flags); });
}

POOLCUDA_EXPORT CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback,
                                                  void* userData, unsigned int flags) {
  return host_function(
      hStream, true,
      [&] { return dr::cuStreamAddCallback_ptsz()(hStream, callback, userData, flags); });
}
