// The driver stand-in's entry points for device code, which it cannot run but whose memory it
// charges (Note [Code memory] in code.cpp): kernel launches (cuLaunchKernel, cuLaunchKernelEx,
// cuLaunchCooperativeKernel and their _ptsz forms) load the function at its first launch on a
// device, then fail with CUDA_ERROR_NOT_SUPPORTED and a line on stderr, as every unimplemented
// entry point does; explicit module and library loads (cuModuleLoad, cuModuleLoadData,
// cuModuleLoadDataEx, cuModuleLoadFatBinary, cuLibraryLoadData, cuLibraryLoadFromFile) hand out a
// handle, taking their memory unless loading is lazy (CUDA_MODULE_LOADING=LAZY), which
// cuModuleUnload / cuLibraryUnload give back; cuModuleGetFunction, cuLibraryGetKernel,
// cuKernelGetFunction and cuFuncLoad hand out and load functions; cuModuleGetLoadingMode reports
// the mode. Images are not read (any name is in every module), options are ignored; any non-null
// CUfunction or CUkernel is a function. The other uses of loaded code (attributes, occupancy,
// variables) are in drv_code_use.cpp.
#include <cstdio>

#include "drv_common.h"

using namespace poolcuda::sim;
using namespace poolcuda::sim::drv;

extern "C" int simcuda_unsupported(const char* name);  // state.cpp: the line on stderr, 801

namespace {

// Every launch: the function loaded (out of memory when the device cannot hold it, and nothing
// enqueued; an invalid handle when its module or library is unloaded), then the refusal.
CUresult launch(const char* name, CUfunction f, void** params, void** extra) {
  if (CUresult r = guard(true)) return r;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (params && extra) return CUDA_ERROR_INVALID_VALUE;  // the parameters given twice
  if (cudaError_t err = load_function(context_device(), f); err != cudaSuccess)
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

// The same handle for the same (module, name); lazy, the function's first get loads it on the
// module's device. Null or unloaded module: CUDA_ERROR_INVALID_HANDLE.
CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (CUresult r = guard(true)) return r;
  if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
  if (!hmod) return CUDA_ERROR_INVALID_HANDLE;
  void* f = nullptr;
  if (cudaError_t err = code_get(hmod, CodeKind::module, name, &f); err != cudaSuccess)
    return alloc_result(err);
  *hfunc = static_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

// The same handle for the same (library, name), loaded nowhere; like the library, it needs no
// context.
CUresult cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  if (CUresult r = guard()) return r;
  if (!pKernel || !name) return CUDA_ERROR_INVALID_VALUE;
  if (!library) return CUDA_ERROR_INVALID_HANDLE;
  void* k = nullptr;
  if (cudaError_t err = code_get(library, CodeKind::library, name, &k); err != cudaSuccess)
    return alloc_result(err);
  *pKernel = static_cast<CUkernel>(k);
  return CUDA_SUCCESS;
}

// The kernel loaded on the current context's device; the function is the kernel's own value.
CUresult cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  if (CUresult r = guard(true)) return r;
  if (!pFunc || !kernel) return CUDA_ERROR_INVALID_VALUE;
  if (cudaError_t err = load_function(context_device(), kernel); err != cudaSuccess)
    return alloc_result(err);
  *pFunc = reinterpret_cast<CUfunction>(kernel);
  return CUDA_SUCCESS;
}

// The function loaded on the current context's device, as its first launch would load it.
CUresult cuFuncLoad(CUfunction function) {
  if (CUresult r = guard(true)) return r;
  if (!function) return CUDA_ERROR_INVALID_HANDLE;
  return alloc_result(load_function(context_device(), function));
}

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (CUresult r = guard()) return r;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  *mode = config().lazy_loading ? CU_MODULE_LAZY_LOADING : CU_MODULE_EAGER_LOADING;
  return CUDA_SUCCESS;
}
