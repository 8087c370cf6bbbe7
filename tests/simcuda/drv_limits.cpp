// The driver stand-in's context limits: cuCtxSetLimit and cuCtxGetLimit on the current context,
// which the runtime's cudaDeviceSetLimit and cudaDeviceGetLimit call through the resolver. The
// values, and the device memory that the heap, printf FIFO and stack sizes reserve, are the
// core's (Note [Limit reservations] in limits.cpp).
#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

// The real driver may wait for the device before it changes the stack size; nothing the
// stand-in runs uses a stack, so it never has to.
CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  bump(Counter::cuCtxSetLimit);
  if (CUresult r = guard(true)) return r;
  // A reservation is device memory taken as cuMemAlloc takes it: potentially unsafe during a
  // capture.
  if (limit_reserves_memory(limit)) {
    if (cudaError_t err = check_unsafe_call(); err != cudaSuccess) return as_cu(err);
  }
  return alloc_result(set_limit(thread_context(), limit, value));
}

CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  bump(Counter::cuCtxGetLimit);
  if (CUresult r = guard(true)) return r;
  return as_cu(get_limit(thread_context(), limit, pvalue));
}
