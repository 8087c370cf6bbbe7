/* The stand-in-only C API of the CUDA stand-in (libcudart.so.13 built under tests/simcuda).
 *
 * Programs that must also run against the real CUDA runtime never link these functions: they
 * look them up with dlsym(RTLD_DEFAULT, "simcuda_counter") and skip stand-in-only checks when
 * the symbol is absent (that is, on a real GPU). The SIMCUDA_LOOKUP macro does exactly that.
 * This header needs no CUDA header: streams and callbacks are passed as plain pointers. */
#ifndef POOLCUDA_SIMCUDA_H
#define POOLCUDA_SIMCUDA_H

#include <stddef.h>
#include <stdint.h>

/* The byte a discard (cudaMemDiscardBatchAsync, cudaMemDiscardAndPrefetchBatchAsync) writes
 * over every SIMCUDA_MANAGED_PAGE-byte page its ranges touch, when it runs on its stream: the
 * "indeterminate value" CUDA promises, made visible, page rounding included. */
#define SIMCUDA_DISCARD_POISON 0xDB
#define SIMCUDA_MANAGED_PAGE 4096

#ifdef __cplusplus
extern "C" {
#endif

/* Number of calls made to the stand-in (successful or not) for "cudaMalloc", "cudaFree",
 * "cudaMallocManaged", "cuMemAlloc", "cuMemFree", "cudaEventRecord", "cudaStreamSynchronize",
 * "cudaDeviceSynchronize", "cudaMemPrefetchBatchAsync", "cudaMemDiscardBatchAsync",
 * "cudaMemDiscardAndPrefetchBatchAsync" (the last three with their _ptsz forms), "cuMemCreate",
 * "cuMemRelease", "cuArrayCreate" (cuArrayCreate_v2 and cuArray3DCreate_v2), "cuArrayDestroy",
 * "cuMemAllocFromPoolAsync" (and _ptsz), "cuMipmappedArrayCreate", "cuMipmappedArrayDestroy",
 * "cuCtxSetLimit", "cuCtxGetLimit" (the runtime's array, mipmapped-array, pool and device-limit
 * calls reach these driver functions, so they count too), "cuLaunchKernel" (and _ptsz, which the
 * static runtime's launches reach), "cudaMemGetInfo" (the runtime's function only); races
 * detected so far for "races"; the current number and requested bytes of live device-memory
 * allocations (every kind, every device, a context's limit reservation and loaded code
 * included) for "live_allocations" and "live_bytes"; the most "live_bytes" reached since the
 * last reset for "live_bytes_peak". Unknown names give UINT64_MAX. */
uint64_t simcuda_counter(const char* name);

/* Sets every call counter and the race counter back to zero, and "live_bytes_peak" to the current
 * "live_bytes" (live_allocations and live_bytes are current values). */
void simcuda_reset_counters(void);

/* Enqueues on `stream` (a cudaStream_t; NULL is the legacy default stream) an operation that
 * declares it reads (is_write == 0) or writes [ptr, ptr + bytes) of device memory, like a kernel
 * would, and runs `fn(user_data)` on the stream when it executes (fn may be NULL). The range
 * takes part in race detection; inside a capture it becomes a host node with that range.
 * Returns a cudaError_t. */
int simcuda_launch_access(void* stream, const void* ptr, size_t bytes, int is_write,
                          void (*fn)(void*), void* user_data);

/* The same operation as a kernel launch: a launch through the shared runtime (cudaLaunchKernel
 * and its forms; the static runtime's go to the driver, which does not know it) of
 * simcuda_access_kernel whose one argument (args[0] points to it) is a struct simcuda_access
 * enqueues what simcuda_launch_access would, on the launch's stream. A library that interposes
 * the runtime's launches sees it as the kernel launch it stands for. */
struct simcuda_access {
  const void* ptr;
  size_t bytes;
  int is_write;
  void (*fn)(void*);
  void* user_data;
};
void simcuda_access_kernel(void);

/* Makes `error` (a cudaError_t, e.g. cudaErrorIllegalAddress) the process's sticky error, as a
 * faulting kernel would: every later runtime call returns it and cudaGetLastError cannot clear
 * it. 0 clears it (the real runtime needs a new process for that). */
void simcuda_set_sticky_error(int error);

#ifdef __cplusplus
}
#endif

/* Resolves a stand-in function by name, or NULL on the real runtime. Needs <dlfcn.h>. */
#define SIMCUDA_LOOKUP(fn) ((__typeof__(&fn))dlsym(RTLD_DEFAULT, #fn))

#endif /* POOLCUDA_SIMCUDA_H */
