// The driver stand-in's entry points for work on a context: memory (allocation, free, memory
// info, pitched, managed and stream-ordered allocation, copies and memsets, synchronous and on a
// stream), streams (create, destroy, synchronize, query, wait for an event, host functions and
// callbacks, their device) and events, each with its per-thread-default-stream (_ptsz) flavour
// where the real driver has one.
// Thin calls into the core, as the runtime's are. Capture and graphs are in drv_capture.cpp.
#include <algorithm>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

CUresult cuMemAlloc(unsigned int*, unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemFree(unsigned int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemGetInfo(unsigned int*, unsigned int*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemAllocPitch(unsigned int*, unsigned int*, unsigned int, unsigned int, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

namespace {

CUresult allocate(CUdeviceptr* out, size_t bytesize, AllocKind kind) {
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  void* p = nullptr;
  cudaError_t err = after_refusal(mem_alloc(context_device(), bytesize, kind, &p));
  if (err == cudaSuccess) *out = dptr(p);
  return alloc_result(err);
}

CUresult alloc_async(CUdeviceptr* out, size_t size, CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  void* p = nullptr;
  cudaError_t err = after_refusal(malloc_async(resolve_stream(rt(stream), per_thread), size, &p));
  if (err == cudaSuccess) *out = dptr(p);
  return as_cu(err);
}

CUresult free_async_impl(CUdeviceptr d, CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(free_async(resolve_stream(rt(stream), per_thread), ptr(d)));
}

}  // namespace

CUresult cuMemAlloc_v2(CUdeviceptr* out, size_t bytesize) {
  bump(Counter::cuMemAlloc);
  if (CUresult r = guard(true)) return r;
  if (!out || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return allocate(out, bytesize, AllocKind::device);
}

// Rows are padded to a multiple of 512 bytes, like the runtime stand-in's cudaMallocPitch.
CUresult cuMemAllocPitch_v2(CUdeviceptr* out, size_t* pitch, size_t width, size_t height,
                            unsigned int element_size) {
  if (CUresult r = guard(true)) return r;
  if (!out || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_size != 4 && element_size != 8 && element_size != 16)
    return CUDA_ERROR_INVALID_VALUE;
  if (width > SIZE_MAX - 511) return CUDA_ERROR_OUT_OF_MEMORY;  // no row that wide fits
  size_t row = (width + 511) / 512 * 512;
  if (row > SIZE_MAX / height) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = allocate(out, row * height, AllocKind::device);
  if (r == CUDA_SUCCESS) *pitch = row;
  return r;
}

CUresult cuMemAllocManaged(CUdeviceptr* out, size_t bytesize, unsigned int flags) {
  if (CUresult r = guard(true)) return r;
  if (!out || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  return allocate(out, bytesize, AllocKind::managed);
}

CUresult cuMemFree_v2(CUdeviceptr d) {
  bump(Counter::cuMemFree);
  if (CUresult r = guard(true)) return r;
  if (d == 0) return CUDA_SUCCESS;
  free_latency();
  AllocInfo info;
  if (!mem_find(ptr(d), &info) || info.base != static_cast<uintptr_t>(d))
    return CUDA_ERROR_INVALID_VALUE;
  // Potentially unsafe, like cudaFree (Note [Capture legality] in capture.cpp).
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  // CUDA takes every access to stream-ordered memory as complete at this free, and waits for
  // nothing; work still queued on it then touches freed memory (an illegal address).
  if (info.kind != AllocKind::async) device_drain(info.device);
  cudaError_t err;
  {
    std::lock_guard lock(effects_mutex());
    err = mem_free(ptr(d), info.id);
  }
  return as_cu(after_free(err));
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (CUresult r = guard(true)) return r;
  if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
  mem_info(context_device(), free, total);
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr d) {
  if (CUresult r = guard(true)) return r;
  AllocInfo info;
  if (!mem_find(ptr(d), &info)) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = static_cast<CUdeviceptr>(info.base);
  if (size) *size = info.size;
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr d) {
  if (CUresult r = guard(true)) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  return mem_ipc_handle(ptr(d), reinterpret_cast<unsigned char*>(handle->reserved))
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
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

// The synchronous copies and memsets run on the legacy default stream and wait for it.
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_set(ptr(dst), value, count, resolve_stream(nullptr, false), true, "cuMemsetD8"));
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_copy(ptr(dst), src, count, cudaMemcpyHostToDevice,
                        resolve_stream(nullptr, false), true, "cuMemcpyHtoD"));
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t count) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_copy(dst, ptr(src), count, cudaMemcpyDeviceToHost,
                        resolve_stream(nullptr, false), true, "cuMemcpyDtoH"));
}

namespace {

CUresult set_async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream,
                   bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_set(ptr(dst), value, count, resolve_stream(rt(stream), per_thread), false,
                       "cuMemsetD8Async"));
}

CUresult copy_async(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                    CUstream stream, bool per_thread, const char* what) {
  if (CUresult r = guard(true)) return r;
  return as_cu(mem_copy(dst, src, count, kind, resolve_stream(rt(stream), per_thread), false, what));
}

}  // namespace

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  return set_async(dst, value, count, stream, false);
}
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t count,
                              CUstream stream) {
  return set_async(dst, value, count, stream, true);
}

#define SIM_COPY_ASYNC(name, dst_type, src_type, kind, dst_arg, src_arg)                   \
  CUresult name(dst_type dst, src_type src, size_t count, CUstream stream) {               \
    return copy_async(dst_arg, src_arg, count, kind, stream, false, #name);                \
  }                                                                                        \
  CUresult name##_ptsz(dst_type dst, src_type src, size_t count, CUstream stream) {        \
    return copy_async(dst_arg, src_arg, count, kind, stream, true, #name);                 \
  }
SIM_COPY_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void*, cudaMemcpyHostToDevice, ptr(dst),
               src)
SIM_COPY_ASYNC(cuMemcpyDtoHAsync_v2, void*, CUdeviceptr, cudaMemcpyDeviceToHost, dst, ptr(src))
SIM_COPY_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, cudaMemcpyDeviceToDevice, ptr(dst),
               ptr(src))
#undef SIM_COPY_ASYNC

// ---- Streams --------------------------------------------------------------------------------

namespace {

CUresult create(CUstream* out, unsigned int flags, int priority) {
  if (CUresult r = guard(true)) return r;
  if (!out || (flags & ~unsigned{CU_STREAM_NON_BLOCKING})) return CUDA_ERROR_INVALID_VALUE;
  StreamRef s = create_stream(context_device(), flags, std::clamp(priority, -5, 0));
  s->context = thread_context();  // before the handle is out: nobody else reads it yet
  *out = static_cast<CUstream>(s->handle);
  return CUDA_SUCCESS;
}

CUresult destroy(CUstream stream) {
  if (CUresult r = guard(true)) return r;
  return as_cu(destroy_stream(rt(stream)));
}

CUresult synchronize(CUstream stream, bool per_thread) {
  bump(Counter::cudaStreamSynchronize);
  if (CUresult r = guard(true)) return r;
  StreamRef s = resolve_stream(rt(stream), per_thread);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (cudaError_t err = wait_capture_guard(s); err != cudaSuccess) return as_cu(err);
  drain(s);
  return as_cu(sticky_error());
}

CUresult query(CUstream stream, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(stream_query(resolve_stream(rt(stream), per_thread)));
}

CUresult wait_event(CUstream stream, CUevent event, unsigned flags, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  return as_cu(stream_wait_event(resolve_stream(rt(stream), per_thread),
                                 reinterpret_cast<cudaEvent_t>(event), flags));
}

CUresult host_func(CUstream stream, CUhostFn fn, void* data, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  Work w;
  w.type = cudaGraphNodeTypeHost;
  w.desc = "host function";
  w.fn = [fn, data] { fn(data); };
  return as_cu(submit(resolve_stream(rt(stream), per_thread), std::move(w)));
}

CUresult add_callback(CUstream stream, CUstreamCallback fn, void* data, unsigned flags,
                      bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!fn || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Work w;
  w.type = cudaGraphNodeTypeHost;
  w.desc = "stream callback";
  w.fn = [stream, fn, data] { fn(stream, as_cu(sticky_error()), data); };
  return as_cu(submit(resolve_stream(rt(stream), per_thread), std::move(w)));
}

CUresult get_device(CUstream stream, CUdevice* device, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  StreamRef s = resolve_stream(rt(stream), per_thread);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (device_query_capture_guard(s) != cudaSuccess) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  *device = s->device;
  return CUDA_SUCCESS;
}

// A user stream's own context; a fixed handle names the calling thread's current context's
// default stream, so it answers that context.
CUresult get_context(CUstream stream, CUcontext* pctx, bool per_thread) {
  if (CUresult r = guard(true)) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  StreamRef s = resolve_stream(rt(stream), per_thread);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  Context* ctx = s->kind == StreamKind::user ? s->context : thread_context();
  if (ctx == nullptr) ctx = primary_context(s->device);
  *pctx = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return create(phStream, Flags, 0);
}

CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return create(phStream, flags, priority);
}

CUresult cuStreamDestroy_v2(CUstream hStream) { return destroy(hStream); }
CUresult cuStreamDestroy(CUstream hStream) { return destroy(hStream); }

CUresult cuStreamSynchronize(CUstream hStream) { return synchronize(hStream, false); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return synchronize(hStream, true); }

CUresult cuStreamQuery(CUstream hStream) { return query(hStream, false); }
CUresult cuStreamQuery_ptsz(CUstream hStream) { return query(hStream, true); }

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return wait_event(hStream, hEvent, Flags, false);
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return wait_event(hStream, hEvent, Flags, true);
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  return host_func(hStream, fn, userData, false);
}
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  return host_func(hStream, fn, userData, true);
}

CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData,
                             unsigned int flags) {
  return add_callback(hStream, callback, userData, flags, false);
}
CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                  unsigned int flags) {
  return add_callback(hStream, callback, userData, flags, true);
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return get_context(hStream, pctx, false);
}
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  return get_context(hStream, pctx, true);
}

CUresult cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  return get_device(hStream, device, false);
}
CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device) {
  return get_device(hStream, device, true);
}

// ---- Events ---------------------------------------------------------------------------------

namespace {

CUresult record(CUevent event, CUstream stream, bool per_thread) {
  bump(Counter::cudaEventRecord);
  if (CUresult r = guard(true)) return r;
  EventRef ev = find_event(reinterpret_cast<cudaEvent_t>(event));
  StreamRef s = resolve_stream(rt(stream), per_thread);
  if (!ev || !s) return CUDA_ERROR_INVALID_HANDLE;
  return as_cu(event_record(ev, s));
}

CUresult destroy_event_impl(CUevent event) {
  if (CUresult r = guard(true)) return r;
  return as_cu(destroy_event(reinterpret_cast<cudaEvent_t>(event)));
}

}  // namespace

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  if (CUresult r = guard(true)) return r;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!phEvent || (Flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  *phEvent = reinterpret_cast<CUevent>(create_event(Flags));
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { return record(hEvent, hStream, false); }
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return record(hEvent, hStream, true);
}

CUresult cuEventQuery(CUevent hEvent) {
  if (CUresult r = guard(true)) return r;
  return as_cu(event_query(find_event(reinterpret_cast<cudaEvent_t>(hEvent))));
}

CUresult cuEventSynchronize(CUevent hEvent) {
  if (CUresult r = guard(true)) return r;
  cudaError_t err = event_sync(find_event(reinterpret_cast<cudaEvent_t>(hEvent)));
  return as_cu(err == cudaSuccess ? sticky_error() : err);
}

CUresult cuEventDestroy_v2(CUevent hEvent) { return destroy_event_impl(hEvent); }
CUresult cuEventDestroy(CUevent hEvent) { return destroy_event_impl(hEvent); }
