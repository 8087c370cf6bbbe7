// The driver stand-in's entry points that use loaded code without launching it, and so load it
// the way a real driver with lazy loading does (Note [Code memory] in code.cpp): a function's
// attributes and cache preference (cuFuncGetAttribute, cuFuncSetAttribute, cuFuncSetCacheConfig)
// and the occupancy queries (cuOccupancy*) load the function on the current context's device; a
// kernel's (cuKernelGetAttribute, cuKernelSetAttribute, cuKernelSetCacheConfig) load it on the
// device named; a module's or library's variables (cuModuleGetGlobal_v2, cuLibraryGetGlobal) are
// device memory inside its code. With no code to inspect, the answers are those of a small
// kernel on the stand-in's device shape, and settings are accepted and forgotten. Any non-null
// CUfunction or CUkernel is a function, as for launches (drv_code.cpp).
#include <cstdio>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

namespace {

// What the stand-in answers for every function and device.
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kRegistersPerThread = 32;
constexpr size_t kSharedBytesPerBlock = 48 << 10;
constexpr int kPortableClusterSize = 8;

bool valid_attribute(CUfunction_attribute attrib) {
  return attrib >= 0 && attrib < CU_FUNC_ATTRIBUTE_MAX;
}

bool valid_cache_config(CUfunc_cache config) {
  return config >= CU_FUNC_CACHE_PREFER_NONE && config <= CU_FUNC_CACHE_PREFER_EQUAL;
}

int attribute_value(CUfunction_attribute attrib) {
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return kMaxThreadsPerBlock;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: return kRegistersPerThread;
    default: return 0;
  }
}

// A function's use on the current context's device: the arguments checked (the values, then
// the handle), then the function loaded there.
CUresult load_function_here(CUfunction f, bool valid_arguments) {
  if (CUresult r = guard(true)) return r;
  if (!valid_arguments) return CUDA_ERROR_INVALID_VALUE;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  return alloc_result(load_function(context_device(), f));
}

// A CUkernel's use on device `dev`, which needs no context: the arguments checked as above, then
// the device, then the kernel loaded there under its own value, the key cuKernelGetFunction uses.
CUresult load_kernel_on(CUkernel kernel, CUdevice dev, bool valid_arguments) {
  if (CUresult r = guard()) return r;
  if (!valid_arguments) return CUDA_ERROR_INVALID_VALUE;
  if (!kernel) return CUDA_ERROR_INVALID_HANDLE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  return alloc_result(load_function(dev, kernel));
}

// The blocks of `block_size` threads one multiprocessor holds.
int blocks_per_multiprocessor(int block_size) { return kThreadsPerMultiprocessor / block_size; }

// cuOccupancyMaxPotentialBlockSize's answer: the largest block allowed (a limit of 0 is none),
// and the grid that fills every multiprocessor with it.
CUresult potential_block_size(int* min_grid_size, int* block_size, CUfunction f, int limit,
                              bool valid_flags) {
  const bool valid = min_grid_size && block_size && limit >= 0 && valid_flags;
  if (CUresult r = load_function_here(f, valid)) return r;
  const int best = limit > 0 && limit < kMaxThreadsPerBlock ? limit : kMaxThreadsPerBlock;
  *block_size = best;
  *min_grid_size = kMultiprocessors * blocks_per_multiprocessor(best);
  return CUDA_SUCCESS;
}

CUresult active_blocks(int* num_blocks, CUfunction f, int block_size, bool valid_flags) {
  if (CUresult r = load_function_here(f, num_blocks && block_size > 0 && valid_flags)) return r;
  *num_blocks = blocks_per_multiprocessor(block_size);
  return CUDA_SUCCESS;
}

bool valid_occupancy_flags(unsigned int flags) {
  return (flags & ~unsigned{CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE}) == 0;
}

// A variable of a module or library: its address and size (either output may be null, not both).
CUresult get_variable(const char* entry, CUdeviceptr* dptr, size_t* bytes, const void* handle,
                      CodeKind kind, const char* name) {
  if (CUresult r = guard(true)) return r;
  if ((!dptr && !bytes) || !name) return CUDA_ERROR_INVALID_VALUE;
  if (!handle) return CUDA_ERROR_INVALID_HANDLE;
  void* address = nullptr;
  const cudaError_t err = code_variable(handle, kind, context_device(), name, &address);
  if (err == cudaErrorNotSupported) {
    std::fprintf(stderr,
                 "simcuda: %s(\"%s\"): no code memory holds the variable (SIMCUDA_CODE_BYTES=%zu; "
                 "Note [Code memory] in tests/simcuda/code.cpp)\n",
                 entry, name, config().code_bytes);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (err != cudaSuccess) return alloc_result(err);
  if (dptr) *dptr = drv::dptr(address);
  if (bytes) *bytes = kVariableBytes;
  return CUDA_SUCCESS;
}

}  // namespace

// ---- Functions -------------------------------------------------------------------------------

CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  if (CUresult r = load_function_here(hfunc, pi && valid_attribute(attrib))) return r;
  *pi = attribute_value(attrib);
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int) {
  return load_function_here(hfunc, valid_attribute(attrib));
}

CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  return load_function_here(hfunc, valid_cache_config(config));
}

// ---- Kernels, per device ---------------------------------------------------------------------

CUresult cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev) {
  if (CUresult r = load_kernel_on(kernel, dev, pi && valid_attribute(attrib))) return r;
  *pi = attribute_value(attrib);
  return CUDA_SUCCESS;
}

CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int, CUkernel kernel, CUdevice dev) {
  return load_kernel_on(kernel, dev, valid_attribute(attrib));
}

CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev) {
  return load_kernel_on(kernel, dev, valid_cache_config(config));
}

// ---- Occupancy -------------------------------------------------------------------------------
// Dynamic shared memory, the block-size-to-shared-memory callback and a launch configuration's
// dimensions change nothing: the stand-in's kernels use no shared memory and no registers that
// would limit them.

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction func, int blockSize,
                                                     size_t) {
  return active_blocks(numBlocks, func, blockSize, true);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, CUfunction func,
                                                              int blockSize, size_t,
                                                              unsigned int flags) {
  return active_blocks(numBlocks, func, blockSize, valid_occupancy_flags(flags));
}

CUresult cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize, CUfunction func,
                                          CUoccupancyB2DSize, size_t, int blockSizeLimit) {
  return potential_block_size(minGridSize, blockSize, func, blockSizeLimit, true);
}

CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int* minGridSize, int* blockSize,
                                                   CUfunction func, CUoccupancyB2DSize, size_t,
                                                   int blockSizeLimit, unsigned int flags) {
  return potential_block_size(minGridSize, blockSize, func, blockSizeLimit,
                              valid_occupancy_flags(flags));
}

CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* dynamicSmemSize, CUfunction func,
                                                 int numBlocks, int blockSize) {
  const bool valid = dynamicSmemSize && numBlocks > 0 && blockSize > 0;
  if (CUresult r = load_function_here(func, valid)) return r;
  *dynamicSmemSize = kSharedBytesPerBlock;
  return CUDA_SUCCESS;
}

// The cluster queries load on the current context's device, as the stand-in's launches do,
// whatever config->hStream is.
CUresult cuOccupancyMaxPotentialClusterSize(int* clusterSize, CUfunction func,
                                            const CUlaunchConfig* config) {
  if (CUresult r = load_function_here(func, clusterSize && config)) return r;
  *clusterSize = kPortableClusterSize;
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                      const CUlaunchConfig* config) {
  if (CUresult r = load_function_here(func, numClusters && config)) return r;
  *numClusters = 1;
  return CUDA_SUCCESS;
}

// ---- Variables -------------------------------------------------------------------------------

// Lazy, a module's variable loads on the module's device; a null or unloaded module is
// CUDA_ERROR_INVALID_HANDLE.
CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod, const char* name) {
  return get_variable("cuModuleGetGlobal", dptr, bytes, hmod, CodeKind::module, name);
}

// Lazy, a library's variable loads on the current context's device, one copy per device.
CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library, const char* name) {
  return get_variable("cuLibraryGetGlobal", dptr, bytes, library, CodeKind::library, name);
}
