// The driver stand-in's device-memory allocators besides cuMemAlloc and the stream-ordered
// default pool: physical allocations of the virtual memory management API
// (cuMemGetAllocationGranularity, cuMemCreate, cuMemRelease; nothing maps them), CUDA arrays
// (cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy), mipmapped arrays
// (cuMipmappedArrayCreate, cuMipmappedArrayGetLevel, cuMipmappedArrayDestroy) and explicit memory
// pools (cuMemPoolCreate, cuMemPoolDestroy, cuMemAllocFromPoolAsync and _ptsz). Each draws on a
// device's capacity through the core's mem_alloc, as cuMemAlloc does, so it can run out of
// memory and cuMemGetInfo sees it. The handles are those of Note [Unpooled handles].
#include <algorithm>
#include <bit>
#include <cstddef>
#include <set>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

namespace {

// Note [Unpooled handles]
// A handle from cuMemCreate, cuArrayCreate_v2 / cuArray3DCreate_v2, cuMipmappedArrayCreate or
// cuMemPoolCreate is the address of a heap object this file registered (a Block, a Mipmap or a
// Pool), never a device address. A handle the registry does not know is refused, so a device
// pointer passed as a handle is unknown, and a handle passed where a pointer is expected
// (cudaFree, a copy) is not device memory. A Block remembers its allocation's id: one whose
// memory a device reset already freed frees nothing that reuses the address.

constexpr size_t kGranularity = size_t{2} << 20;  // what a real GPU reports, both flavours

struct Block {  // the memory behind a physical allocation or an array
  void* base;
  uint64_t id;
};
struct Pool {
  int device;
};

template <class T>
class Registry {
 public:
  T* add(T value) {
    auto* obj = new T(value);
    std::lock_guard lock(m_);
    live_.insert(obj);
    return obj;
  }
  // A copy of the live object at `obj`; false when there is none.
  bool get(const void* obj, T* out) {
    std::lock_guard lock(m_);
    auto it = live_.find(static_cast<T*>(const_cast<void*>(obj)));
    if (it == live_.end()) return false;
    *out = **it;
    return true;
  }
  // Unregisters and deletes the object at `obj`, giving back its value; false when unknown.
  bool take(const void* obj, T* out) {
    T* found = nullptr;
    {
      std::lock_guard lock(m_);
      auto it = live_.find(static_cast<T*>(const_cast<void*>(obj)));
      if (it == live_.end()) return false;
      found = *it;
      live_.erase(it);
    }
    *out = *found;
    delete found;
    return true;
  }

 private:
  std::mutex m_;
  std::set<T*> live_;
};

// Never destroyed: a program may release handles while static destructors run.
Registry<Block>& physical() {
  static auto* r = new Registry<Block>;
  return *r;
}
Registry<Block>& arrays() {
  static auto* r = new Registry<Block>;
  return *r;
}
Registry<Pool>& pools() {
  static auto* r = new Registry<Pool>;
  return *r;
}

// A synchronous allocation on `device` (potentially unsafe during a capture, as cuMemAlloc).
CUresult take(int device, size_t bytes, Block* out) {
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  return alloc_result(
      after_refusal(mem_alloc(device, bytes, AllocKind::device, &out->base, &out->id)));
}

// take(), registered in `reg`.
CUresult allocate(Registry<Block>& reg, int device, size_t bytes, Block** out) {
  Block b{};
  CUresult r = take(device, bytes, &b);
  if (r == CUDA_SUCCESS) *out = reg.add(b);
  return r;
}

CUresult release(Registry<Block>& reg, const void* handle, CUresult unknown) {
  Block b{};
  if (!reg.take(handle, &b)) return unknown;
  if (b.base == nullptr) return CUDA_SUCCESS;  // host memory of cuMemCreate: nothing charged
  return mem_free(b.base, b.id) == cudaSuccess ? CUDA_SUCCESS : unknown;
}

// Pinned memory on an existing device: the only kind the stand-in has.
bool device_prop(const CUmemAllocationProp* prop) {
  return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(prop->location.id);
}

// Pinned host memory not bound to a NUMA node (CUDA documents it for cuMemCreate; the id is
// ignored, and such memory is not shareable).
bool host_prop(const CUmemAllocationProp* prop) {
  return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_HOST && prop->requestedHandleTypes == 0;
}

}  // namespace

// ---- Physical allocations (virtual memory management) ---------------------------------------

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  if (CUresult r = guard()) return r;
  const bool known_option = option == CU_MEM_ALLOC_GRANULARITY_MINIMUM ||
                            option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
  if (!granularity || !device_prop(prop) || !known_option) return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

// Charges the device the properties name, whichever context is current; host memory charges
// nothing (the stand-in keeps no host capacity).
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  bump(Counter::cuMemCreate);
  if (CUresult r = guard()) return r;
  const bool host = host_prop(prop);
  if (!handle || !(host || device_prop(prop)) || flags != 0 || size == 0 ||
      size % kGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (host) {
    *handle = reinterpret_cast<uintptr_t>(physical().add(Block{}));
    return CUDA_SUCCESS;
  }
  Block* b = nullptr;
  CUresult r = allocate(physical(), prop->location.id, size, &b);
  if (r == CUDA_SUCCESS) *handle = reinterpret_cast<uintptr_t>(b);
  return r;
}

// Nothing maps the memory, so it goes back at once (the real driver waits for the last unmap).
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  bump(Counter::cuMemRelease);
  if (CUresult r = guard()) return r;
  return release(physical(), reinterpret_cast<void*>(static_cast<uintptr_t>(handle)),
                 CUDA_ERROR_INVALID_VALUE);
}

// ---- Arrays ---------------------------------------------------------------------------------

namespace {

size_t element_size(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:  // block-compressed, packed and planar formats are not modelled
      return 0;
  }
}

// The bytes of one element: 0 for a format or channel count no array holds.
size_t texel_bytes(CUarray_format format, unsigned channels) {
  if (channels != 1 && channels != 2 && channels != 4) return 0;
  return element_size(format) * channels;
}

// texel x width x height x depth, a zero height or depth counting as 1 (a 1D or 2D array); false
// when size_t cannot count it.
bool extent_bytes(size_t texel, size_t width, size_t height, size_t depth, size_t* out) {
  size_t bytes = texel;
  for (size_t extent : {width, std::max<size_t>(height, 1), std::max<size_t>(depth, 1)}) {
    if (bytes > SIZE_MAX / extent) return false;
    bytes *= extent;
  }
  *out = bytes;
  return true;
}

// Charges the current context's device (callers passed guard(true)) the array's bytes, without
// padding.
CUresult create_array(CUarray* out, size_t width, size_t height, size_t depth,
                      CUarray_format format, unsigned channels) {
  const size_t texel = texel_bytes(format, channels);
  if (!out || width == 0 || texel == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t bytes = 0;
  if (!extent_bytes(texel, width, height, depth, &bytes))
    return CUDA_ERROR_OUT_OF_MEMORY;  // as cuMemAllocPitch_v2
  Block* b = nullptr;
  CUresult r = allocate(arrays(), context_device(), bytes, &b);
  if (r == CUDA_SUCCESS) *out = reinterpret_cast<CUarray>(b);
  return r;
}

}  // namespace

CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  bump(Counter::cuArrayCreate);
  if (CUresult r = guard(true)) return r;
  if (!desc) return CUDA_ERROR_INVALID_VALUE;
  return create_array(pHandle, desc->Width, desc->Height, 0, desc->Format, desc->NumChannels);
}

// Surface load/store changes nothing the stand-in models; layered, cube map and the other flags
// change the layout, which it does not model.
CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  bump(Counter::cuArrayCreate);
  if (CUresult r = guard(true)) return r;
  if (!desc) return CUDA_ERROR_INVALID_VALUE;
  if (desc->Flags & ~unsigned{CUDA_ARRAY3D_SURFACE_LDST}) return CUDA_ERROR_NOT_SUPPORTED;
  return create_array(pHandle, desc->Width, desc->Height, desc->Depth, desc->Format,
                      desc->NumChannels);
}

CUresult cuArrayDestroy(CUarray hArray) {
  bump(Counter::cuArrayDestroy);
  if (CUresult r = guard(true)) return r;
  return release(arrays(), hArray, CUDA_ERROR_INVALID_HANDLE);
}

// ---- Mipmapped arrays ------------------------------------------------------------------------
// One allocation holds every level: the level array of cuMipmappedArrayGetLevel is part of its
// mipmapped array, and cuArrayDestroy, which knows only the arrays of cuArrayCreate_v2 and
// cuArray3DCreate_v2, refuses it.

namespace {

constexpr unsigned kMaxLevels = 64;  // 1 + floor(log2(SIZE_MAX))

// A level's handle is the address of its byte in `level_tags`: inside the Mipmap, so never
// another object's handle, and alive exactly as long as the mipmapped array.
struct Mipmap {
  Block memory;
  unsigned levels;
  char level_tags[kMaxLevels];
};

Registry<Mipmap>& mipmaps() {
  static auto* r = new Registry<Mipmap>;  // never destroyed, as the other registries
  return *r;
}

// A level's extent: half the level above's, at least 1; the zero height or depth of a 1D or 2D
// array stays zero.
size_t level_extent(size_t extent, unsigned level) {
  return extent == 0 ? 0 : std::max<size_t>(extent >> level, 1);
}

}  // namespace

// CUDA clamps the level count to [1, 1 + floor(log2(largest extent))]. Layered and cube map
// arrays keep their layer count at every level, a layout the stand-in does not model.
CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                unsigned int numMipmapLevels) {
  bump(Counter::cuMipmappedArrayCreate);
  if (CUresult r = guard(true)) return r;
  if (!desc) return CUDA_ERROR_INVALID_VALUE;
  if (desc->Flags & ~unsigned{CUDA_ARRAY3D_SURFACE_LDST}) return CUDA_ERROR_NOT_SUPPORTED;
  const size_t texel = texel_bytes(desc->Format, desc->NumChannels);
  if (!pHandle || desc->Width == 0 || texel == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t largest = std::max({desc->Width, desc->Height, desc->Depth});
  const unsigned levels =
      std::clamp(numMipmapLevels, 1u, static_cast<unsigned>(std::bit_width(largest)));
  size_t total = 0;
  for (unsigned level = 0; level < levels; ++level) {
    size_t bytes = 0;
    if (!extent_bytes(texel, level_extent(desc->Width, level), level_extent(desc->Height, level),
                      level_extent(desc->Depth, level), &bytes) ||
        bytes > SIZE_MAX - total)
      return CUDA_ERROR_OUT_OF_MEMORY;  // as create_array
    total += bytes;
  }
  Mipmap m{};
  m.levels = levels;
  CUresult r = take(context_device(), total, &m.memory);
  if (r == CUDA_SUCCESS) *pHandle = reinterpret_cast<CUmipmappedArray>(mipmaps().add(m));
  return r;
}

CUresult cuMipmappedArrayGetLevel(CUarray* pLevelArray, CUmipmappedArray hMipmappedArray,
                                  unsigned int level) {
  if (CUresult r = guard(true)) return r;
  Mipmap m{};
  if (!mipmaps().get(hMipmappedArray, &m)) return CUDA_ERROR_INVALID_HANDLE;
  if (!pLevelArray || level >= m.levels) return CUDA_ERROR_INVALID_VALUE;
  *pLevelArray = reinterpret_cast<CUarray>(reinterpret_cast<uintptr_t>(hMipmappedArray) +
                                           offsetof(Mipmap, level_tags) + level);
  return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  bump(Counter::cuMipmappedArrayDestroy);
  if (CUresult r = guard(true)) return r;
  Mipmap m{};
  if (!mipmaps().take(hMipmappedArray, &m)) return CUDA_ERROR_INVALID_HANDLE;
  // A device reset freed the memory, and with it every mipmapped array it held.
  return mem_free(m.memory.base, m.memory.id) == cudaSuccess ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_HANDLE;
}

// ---- Explicit memory pools ------------------------------------------------------------------
// A pool is only its device: each allocation from it is a stream-ordered allocation of that
// device (the memory of cuMemAllocAsync, freed by cuMemFreeAsync / cudaFreeAsync / cuMemFree),
// whatever the stream's device. Nothing is cached, so the pool's attributes, maxSize included,
// are not modelled; destroying a pool leaves its outstanding allocations to their frees, as CUDA
// does.

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (CUresult r = guard()) return r;
  if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(props->location.id))
    return CUDA_ERROR_INVALID_VALUE;
  *pool = reinterpret_cast<CUmemoryPool>(pools().add(Pool{props->location.id}));
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  if (CUresult r = guard()) return r;
  Pool p{};
  return pools().take(pool, &p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

namespace {

CUresult alloc_from_pool(CUdeviceptr* out, size_t size, CUmemoryPool pool, CUstream stream,
                         bool per_thread) {
  bump(Counter::cuMemAllocFromPoolAsync);
  if (CUresult r = guard(true)) return r;
  Pool p{};
  if (!out || !pools().get(pool, &p)) return CUDA_ERROR_INVALID_VALUE;
  void* mem = nullptr;
  cudaError_t err = malloc_async(resolve_stream(rt(stream), per_thread), size, &mem, p.device);
  if (err == cudaSuccess) *out = dptr(mem);
  return alloc_result(err);
}

}  // namespace

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr_out, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
  return alloc_from_pool(dptr_out, bytesize, pool, hStream, false);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr_out, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
  return alloc_from_pool(dptr_out, bytesize, pool, hStream, true);
}
