// Runtime stand-in entry points for device code, which the stand-in cannot run. Registration of
// a module (__cudaRegisterFatBinary, then its kernels and variables) is accepted with one line on
// stderr per module: those calls have no error channel, and a program that never launches its
// kernels must still run. A launch (the <<<...>>> syntax: __cudaPushCallConfiguration,
// __cudaPopCallConfiguration, __cudaLaunchKernel; cudaLaunchKernel, cudaLaunchKernelExC,
// cudaLaunchCooperativeKernel and their _ptsz variants) first loads the kernel's module, which
// takes device memory at the kernel's first launch on a device (Note [Code memory] in code.cpp;
// cudaErrorMemoryAllocation when the device cannot hold it), then fails with
// cudaErrorNotSupported and one line on stderr; either error is left as the thread's last error.
// The static runtime launches through the driver's cuLaunchKernel (Note [Static runtime]).
// simcuda_access_kernel (simcuda.h) is the one kernel it runs: a declared access of memory.
#include <cstdio>

#include "rt_driver.h"
#include "simcuda.h"

using namespace poolcuda::sim;

extern "C" {
void** __cudaRegisterFatBinary(void* fatCubin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaUnregisterFatBinary(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function,
                            const char* name, int thread_limit, uint3* tid, uint3* bid,
                            dim3* block, dim3* grid, int* warp_size);
void __cudaRegisterVar(void** handle, char* host_var, char* device_address, const char* name,
                       int ext, size_t size, int constant, int global);
void __cudaRegisterManagedVar(void** handle, void** host_var_address, char* device_address,
                              const char* name, int ext, size_t size, int constant, int global);
char __cudaInitModule(void** handle);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_bytes,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_bytes,
                                       void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_bytes, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared_bytes, cudaStream_t stream);
cudaError_t cudaLaunchKernel_ptsz(const void* function, dim3 grid, dim3 block, void** args,
                                  size_t shared_bytes, cudaStream_t stream);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* function,
                                     void** args);
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* function, dim3 grid, dim3 block,
                                             void** args, size_t shared_bytes,
                                             cudaStream_t stream);
}

namespace {

// The handle __cudaRegisterFatBinary returns; the other registration calls get it back.
void* g_module_handle = nullptr;

struct LaunchConfiguration {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};

LaunchConfiguration& pushed() {
  thread_local LaunchConfiguration configuration;
  return configuration;
}

// Every launch of `func` (a kernel's host stub, or its cudaKernel_t: the same pointer) with
// this configuration.
cudaError_t launch(const char* name, const void* func, dim3 grid, dim3 block, void** args,
                   size_t shared_bytes, cudaStream_t stream, bool per_thread) {
  SIM_ENTER();
  if (rt::kStaticRuntime) {
    SIM_RETURN(
        via_driver::launch_kernel(func, grid, block, args, shared_bytes, stream, per_thread));
  }
  if (!func) SIM_RETURN(cudaErrorInvalidDeviceFunction);
  if (func == reinterpret_cast<const void*>(&simcuda_access_kernel)) {
    const auto* access =
        static_cast<const simcuda_access*>(args != nullptr ? args[0] : nullptr);
    if (!access) SIM_RETURN(cudaErrorInvalidValue);
    SIM_RETURN(launch_access(resolve_stream(stream, per_thread), access->ptr, access->bytes,
                             access->is_write, access->fn, access->user_data));
  }
  if (cudaError_t err = load_function(current_device(), func); err != cudaSuccess)
    SIM_RETURN(err);
  std::fprintf(stderr, "simcuda: %s: the CUDA stand-in cannot run device code\n", name);
  SIM_RETURN(cudaErrorNotSupported);
}

cudaError_t launch_ex(const char* name, const cudaLaunchConfig_t* config, const void* func,
                      void** args, bool per_thread) {
  if (!config) {
    SIM_ENTER();
    SIM_RETURN(cudaErrorInvalidValue);
  }
  return launch(name, func, config->gridDim, config->blockDim, args, config->dynamicSmemBytes,
                config->stream, per_thread);
}

}  // namespace

void** __cudaRegisterFatBinary(void*) {
  std::fprintf(stderr,
               "simcuda: __cudaRegisterFatBinary: the CUDA stand-in cannot load device code; "
               "launches of this module's kernels fail with cudaErrorNotSupported\n");
  return &g_module_handle;
}

void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
void __cudaRegisterManagedVar(void**, void**, char*, const char*, int, size_t, int, int) {}

// Managed variables of the module cannot be initialized: 0 says so.
char __cudaInitModule(void**) { return 0; }

// <<<grid, block, shared, stream>>> pushes the configuration, the kernel's host stub pops it and
// launches: the push and pop succeed so that the launch itself reports the refusal.
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_bytes,
                                     struct CUstream_st* stream) {
  pushed() = {grid, block, shared_bytes, reinterpret_cast<cudaStream_t>(stream)};
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_bytes,
                                       void* stream) {
  const LaunchConfiguration& c = pushed();
  if (grid) *grid = c.grid;
  if (block) *block = c.block;
  if (shared_bytes) *shared_bytes = c.shared_bytes;
  if (stream) *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function) {
  if (!kernel) return cudaErrorInvalidValue;
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(function));
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_bytes, cudaStream_t stream) {
  return launch("__cudaLaunchKernel", kernel, grid, block, args, shared_bytes, stream, false);
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared_bytes, cudaStream_t stream) {
  return launch("__cudaLaunchKernel_ptsz", kernel, grid, block, args, shared_bytes, stream, true);
}
cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                             size_t shared_bytes, cudaStream_t stream) {
  return launch("cudaLaunchKernel", func, grid, block, args, shared_bytes, stream, false);
}
cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args,
                                  size_t shared_bytes, cudaStream_t stream) {
  return launch("cudaLaunchKernel_ptsz", func, grid, block, args, shared_bytes, stream, true);
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  return launch_ex("cudaLaunchKernelExC", config, func, args, false);
}
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func,
                                     void** args) {
  return launch_ex("cudaLaunchKernelExC_ptsz", config, func, args, true);
}
cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block, void** args,
                                        size_t shared_bytes, cudaStream_t stream) {
  return launch("cudaLaunchCooperativeKernel", func, grid, block, args, shared_bytes, stream,
                false);
}
cudaError_t cudaLaunchCooperativeKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args,
                                             size_t shared_bytes, cudaStream_t stream) {
  return launch("cudaLaunchCooperativeKernel_ptsz", func, grid, block, args, shared_bytes, stream,
                true);
}
