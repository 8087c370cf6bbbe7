// A second interposer, preloaded after libpoolcuda.so by test_late_runtime's "shim" case: it
// wraps cudaFree only, as a profiler that counts frees might, and passes each call on to the
// next definition. Not linked with the runtime.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) cudaError_t cudaFree(void* ptr) {
  using FreeFn = cudaError_t (*)(void*);
  static const auto next = reinterpret_cast<FreeFn>(::dlsym(RTLD_NEXT, "cudaFree"));
  return next != nullptr ? next(ptr) : cudaErrorSharedObjectSymbolNotFound;
}
