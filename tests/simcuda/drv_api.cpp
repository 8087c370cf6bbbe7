// The driver stand-in (libcuda.so.1): initialization, devices and contexts (primary contexts
// with their reference counts, contexts made by cuCtxCreate), and cuGetProcAddress /
// cuGetProcAddress_v2, which map a base name, a CUDA version and stream flags to the exact entry
// point variant, as the real driver does (see Note [Driver entry point table]). Memory, streams
// and events are in drv_work.cpp; physical allocations, arrays, mipmapped arrays and explicit
// memory pools in drv_unpooled.cpp; context limits in drv_limits.cpp; capture, graphs and user
// objects in drv_capture.cpp; launches and module and library loads in drv_code.cpp; function
// attributes, occupancy and variables in drv_code_use.cpp. Shares all state with the runtime
// stand-in through the core.
#include <cstdio>
#include <cstring>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

CUresult cuDeviceTotalMem(unsigned int*, CUdevice) { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (config().devices == 0) return CUDA_ERROR_NO_DEVICE;
  set_driver_initialized();
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

// Only the device's shape, which sizes its threads' stacks (core.h); other attributes are not
// modelled in the driver.
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = kMultiprocessors; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      *value = kThreadsPerMultiprocessor;
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "simcuda device %d", dev);
  return CUDA_SUCCESS;
}

namespace {

Context* as_context(CUcontext ctx) { return reinterpret_cast<Context*>(ctx); }
CUcontext as_handle(Context* ctx) { return reinterpret_cast<CUcontext>(ctx); }

// Binds `ctx` (null: none) to the calling thread; the runtime then works on its device.
void make_current(Context* ctx) {
  thread_context() = ctx;
  if (ctx) current_device() = ctx->device;
}

}  // namespace

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult r = guard()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = as_handle(thread_context());
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult r = guard()) return r;
  Context* c = as_context(ctx);
  if (c && !valid_device(c->device)) return CUDA_ERROR_INVALID_CONTEXT;
  // A primary context a reset destroyed can be made current (as on an H200); calls in it then
  // fail (Note [Primary contexts after a reset] in context.cpp).
  if (c && c->destroyed && !c->primary) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  make_current(c);
  return CUDA_SUCCESS;
}

// The thread's context stack: the current context is its top, the rest waits below it
// (contexts_below() in context.cpp).
CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (CUresult r = guard()) return r;
  Context* c = as_context(ctx);
  if (!c || !valid_device(c->device)) return CUDA_ERROR_INVALID_CONTEXT;
  if (c->destroyed && !c->primary) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  contexts_below().push_back(thread_context());
  make_current(c);
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult r = guard()) return r;
  if (!thread_context()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = as_handle(thread_context());
  std::vector<Context*>& below = contexts_below();
  Context* next = below.empty() ? nullptr : below.back();
  if (!below.empty()) below.pop_back();
  make_current(next);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }

CUresult cuCtxGetDevice(CUdevice* device) {
  if (CUresult r = guard(true)) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = context_device();
  return CUDA_SUCCESS;
}

// CUDA 13's variant, which cuGetProcAddress hands out for "cuCtxGetDevice" from version 13000:
// the device of `ctx`, or of the current context when it is NULL.
CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (CUresult r = guard(ctx == nullptr)) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  Context* c = ctx ? as_context(ctx) : thread_context();
  if (c->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *device = c->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  if (CUresult r = guard(ctx == nullptr)) return r;
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  Context* c = ctx ? as_context(ctx) : thread_context();
  if (c->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *id = c->id;
  return CUDA_SUCCESS;
}

namespace {

// Waits for everything submitted on the device; illegal while a capture is open on it.
CUresult synchronize_device(int device) {
  {
    std::lock_guard lock(state_mutex());
    if (invalidate_device_captures_locked(device)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  device_drain(device);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuCtxSynchronize(void) {
  if (CUresult r = guard(true)) return r;
  return synchronize_device(context_device());
}

// CUDA 13's form names the context (NULL: the current one); the stand-in's work belongs to
// devices, so it waits for the context's device, as cuCtxSynchronize there would.
CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  if (CUresult r = guard(ctx == nullptr)) return r;
  Context* c = ctx ? as_context(ctx) : thread_context();
  if (c->destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return synchronize_device(c->device);
}

namespace {

CUresult create_context_on(CUcontext* pctx, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Context* ctx = create_context(dev);
  if (thread_context()) contexts_below().push_back(thread_context());
  make_current(ctx);  // cuCtxCreate pushes the new context: it becomes current
  *pctx = as_handle(ctx);
  return CUDA_SUCCESS;
}

}  // namespace

// The flags (scheduling, mapping) mean nothing to the stand-in.
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int, CUdevice dev) {
  return create_context_on(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int, CUdevice dev) {
  return create_context_on(pctx, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (CUresult r = guard()) return r;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  return as_cu(destroy_context(as_context(ctx)));
}

// The CUDA 2.0 entry point; the stand-in does not model how it differed.
extern "C" CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  primary_retain(dev);
  *pctx = as_handle(primary_context(dev));
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  return as_cu(primary_release(dev));
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  if (CUresult r = guard()) return r;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = primary_active(dev) ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  if (CUresult r = guard()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  device_reset(dev);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

namespace {

// Note [Driver entry point table]
// One row per exported variant: base name, the CUDA version that introduced the variant, and
// whether it is the per-thread-default-stream flavour. cuGetProcAddress picks, among the rows of
// the requested name and flavour, the newest whose version does not exceed the caller's; a name
// with no per-thread flavour serves both. Versions below a _v2's introduction get the v1 row,
// which the stand-in exports but may not implement (32-bit sizes: CUDA_ERROR_NOT_SUPPORTED).
// Rows whose function is one of the generated fallbacks (cuCtxCreate_v3...) are listed so that
// the version rules hold; calling them reports "not supported".
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
    {"cuDeviceGetAttribute", 2000, false, SIM_FN(cuDeviceGetAttribute)},
    {"cuDeviceTotalMem", 2000, false, SIM_FN(cuDeviceTotalMem)},
    {"cuDeviceTotalMem", 3020, false, SIM_FN(cuDeviceTotalMem_v2)},
    {"cuCtxCreate", 3020, false, SIM_FN(cuCtxCreate_v2)},
    {"cuCtxCreate", 11040, false, SIM_FN(cuCtxCreate_v3)},
    {"cuCtxCreate", 12050, false, SIM_FN(cuCtxCreate_v4)},
    {"cuCtxDestroy", 2000, false, SIM_FN(cuCtxDestroy)},
    {"cuCtxDestroy", 4000, false, SIM_FN(cuCtxDestroy_v2)},
    {"cuCtxGetCurrent", 4000, false, SIM_FN(cuCtxGetCurrent)},
    {"cuCtxSetCurrent", 4000, false, SIM_FN(cuCtxSetCurrent)},
    {"cuCtxPushCurrent", 2000, false, SIM_FN(cuCtxPushCurrent)},
    {"cuCtxPushCurrent", 4000, false, SIM_FN(cuCtxPushCurrent_v2)},
    {"cuCtxPopCurrent", 2000, false, SIM_FN(cuCtxPopCurrent)},
    {"cuCtxPopCurrent", 4000, false, SIM_FN(cuCtxPopCurrent_v2)},
    {"cuCtxGetDevice", 2000, false, SIM_FN(cuCtxGetDevice)},
    {"cuCtxGetDevice", 13000, false, SIM_FN(cuCtxGetDevice_v2)},
    {"cuCtxGetId", 12000, false, SIM_FN(cuCtxGetId)},
    {"cuCtxSynchronize", 2000, false, SIM_FN(cuCtxSynchronize)},
    {"cuCtxSynchronize", 13000, false, SIM_FN(cuCtxSynchronize_v2)},
    {"cuCtxSetLimit", 3010, false, SIM_FN(cuCtxSetLimit)},
    {"cuCtxGetLimit", 3010, false, SIM_FN(cuCtxGetLimit)},
    {"cuDevicePrimaryCtxRetain", 7000, false, SIM_FN(cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease", 7000, false, SIM_FN(cuDevicePrimaryCtxRelease)},
    {"cuDevicePrimaryCtxRelease", 11000, false, SIM_FN(cuDevicePrimaryCtxRelease_v2)},
    {"cuDevicePrimaryCtxGetState", 7000, false, SIM_FN(cuDevicePrimaryCtxGetState)},
    {"cuDevicePrimaryCtxReset", 7000, false, SIM_FN(cuDevicePrimaryCtxReset)},
    {"cuDevicePrimaryCtxReset", 11000, false, SIM_FN(cuDevicePrimaryCtxReset_v2)},
    {"cuMemAlloc", 2000, false, SIM_FN(cuMemAlloc)},
    {"cuMemAlloc", 3020, false, SIM_FN(cuMemAlloc_v2)},
    {"cuMemFree", 2000, false, SIM_FN(cuMemFree)},
    {"cuMemFree", 3020, false, SIM_FN(cuMemFree_v2)},
    {"cuMemGetInfo", 2000, false, SIM_FN(cuMemGetInfo)},
    {"cuMemGetInfo", 3020, false, SIM_FN(cuMemGetInfo_v2)},
    {"cuIpcGetMemHandle", 4010, false, SIM_FN(cuIpcGetMemHandle)},
    {"cuMemGetAddressRange", 3020, false, SIM_FN(cuMemGetAddressRange_v2)},
    {"cuMemAllocPitch", 2000, false, SIM_FN(cuMemAllocPitch)},
    {"cuMemAllocPitch", 3020, false, SIM_FN(cuMemAllocPitch_v2)},
    {"cuMemAllocManaged", 6000, false, SIM_FN(cuMemAllocManaged)},
    {"cuMemAllocAsync", 11020, false, SIM_FN(cuMemAllocAsync)},
    {"cuMemAllocAsync", 11020, true, SIM_FN(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, false, SIM_FN(cuMemFreeAsync)},
    {"cuMemFreeAsync", 11020, true, SIM_FN(cuMemFreeAsync_ptsz)},
    {"cuMemGetAllocationGranularity", 10020, false, SIM_FN(cuMemGetAllocationGranularity)},
    {"cuMemCreate", 10020, false, SIM_FN(cuMemCreate)},
    {"cuMemRelease", 10020, false, SIM_FN(cuMemRelease)},
    {"cuArrayCreate", 2000, false, SIM_FN(cuArrayCreate)},
    {"cuArrayCreate", 3020, false, SIM_FN(cuArrayCreate_v2)},
    {"cuArray3DCreate", 2000, false, SIM_FN(cuArray3DCreate)},
    {"cuArray3DCreate", 3020, false, SIM_FN(cuArray3DCreate_v2)},
    {"cuArrayDestroy", 2000, false, SIM_FN(cuArrayDestroy)},
    {"cuMipmappedArrayCreate", 5000, false, SIM_FN(cuMipmappedArrayCreate)},
    {"cuMipmappedArrayGetLevel", 5000, false, SIM_FN(cuMipmappedArrayGetLevel)},
    {"cuMipmappedArrayDestroy", 5000, false, SIM_FN(cuMipmappedArrayDestroy)},
    {"cuMemPoolCreate", 11020, false, SIM_FN(cuMemPoolCreate)},
    {"cuMemPoolDestroy", 11020, false, SIM_FN(cuMemPoolDestroy)},
    {"cuMemAllocFromPoolAsync", 11020, false, SIM_FN(cuMemAllocFromPoolAsync)},
    {"cuMemAllocFromPoolAsync", 11020, true, SIM_FN(cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemsetD8", 3020, false, SIM_FN(cuMemsetD8_v2)},
    {"cuMemcpyHtoD", 3020, false, SIM_FN(cuMemcpyHtoD_v2)},
    {"cuMemcpyDtoH", 3020, false, SIM_FN(cuMemcpyDtoH_v2)},
    {"cuMemsetD8Async", 3020, false, SIM_FN(cuMemsetD8Async)},
    {"cuMemsetD8Async", 7000, true, SIM_FN(cuMemsetD8Async_ptsz)},
    {"cuMemcpyHtoDAsync", 3020, false, SIM_FN(cuMemcpyHtoDAsync_v2)},
    {"cuMemcpyHtoDAsync", 7000, true, SIM_FN(cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync", 3020, false, SIM_FN(cuMemcpyDtoHAsync_v2)},
    {"cuMemcpyDtoHAsync", 7000, true, SIM_FN(cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync", 3020, false, SIM_FN(cuMemcpyDtoDAsync_v2)},
    {"cuMemcpyDtoDAsync", 7000, true, SIM_FN(cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuStreamCreate", 2000, false, SIM_FN(cuStreamCreate)},
    {"cuStreamCreateWithPriority", 5050, false, SIM_FN(cuStreamCreateWithPriority)},
    {"cuStreamDestroy", 2000, false, SIM_FN(cuStreamDestroy)},
    {"cuStreamDestroy", 4000, false, SIM_FN(cuStreamDestroy_v2)},
    {"cuStreamSynchronize", 2000, false, SIM_FN(cuStreamSynchronize)},
    {"cuStreamSynchronize", 7000, true, SIM_FN(cuStreamSynchronize_ptsz)},
    {"cuStreamQuery", 2000, false, SIM_FN(cuStreamQuery)},
    {"cuStreamQuery", 7000, true, SIM_FN(cuStreamQuery_ptsz)},
    {"cuStreamWaitEvent", 3020, false, SIM_FN(cuStreamWaitEvent)},
    {"cuStreamWaitEvent", 7000, true, SIM_FN(cuStreamWaitEvent_ptsz)},
    {"cuLaunchHostFunc", 10000, false, SIM_FN(cuLaunchHostFunc)},
    {"cuLaunchHostFunc", 10000, true, SIM_FN(cuLaunchHostFunc_ptsz)},
    {"cuStreamAddCallback", 5000, false, SIM_FN(cuStreamAddCallback)},
    {"cuStreamAddCallback", 7000, true, SIM_FN(cuStreamAddCallback_ptsz)},
    {"cuStreamGetCtx", 9020, false, SIM_FN(cuStreamGetCtx)},
    {"cuStreamGetCtx", 9020, true, SIM_FN(cuStreamGetCtx_ptsz)},
    {"cuStreamGetDevice", 12080, false, SIM_FN(cuStreamGetDevice)},
    {"cuStreamGetDevice", 12080, true, SIM_FN(cuStreamGetDevice_ptsz)},
    {"cuStreamBeginCapture", 10000, false, SIM_FN(cuStreamBeginCapture)},
    {"cuStreamBeginCapture", 10000, true, SIM_FN(cuStreamBeginCapture_ptsz)},
    {"cuStreamBeginCapture", 10010, false, SIM_FN(cuStreamBeginCapture_v2)},
    {"cuStreamBeginCapture", 10010, true, SIM_FN(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", 12030, false, SIM_FN(cuStreamBeginCaptureToGraph)},
    {"cuStreamBeginCaptureToGraph", 12030, true, SIM_FN(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", 10000, false, SIM_FN(cuStreamEndCapture)},
    {"cuStreamEndCapture", 10000, true, SIM_FN(cuStreamEndCapture_ptsz)},
    {"cuStreamIsCapturing", 10000, false, SIM_FN(cuStreamIsCapturing)},
    {"cuStreamIsCapturing", 10000, true, SIM_FN(cuStreamIsCapturing_ptsz)},
    {"cuStreamGetCaptureInfo", 10010, false, SIM_FN(cuStreamGetCaptureInfo)},
    {"cuStreamGetCaptureInfo", 10010, true, SIM_FN(cuStreamGetCaptureInfo_ptsz)},
    {"cuStreamGetCaptureInfo", 11030, false, SIM_FN(cuStreamGetCaptureInfo_v2)},
    {"cuStreamGetCaptureInfo", 11030, true, SIM_FN(cuStreamGetCaptureInfo_v2_ptsz)},
    {"cuStreamGetCaptureInfo", 12030, false, SIM_FN(cuStreamGetCaptureInfo_v3)},
    {"cuStreamGetCaptureInfo", 12030, true, SIM_FN(cuStreamGetCaptureInfo_v3_ptsz)},
    {"cuThreadExchangeStreamCaptureMode", 10010, false, SIM_FN(cuThreadExchangeStreamCaptureMode)},
    {"cuEventCreate", 2000, false, SIM_FN(cuEventCreate)},
    {"cuEventRecord", 2000, false, SIM_FN(cuEventRecord)},
    {"cuEventRecord", 7000, true, SIM_FN(cuEventRecord_ptsz)},
    {"cuEventQuery", 2000, false, SIM_FN(cuEventQuery)},
    {"cuEventSynchronize", 2000, false, SIM_FN(cuEventSynchronize)},
    {"cuEventDestroy", 2000, false, SIM_FN(cuEventDestroy)},
    {"cuEventDestroy", 4000, false, SIM_FN(cuEventDestroy_v2)},
    {"cuGraphCreate", 10000, false, SIM_FN(cuGraphCreate)},
    {"cuGraphClone", 10000, false, SIM_FN(cuGraphClone)},
    {"cuGraphInstantiateWithFlags", 11040, false, SIM_FN(cuGraphInstantiateWithFlags)},
    {"cuGraphLaunch", 10000, false, SIM_FN(cuGraphLaunch)},
    {"cuGraphLaunch", 10000, true, SIM_FN(cuGraphLaunch_ptsz)},
    {"cuGraphDestroy", 10000, false, SIM_FN(cuGraphDestroy)},
    {"cuGraphExecDestroy", 10000, false, SIM_FN(cuGraphExecDestroy)},
    {"cuUserObjectCreate", 11030, false, SIM_FN(cuUserObjectCreate)},
    {"cuUserObjectRetain", 11030, false, SIM_FN(cuUserObjectRetain)},
    {"cuUserObjectRelease", 11030, false, SIM_FN(cuUserObjectRelease)},
    {"cuGraphRetainUserObject", 11030, false, SIM_FN(cuGraphRetainUserObject)},
    {"cuGraphReleaseUserObject", 11030, false, SIM_FN(cuGraphReleaseUserObject)},
    {"cuLaunchKernel", 4000, false, SIM_FN(cuLaunchKernel)},
    {"cuLaunchKernel", 7000, true, SIM_FN(cuLaunchKernel_ptsz)},
    {"cuLaunchKernelEx", 11060, false, SIM_FN(cuLaunchKernelEx)},
    {"cuLaunchKernelEx", 11060, true, SIM_FN(cuLaunchKernelEx_ptsz)},
    {"cuLaunchCooperativeKernel", 9000, false, SIM_FN(cuLaunchCooperativeKernel)},
    {"cuLaunchCooperativeKernel", 9000, true, SIM_FN(cuLaunchCooperativeKernel_ptsz)},
    {"cuModuleLoad", 2000, false, SIM_FN(cuModuleLoad)},
    {"cuModuleLoadData", 2000, false, SIM_FN(cuModuleLoadData)},
    {"cuModuleLoadDataEx", 2010, false, SIM_FN(cuModuleLoadDataEx)},
    {"cuModuleLoadFatBinary", 2000, false, SIM_FN(cuModuleLoadFatBinary)},
    {"cuModuleUnload", 2000, false, SIM_FN(cuModuleUnload)},
    {"cuLibraryLoadData", 12000, false, SIM_FN(cuLibraryLoadData)},
    {"cuLibraryLoadFromFile", 12000, false, SIM_FN(cuLibraryLoadFromFile)},
    {"cuLibraryUnload", 12000, false, SIM_FN(cuLibraryUnload)},
    {"cuModuleGetFunction", 2000, false, SIM_FN(cuModuleGetFunction)},
    {"cuModuleGetLoadingMode", 11070, false, SIM_FN(cuModuleGetLoadingMode)},
    {"cuLibraryGetKernel", 12000, false, SIM_FN(cuLibraryGetKernel)},
    {"cuKernelGetFunction", 12000, false, SIM_FN(cuKernelGetFunction)},
    {"cuFuncLoad", 12040, false, SIM_FN(cuFuncLoad)},
    {"cuFuncGetAttribute", 2020, false, SIM_FN(cuFuncGetAttribute)},
    {"cuFuncSetAttribute", 9000, false, SIM_FN(cuFuncSetAttribute)},
    {"cuFuncSetCacheConfig", 3000, false, SIM_FN(cuFuncSetCacheConfig)},
    {"cuKernelGetAttribute", 12000, false, SIM_FN(cuKernelGetAttribute)},
    {"cuKernelSetAttribute", 12000, false, SIM_FN(cuKernelSetAttribute)},
    {"cuKernelSetCacheConfig", 12000, false, SIM_FN(cuKernelSetCacheConfig)},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, false,
     SIM_FN(cuOccupancyMaxActiveBlocksPerMultiprocessor)},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, false,
     SIM_FN(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)},
    {"cuOccupancyMaxPotentialBlockSize", 6050, false, SIM_FN(cuOccupancyMaxPotentialBlockSize)},
    {"cuOccupancyMaxPotentialBlockSizeWithFlags", 7000, false,
     SIM_FN(cuOccupancyMaxPotentialBlockSizeWithFlags)},
    {"cuOccupancyAvailableDynamicSMemPerBlock", 10020, false,
     SIM_FN(cuOccupancyAvailableDynamicSMemPerBlock)},
    {"cuOccupancyMaxPotentialClusterSize", 11070, false,
     SIM_FN(cuOccupancyMaxPotentialClusterSize)},
    {"cuOccupancyMaxActiveClusters", 11070, false, SIM_FN(cuOccupancyMaxActiveClusters)},
    {"cuModuleGetGlobal", 2000, false, SIM_FN(cuModuleGetGlobal)},
    {"cuModuleGetGlobal", 3020, false, SIM_FN(cuModuleGetGlobal_v2)},
    {"cuLibraryGetGlobal", 12000, false, SIM_FN(cuLibraryGetGlobal)},
    {"cuGetProcAddress", 11030, false, SIM_FN(cuGetProcAddress)},
    {"cuGetProcAddress", 12000, false, SIM_FN(cuGetProcAddress_v2)},
};
#undef SIM_FN

// Note [Unknown names]
// cuGetProcAddress_v2 answers CUDA_SUCCESS with a NULL function for a name it does not know and
// for a version older than the name's first variant: only the status tells the two apart (as
// the driver documents since CUDA 12.0, and the H200 answered). The CUDA 11 entry point without
// a status, cuGetProcAddress, answers CUDA_ERROR_NOT_FOUND instead, as CUDA 11 documented.
CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status, CUresult not_found) {
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
  if (!known) return not_found;
  bool want_per_thread = per_thread && has_per_thread;
  const Entry* best = nullptr;
  for (const Entry& e : kEntries)
    if (std::strcmp(e.name, symbol) == 0 && e.per_thread == want_per_thread &&
        e.version <= version && (!best || e.version > best->version))
      best = &e;
  if (!best) {
    if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return not_found;
  }
  *pfn = best->fn;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  lookup_latency();
  return lookup(symbol, pfn, cudaVersion, flags, symbolStatus, CUDA_SUCCESS);
}

extern "C" CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags) {
  lookup_latency();
  return lookup(symbol, pfn, cudaVersion, flags, nullptr, CUDA_ERROR_NOT_FOUND);
}
