// The driver stand-in (libcuda.so.1): the subset of the driver API the interposer's driver-level
// hooks need (init, devices, primary contexts, allocation, memory info, stream-ordered
// allocation) and cuGetProcAddress / cuGetProcAddress_v2, which map a base name, a CUDA version
// and stream flags to the exact entry point variant, as the real driver does (see
// Note [Driver entry point table]). Shares all state with the runtime stand-in through the core.
// core.h first: cuda.h #defines names such as cuMemAlloc that core.h uses as identifiers.
#include "core.h"

#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstring>

using namespace poolcuda::sim;

// cuda.h maps the base names to their newest variants; the v1 entry points (32-bit sizes) are
// symbols of their own, exported but not supported by the stand-in.
#undef cuGetProcAddress
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuDevicePrimaryCtxRelease
extern "C" {
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuMemAlloc(unsigned int* dptr, unsigned int bytesize);
CUresult cuMemFree(unsigned int dptr);
CUresult cuMemGetInfo(unsigned int* free, unsigned int* total);
CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
}
extern "C" CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
extern "C" CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

namespace {

std::atomic<bool> g_initialized{false};

CUresult as_cu(cudaError_t e) { return static_cast<CUresult>(e); }  // the codes coincide

CUresult guard(bool need_context = false) {
  if (!g_initialized.load()) return CUDA_ERROR_NOT_INITIALIZED;
  if (cudaError_t sticky = sticky_error()) return as_cu(sticky);
  if (need_context && !thread_context()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

int context_device() { return thread_context() ? thread_context()->device : current_device(); }

CUdeviceptr dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }
void* ptr(CUdeviceptr d) { return reinterpret_cast<void*>(static_cast<uintptr_t>(d)); }

CUresult alloc_async(CUdeviceptr* out, size_t size, CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  void* p = nullptr;
  cudaError_t err =
      malloc_async(resolve_stream(reinterpret_cast<cudaStream_t>(stream), per_thread), size, &p);
  if (err == cudaSuccess) *out = dptr(p);
  return as_cu(err);
}

CUresult free_async_impl(CUdeviceptr d, CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(free_async(resolve_stream(reinterpret_cast<cudaStream_t>(stream), per_thread), ptr(d)));
}

}  // namespace

CUresult cuMemAlloc(unsigned int*, unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemFree(unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemGetInfo(unsigned int*, unsigned int*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuDeviceTotalMem(unsigned int*, CUdevice) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuDevicePrimaryCtxRelease(CUdevice) { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (config().devices == 0) return CUDA_ERROR_NO_DEVICE;
  g_initialized.store(true);
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* driverVersion) {
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = 13000;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = guard()) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  if (CUresult r = guard()) return r;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = config().devices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = config().memory;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "simcuda device %d", dev);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult r = guard()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(thread_context());
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult r = guard()) return r;
  auto* c = reinterpret_cast<Context*>(ctx);
  if (c && (!valid_device(c->device) || primary_context(c->device) != c))
    return CUDA_ERROR_INVALID_CONTEXT;
  thread_context() = c;
  if (c) current_device() = c->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  if (CUresult r = guard(true)) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = thread_context()->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  if (CUresult r = guard(true)) return r;
  int device = thread_context()->device;
  {
    std::lock_guard lock(state_mutex());
    if (invalidate_device_captures_locked(device)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  device_drain(device);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pctx = reinterpret_cast<CUcontext>(primary_context(dev));
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t bytesize) {
  bump(Counter::cuMemAlloc);
  if (CUresult r = guard(true)) return r;
  if (!out || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  void* p = nullptr;
  cudaError_t err = mem_alloc(context_device(), bytesize, AllocKind::device, &p);
  if (err == cudaSuccess) *out = dptr(p);
  return err == cudaErrorMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : as_cu(err);
}

CUresult cuMemAllocManaged(CUdeviceptr* out, size_t bytesize, unsigned int flags) {
  if (CUresult r = guard(true)) return r;
  if (!out || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  void* p = nullptr;
  cudaError_t err = mem_alloc(context_device(), bytesize, AllocKind::managed, &p);
  if (err == cudaSuccess) *out = dptr(p);
  return err == cudaErrorMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : as_cu(err);
}

CUresult cuMemFree_v2(CUdeviceptr d) {
  bump(Counter::cuMemFree);
  if (CUresult r = guard(true)) return r;
  if (d == 0) return CUDA_SUCCESS;
  AllocInfo info;
  if (!mem_find(ptr(d), &info) || info.base != static_cast<uintptr_t>(d))
    return CUDA_ERROR_INVALID_VALUE;
  {
    // Like cudaFree, cuMemFree synchronizes: illegal while a capture is open on the device.
    std::lock_guard lock(state_mutex());
    if (invalidate_device_captures_locked(info.device))
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  device_drain(info.device);
  std::lock_guard lock(effects_mutex());
  return as_cu(mem_free(ptr(d), info.id));
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (CUresult r = guard(true)) return r;
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  mem_info(context_device(), free, total);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr_out, size_t bytesize, CUstream hStream) {
  return alloc_async(dptr_out, bytesize, hStream, false);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr_out, size_t bytesize, CUstream hStream) {
  return alloc_async(dptr_out, bytesize, hStream, true);
}
CUresult cuMemFreeAsync(CUdeviceptr d, CUstream hStream) { return free_async_impl(d, hStream, false); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream hStream) {
  return free_async_impl(d, hStream, true);
}

namespace {

// Note [Driver entry point table]
// One row per exported variant: base name, the CUDA version that introduced the variant, and
// whether it is the per-thread-default-stream flavour. cuGetProcAddress picks, among the rows of
// the requested name and flavour, the newest whose version does not exceed the caller's; a name
// with no per-thread flavour serves both. Versions below a _v2's introduction get the v1 row,
// which the stand-in exports but does not implement (32-bit sizes): CUDA_ERROR_NOT_SUPPORTED.
struct Entry {
  const char* name;
  int version;
  bool per_thread;
  void* fn;
};

#define SIM_FN(f) reinterpret_cast<void*>(&(f))
const Entry kEntries[] = {
    {"cuInit", 2000, false, SIM_FN(cuInit)},
    {"cuDriverGetVersion", 2020, false, SIM_FN(cuDriverGetVersion)},
    {"cuDeviceGet", 2000, false, SIM_FN(cuDeviceGet)},
    {"cuDeviceGetCount", 2000, false, SIM_FN(cuDeviceGetCount)},
    {"cuDeviceGetName", 2000, false, SIM_FN(cuDeviceGetName)},
    {"cuDeviceTotalMem", 2000, false, SIM_FN(cuDeviceTotalMem)},
    {"cuDeviceTotalMem", 3020, false, SIM_FN(cuDeviceTotalMem_v2)},
    {"cuCtxGetCurrent", 4000, false, SIM_FN(cuCtxGetCurrent)},
    {"cuCtxSetCurrent", 4000, false, SIM_FN(cuCtxSetCurrent)},
    {"cuCtxGetDevice", 2000, false, SIM_FN(cuCtxGetDevice)},
    {"cuCtxSynchronize", 2000, false, SIM_FN(cuCtxSynchronize)},
    {"cuDevicePrimaryCtxRetain", 7000, false, SIM_FN(cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease", 7000, false, SIM_FN(cuDevicePrimaryCtxRelease)},
    {"cuDevicePrimaryCtxRelease", 11000, false, SIM_FN(cuDevicePrimaryCtxRelease_v2)},
    {"cuMemAlloc", 2000, false, SIM_FN(cuMemAlloc)},
    {"cuMemAlloc", 3020, false, SIM_FN(cuMemAlloc_v2)},
    {"cuMemFree", 2000, false, SIM_FN(cuMemFree)},
    {"cuMemFree", 3020, false, SIM_FN(cuMemFree_v2)},
    {"cuMemGetInfo", 2000, false, SIM_FN(cuMemGetInfo)},
    {"cuMemGetInfo", 3020, false, SIM_FN(cuMemGetInfo_v2)},
    {"cuMemAllocManaged", 6000, false, SIM_FN(cuMemAllocManaged)},
    {"cuMemAllocAsync", 11020, false, SIM_FN(cuMemAllocAsync)},
    {"cuMemAllocAsync", 11020, true, SIM_FN(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, false, SIM_FN(cuMemFreeAsync)},
    {"cuMemFreeAsync", 11020, true, SIM_FN(cuMemFreeAsync_ptsz)},
    {"cuGetProcAddress", 11030, false, SIM_FN(cuGetProcAddress)},
    {"cuGetProcAddress", 12000, false, SIM_FN(cuGetProcAddress_v2)},
};
#undef SIM_FN

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  if (flags & ~cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM})
    return CUDA_ERROR_INVALID_VALUE;
  bool per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  bool known = false, has_per_thread = false;
  for (const Entry& e : kEntries)
    if (std::strcmp(e.name, symbol) == 0) {
      known = true;
      has_per_thread |= e.per_thread;
    }
  if (!known) return CUDA_ERROR_NOT_FOUND;
  bool want_per_thread = per_thread && has_per_thread;
  const Entry* best = nullptr;
  for (const Entry& e : kEntries)
    if (std::strcmp(e.name, symbol) == 0 && e.per_thread == want_per_thread &&
        e.version <= version && (!best || e.version > best->version))
      best = &e;
  if (!best) {
    if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

extern "C" CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags) {
  return lookup(symbol, pfn, cudaVersion, flags, nullptr);
}
