// The core of every hooked driver entry point (driver_exports.cpp): allocation, free, memory
// info, streams, primary-context resets and releases, context destruction, and the resolvers.
// The device comes from the current context, and only a device's primary context is pooled
// (Note [Primary contexts] in driver_context.cpp); a thread with no current context gets the
// real call. The shims call exactly one of these after their re-entry and pass-through checks.
//
// Depends on the pooling core, the driver variants and the driver context.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

#include "interpose/driver_context.h"
#include "interpose/pooling.h"

namespace poolcuda::driver_hooks {

// A free of `dptr` in `ctx`: in the pools of its device's primary context when it is pooled
// memory, whatever context is current (Note [Contexts of the program's] in driver_context.cpp);
// ordered on `stream` (a runtime handle; nullptr: none) when the pools can fence it there.
pooling::Freed release(const driver::CurrentContext& ctx, CUdeviceptr dptr,
                       cudaStream_t stream = nullptr);

CUresult mem_alloc(CUdeviceptr* dptr, std::size_t size);
CUresult mem_free(CUdeviceptr dptr);
// cuMemFreeAsync(_ptsz): pooled memory as cuMemFree frees it (the free fence covers the work
// ordered before the free on `stream`); the rest to the real call.
CUresult mem_free_async(CUdeviceptr dptr, CUstream stream, bool per_thread);
// An allocation of `size` bytes the pools do not serve: `real`, and once more after the current
// device's pools gave their idle memory back when the driver refused it for lack of memory,
// unless `size` is more than the device has.
inline constexpr std::size_t kSizeUnknown = 0;  // never more than the device
CUresult with_room(std::size_t size, const std::function<CUresult()>& real);
// The same for memory of `device` (cuMemCreate names it; it need not be current).
CUresult with_room_on(int device, std::size_t size, const std::function<CUresult()>& real);
// The same, for a device that is looked up (device_of) only once the driver refused.
// `stream_pool`: a stream-ordered pool's allocation (pooling::beyond_reach).
CUresult with_room_on(const std::function<int()>& device_of, std::size_t size,
                      const std::function<CUresult()>& real, bool stream_pool = false);
// The same for memory of a device the library cannot tell (a memory pool's): the current
// device's idle memory goes back first, and every other device's when that was not enough.
CUresult with_room_anywhere(std::size_t size, const std::function<CUresult()>& real);
// Code the driver loads (Note [Launches short of memory] in hooks.cpp). `real` was just refused
// with CUDA_ERROR_OUT_OF_MEMORY for memory of `device` it does not say the size of: `real` once
// more after that device's pools gave their idle memory back (waiting only for the fences of
// frees that were not stream-ordered), or CUDA_ERROR_OUT_OF_MEMORY when nothing went back, nor
// reached the driver since `returns` was made before the refused call (Note [Room that arrived
// meanwhile] in pooling.cpp), or `device` is negative.
CUresult again_with_room_on(int device, const pooling::ReturnsSince& returns,
                            const std::function<CUresult()>& real);
// The same when the memory may be any device's (a library loads into every context): the
// current device's idle memory first, every other device's when that was not enough.
CUresult again_with_room_anywhere(const pooling::ReturnsSince& returns,
                                  const std::function<CUresult()>& real);
// The device whose work `stream` carries (a launch of a CUkernel runs in its stream's context);
// for the default streams, or a driver without cuStreamGetDevice, the current context's; -1
// without one.
int stream_device(CUstream stream);
// The device memory the current context takes more when `limit` is set to `value`: a larger
// heap or printf buffer takes the difference, a larger stack the difference for every thread
// the device holds at once; kSizeUnknown for other limits, a smaller value, or when the driver
// does not tell.
std::size_t limit_growth(CUlimit limit, std::size_t value);
CUresult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes);
CUresult ctx_synchronize();
// cuCtxSynchronize_v2: the same for `ctx`, or the current context when it is null.
CUresult ctx_synchronize_named(CUcontext ctx);
CUresult mem_get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr dptr);
CUresult ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr dptr);
CUresult stream_create(CUstream* stream, unsigned int flags);
CUresult stream_create_with_priority(CUstream* stream, unsigned int flags, int priority);

// What the driver says of `stream` (with `per_thread`, 0 names the per-thread stream): whether it
// knows the handle, and whether a capture is open or invalidated on it. The capture layer's
// queries of a stream are runtime calls, which leave a refused handle's error in the program's
// last-error slot, where the plain driver call leaves nothing: a driver hook makes them only for
// a stream the driver knows, and asks for a capture's id only where the driver sees one.
struct DriverStream {
  bool known = false;
  bool capturing = false;
};
DriverStream driver_stream(CUstream stream, bool per_thread = false);

// `real` is the variant the program called (v1 or _v2).
CUresult stream_destroy(CUresult (*real)(CUstream), CUstream stream);
CUresult primary_ctx_reset(CUresult (*real)(CUdevice), CUdevice device);
CUresult primary_ctx_release(CUresult (*real)(CUdevice), CUdevice device);
CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx);

// A resolver's answer (cuGetProcAddress, cudaGetDriverEntryPoint): a hooked variant's real
// function becomes the library's hook; anything else, and every failure, passes unchanged.
void map_resolved(bool found, void** fn);

}  // namespace poolcuda::driver_hooks
