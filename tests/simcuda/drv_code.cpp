// The driver stand-in's entry points for device code, which it cannot run but whose memory it
// charges (Note [Code memory] in code.cpp): kernel launches (cuLaunchKernel, cuLaunchKernelEx,
// cuLaunchCooperativeKernel and their _ptsz forms) load the function's module at its first launch
// on a device, then fail with CUDA_ERROR_NOT_SUPPORTED and a line on stderr, as every
// unimplemented entry point does; explicit module and library loads (cuModuleLoad,
// cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary, cuLibraryLoadData,
// cuLibraryLoadFromFile) take their memory and hand out a handle, which cuModuleUnload /
// cuLibraryUnload give back. Images are not read, options are ignored; any non-null CUfunction is
// a function.
#include <cstdio>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

extern "C" int simcuda_unsupported(const char* name);  // state.cpp: the line on stderr, 801

namespace {

// Every launch: the function's module loaded (out of memory when the device cannot hold it, and
// nothing enqueued), then the refusal.
CUresult launch(const char* name, CUfunction f, void** params, void** extra) {
  if (CUresult r = guard(true)) return r;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;  // the parameters given twice
  if (cudaError_t err = load_for_launch(context_device(), f); err != cudaSuccess)
    return alloc_result(err);
  return static_cast<CUresult>(simcuda_unsupported(name));
}

CUresult launch_ex(const char* name, const CUlaunchConfig* config, CUfunction f, void** params,
                   void** extra) {
  if (CUresult r = guard(true)) return r;
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  return launch(name, f, params, extra);
}

// An explicit load of `image` (not read) into the current context.
template <typename Handle>
CUresult load(CodeKind kind, Handle* out, const void* image) {
  if (CUresult r = guard(true)) return r;
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  void* handle = nullptr;
  if (cudaError_t err = code_load(thread_context(), kind, &handle); err != cudaSuccess)
    return alloc_result(err);
  *out = static_cast<Handle>(handle);
  return CUDA_SUCCESS;
}

// A load from a file, which must open for reading (its contents are not read either).
template <typename Handle>
CUresult load_file(CodeKind kind, Handle* out, const char* path) {
  if (CUresult r = guard(true)) return r;
  if (!out || !path) return CUDA_ERROR_INVALID_VALUE;
  std::FILE* file = std::fopen(path, "rb");
  if (!file) return CUDA_ERROR_FILE_NOT_FOUND;
  std::fclose(file);
  return load(kind, out, path);
}

}  // namespace

CUresult cuLaunchKernel(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream, void** kernelParams,
                        void** extra) {
  bump(Counter::cuLaunchKernel);
  return launch("cuLaunchKernel", f, kernelParams, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream,
                             void** kernelParams, void** extra) {
  bump(Counter::cuLaunchKernel);
  return launch("cuLaunchKernel_ptsz", f, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                          void** extra) {
  return launch_ex("cuLaunchKernelEx", config, f, kernelParams, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                               void** extra) {
  return launch_ex("cuLaunchKernelEx_ptsz", config, f, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, unsigned int,
                                   CUstream, void** kernelParams) {
  return launch("cuLaunchCooperativeKernel", f, kernelParams, nullptr);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int, unsigned int, unsigned int,
                                        unsigned int, unsigned int, unsigned int, unsigned int,
                                        CUstream, void** kernelParams) {
  return launch("cuLaunchCooperativeKernel_ptsz", f, kernelParams, nullptr);
}

CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return load_file(CodeKind::module, module, fname);
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return load(CodeKind::module, module, image);
}

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int, CUjit_option*,
                            void**) {
  return load(CodeKind::module, module, image);
}

CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return load(CodeKind::module, module, fatCubin);
}

// Unknown, already unloaded, or gone with its context: CUDA_ERROR_INVALID_HANDLE.
CUresult cuModuleUnload(CUmodule hmod) {
  if (CUresult r = guard(true)) return r;
  if (!hmod) return CUDA_ERROR_INVALID_VALUE;
  return as_cu(code_unload(hmod, CodeKind::module));
}

CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                           unsigned int, CUlibraryOption*, void**, unsigned int) {
  return load(CodeKind::library, library, code);
}

CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option*, void**,
                               unsigned int, CUlibraryOption*, void**, unsigned int) {
  return load_file(CodeKind::library, library, fileName);
}

// A library belongs to no context: no current one is needed to unload it.
CUresult cuLibraryUnload(CUlibrary library) {
  if (CUresult r = guard()) return r;
  if (!library) return CUDA_ERROR_INVALID_VALUE;
  return as_cu(code_unload(library, CodeKind::library));
}
