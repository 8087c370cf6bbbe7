// Copies and memsets of the stand-in, shared by the runtime's cudaMemcpy/cudaMemset family and
// the driver's cuMemcpy/cuMemset: stream operations that declare the device ranges they read and
// write (for the race detector) and check, when they run, that the memory is still allocated.
// Depends only on core.h.
#include "core.h"

#include <cstdio>
#include <cstring>

namespace poolcuda::sim {
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

}  // namespace

cudaError_t mem_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, const StreamRef& s,
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

cudaError_t mem_set(void* dst, int value, size_t n, const StreamRef& s, bool wait,
                    const char* what) {
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

}  // namespace poolcuda::sim
