// Runtime stand-in entry points for memory: allocation (device, pitched, managed, pinned host,
// stream-ordered), free, cudaMemGetInfo, copies, memsets and pointer attributes. Copies and
// memsets are stream operations declaring the device ranges they read and write; the
// synchronous forms run on the legacy (or per-thread) default stream and wait for it.
#include <cstdio>
#include <cstring>

#include "rt_common.h"

using namespace poolcuda::sim;

namespace {

void add_range(std::vector<Range>& ranges, const void* p, size_t n, bool write) {
  if (n && mem_in_device_range(p)) {
    auto b = reinterpret_cast<uintptr_t>(p);
    ranges.push_back(Range{b, b + n, write});
  }
}

// Runs on the worker, under effects_mutex: the memory may have been freed since the operation
// was enqueued (a free on an unordered stream). On a GPU that is an illegal address, a sticky
// error; the stand-in reports it the same way instead of faulting.
bool still_valid(const void* p, size_t n) {
  if (mem_check(p, n) == cudaSuccess) return true;
  std::fprintf(stderr, "simcuda: stream operation touches freed device memory at %p\n", p);
  set_sticky_error(cudaErrorIllegalAddress);
  return false;
}

std::string describe(const char* what, const void* p, size_t n) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s(%p, %zu bytes)", what, p, n);
  return buf;
}

// A synchronous call on a capturing stream would wait for work that does not run until launch:
// refused, and the capture is invalidated.
cudaError_t refuse_sync_in_capture(const StreamRef& s) {
  std::lock_guard lock(state_mutex());
  if (!s->capture) return cudaSuccess;
  s->capture->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, const StreamRef& s,
                 bool wait, const char* what) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (!s) return cudaErrorInvalidResourceHandle;
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  if (mem_check(dst, n) != cudaSuccess || mem_check(src, n) != cudaSuccess)
    return cudaErrorInvalidValue;
  if (wait)
    if (cudaError_t err = refuse_sync_in_capture(s); err != cudaSuccess) return err;
  Work w;
  w.type = cudaGraphNodeTypeMemcpy;
  w.desc = describe(what, dst, n);
  add_range(w.ranges, src, n, false);
  add_range(w.ranges, dst, n, true);
  w.fn = [dst, src, n] {
    std::lock_guard lock(effects_mutex());
    if (!still_valid(dst, n) || !still_valid(src, n)) return;
    std::memmove(dst, src, n);
  };
  if (cudaError_t err = submit(s, std::move(w)); err != cudaSuccess) return err;
  if (wait) {
    drain(s);
    return sticky_error();
  }
  return cudaSuccess;
}

cudaError_t set(void* dst, int value, size_t n, const StreamRef& s, bool wait, const char* what) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (n == 0) return cudaSuccess;
  if (!mem_in_device_range(dst) || mem_check(dst, n) != cudaSuccess) return cudaErrorInvalidValue;
  if (wait)
    if (cudaError_t err = refuse_sync_in_capture(s); err != cudaSuccess) return err;
  Work w;
  w.type = cudaGraphNodeTypeMemset;
  w.desc = describe(what, dst, n);
  add_range(w.ranges, dst, n, true);
  w.fn = [dst, value, n] {
    std::lock_guard lock(effects_mutex());
    if (!still_valid(dst, n)) return;
    std::memset(dst, value, n);
  };
  if (cudaError_t err = submit(s, std::move(w)); err != cudaSuccess) return err;
  if (wait) {
    drain(s);
    return sticky_error();
  }
  return cudaSuccess;
}

cudaError_t alloc_checked(void** p, size_t size, AllocKind kind) {
  if (!p) return cudaErrorInvalidValue;
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return err;
  return mem_alloc(current_device(), size, kind, p);
}

}  // namespace

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  bump(Counter::cudaMalloc);
  SIM_ENTER();
  SIM_RETURN(alloc_checked(devPtr, size, AllocKind::device));
}

cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  SIM_ENTER();
  if (!pitch) SIM_RETURN(cudaErrorInvalidValue);
  size_t p = (width + 511) / 512 * 512;
  if (height && p > SIZE_MAX / height) SIM_RETURN(cudaErrorMemoryAllocation);
  cudaError_t err = alloc_checked(devPtr, p * height, AllocKind::device);
  if (err == cudaSuccess) *pitch = p;
  SIM_RETURN(err);
}

cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  bump(Counter::cudaMallocManaged);
  SIM_ENTER();
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) SIM_RETURN(cudaErrorInvalidValue);
  if (size == 0) SIM_RETURN(cudaErrorInvalidValue);
  SIM_RETURN(alloc_checked(devPtr, size, AllocKind::managed));
}

cudaError_t cudaFree(void* devPtr) {
  bump(Counter::cudaFree);
  SIM_ENTER();
  if (!devPtr) return cudaSuccess;
  AllocInfo info;
  if (!mem_find(devPtr, &info) || info.base != reinterpret_cast<uintptr_t>(devPtr))
    SIM_RETURN(cudaErrorInvalidValue);
  {
    // cudaFree synchronizes the device: illegal while any capture is open on it.
    std::lock_guard lock(state_mutex());
    if (invalidate_device_captures_locked(info.device))
      SIM_RETURN(cudaErrorStreamCaptureUnsupported);
  }
  device_drain(info.device);
  std::lock_guard lock(effects_mutex());
  SIM_RETURN(mem_free(devPtr, info.id));
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  SIM_ENTER();
  if (!ptr) SIM_RETURN(cudaErrorInvalidValue);
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) SIM_RETURN(err);
  SIM_RETURN(host_alloc(size, cudaHostAllocDefault, ptr));
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  SIM_ENTER();
  if (!ptr || (flags & ~0xfu)) SIM_RETURN(cudaErrorInvalidValue);
  if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) SIM_RETURN(err);
  SIM_RETURN(host_alloc(size, flags, ptr));
}

cudaError_t cudaFreeHost(void* ptr) {
  SIM_ENTER();
  SIM_RETURN(host_free(ptr));
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(malloc_async(resolve_stream(stream, false), size, devPtr));
}

cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(malloc_async(resolve_stream(stream, true), size, devPtr));
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(free_async(resolve_stream(stream, false), devPtr));
}

cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(free_async(resolve_stream(stream, true), devPtr));
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  SIM_ENTER();
  if (!free || !total) SIM_RETURN(cudaErrorInvalidValue);
  mem_info(current_device(), free, total);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  SIM_ENTER();
  SIM_RETURN(copy(dst, src, count, kind, resolve_stream(nullptr, false), true, "cudaMemcpy"));
}

cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  SIM_ENTER();
  SIM_RETURN(copy(dst, src, count, kind, resolve_stream(nullptr, true), true, "cudaMemcpy"));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(copy(dst, src, count, kind, resolve_stream(stream, false), false, "cudaMemcpyAsync"));
}

cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                 cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(copy(dst, src, count, kind, resolve_stream(stream, true), false, "cudaMemcpyAsync"));
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  SIM_ENTER();
  SIM_RETURN(set(devPtr, value, count, resolve_stream(nullptr, false), true, "cudaMemset"));
}

cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count) {
  SIM_ENTER();
  SIM_RETURN(set(devPtr, value, count, resolve_stream(nullptr, true), true, "cudaMemset"));
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(set(devPtr, value, count, resolve_stream(stream, false), false, "cudaMemsetAsync"));
}

cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(set(devPtr, value, count, resolve_stream(stream, true), false, "cudaMemsetAsync"));
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  SIM_ENTER();
  if (!attributes) SIM_RETURN(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof *attributes);
  AllocInfo info;
  unsigned flags = 0;
  if (ptr && mem_find(ptr, &info)) {
    attributes->device = info.device;
    attributes->devicePointer = const_cast<void*>(ptr);
    if (info.kind == AllocKind::managed) {
      attributes->type = cudaMemoryTypeManaged;
      attributes->hostPointer = const_cast<void*>(ptr);
    } else {
      attributes->type = cudaMemoryTypeDevice;
    }
  } else if (ptr && host_find(ptr, &flags)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = current_device();
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}
