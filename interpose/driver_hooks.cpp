// The hooked driver calls' logic (see driver_hooks.h).
//
// Driver calls return CUresult and keep no last error, so a refusal is just its code:
// CUDA_ERROR_OUT_OF_MEMORY for a full capped pool, CUDA_ERROR_INVALID_VALUE for a double free
// or an interior pointer. A free made while a context of cuCtxCreate is current may still name
// pooled memory, of any device: the pools take it back with that device's primary context
// current for the time of the free (their own calls must never run in another context).
//
// Depends on the pooling core, the driver variants and the driver context.
#include "interpose/driver_hooks.h"

#include <optional>

#include "interpose/budget.h"
#include "interpose/driver_context.h"
#include "interpose/driver_variants.h"
#include "interpose/foreign_frees.h"
#include "interpose/hooks.h"
#include "interpose/pooling.h"
#include "interpose/real_driver.h"
#include "interpose/registry.h"
#include "interpose/stream_order.h"

namespace poolcuda::driver_hooks {

namespace {

cudaStream_t as_runtime(CUstream stream) { return reinterpret_cast<cudaStream_t>(stream); }
void* as_pointer(CUdeviceptr dptr) { return reinterpret_cast<void*>(dptr); }

// The program uses the driver directly (Note [Stream-ordered reuse]), unless no live context is
// current: the call fails then and issues no work, and the library's own calls that leaving
// ordered reuse makes would bind the thread to the device's primary context (a new one after a
// reset), so that the call itself, and the thread's later calls, reached memory the plain
// program's fail on: a cuMemFree of a pooled pointer by a thread without a context freed the
// pools' page in the driver (Note [Destroyed contexts] in driver_context.cpp). The program's
// next call in a live context leaves.
void driver_used(const driver::CurrentContext& ctx) {
  if (ctx.live()) stream_order::driver_used_directly();
}

// Whether `stream` is one the library saw created in a primary context (the stream table's).
bool tracked_stream(cudaStream_t stream) {
  StreamTable& table = Registry::instance().streams();
  auto hold = table.lock();
  for (const TrackedStream& tracked : table.streams())
    if (tracked.stream == stream) return true;
  return false;
}

}  // namespace

// `stream`: a stream-ordered free's stream as the runtime names it. Under a context of
// cuCtxCreate the pools take the pointer back in the primary context of the device whose pools
// hold it, which may not be the current context's device, nor one whose primary context the
// program ever used; the free stays ordered on its stream when that is one the library saw
// created (in a primary context, of any device: its fence covers it), or when it frees managed
// memory, which that context's own streams may use (an event on the stream orders it: Note
// [Frees on streams the library never saw] in cuda_device.cpp). The default streams there are
// that context's own, which no fence of the pools reaches: the free is fenced as a plain one.
pooling::Freed release(const driver::CurrentContext& ctx, CUdeviceptr dptr,
                       cudaStream_t stream) {
  if (ctx.primary) {
    return pooling::release(ctx.device, as_pointer(dptr), reinterpret_cast<StreamToken>(stream));
  }
  const int holder = pooling::holder_device(as_pointer(dptr));
  const int device = holder >= 0 ? holder : ctx.device;
  const bool ordered =
      stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread &&
      (tracked_stream(stream) || pooling::managed_allocation(as_pointer(dptr)));
  driver::PrimaryScope scope(device);
  if (!scope.ok()) return {};  // no pools alive there: the real free answers
  return pooling::release(device, as_pointer(dptr),
                          ordered ? reinterpret_cast<StreamToken>(stream) : kNoStream);
}


CUresult mem_alloc(CUdeviceptr* dptr, std::size_t size) {
  const driver::CurrentContext ctx = driver::current_context();
  driver_used(ctx);
  // Memory the pools do not serve (another context's, or no pool takes the size) still finds
  // the room their idle pages take.
  if (!ctx.primary)
    return with_room(size, [&] { return driver_real::cuMemAlloc_v2()(dptr, size); });
  void* ptr = nullptr;
  void** out = dptr != nullptr ? &ptr : nullptr;
  switch (pooling::allocate("cuMemAlloc", ctx.device, size, out)) {
    case pooling::Route::pooled:
      *dptr = reinterpret_cast<CUdeviceptr>(ptr);
      return CUDA_SUCCESS;
    case pooling::Route::forward: {
      const int result = pooling::forward(ctx.device, size, out, [&] {
        const CUresult real =
            with_room(size, [&] { return driver_real::cuMemAlloc_v2()(dptr, size); });
        if (real == CUDA_SUCCESS) ptr = as_pointer(*dptr);
        return static_cast<int>(real);
      });
      if (result != pooling::kOverBudget) return static_cast<CUresult>(result);
      break;
    }
    case pooling::Route::refused:
      break;
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

namespace {

// The driver's free of `dptr`, which the pools do not own; `guard` (when there is one) ends as
// soon as it returns and its bookkeeping is done. Only the primary context's pass-through
// allocations are counted; in a context of the program's, what the runtime passed through
// there was charged to the budget, and its free uncharges it.
template <typename Real>
CUresult forward_free(const driver::CurrentContext& ctx, CUdeviceptr dptr, Real&& real,
                      ForeignFree* guard = nullptr) {
  std::optional<pooling::ForwardedFree> forwarded;
  budget::PassedCharge charge;
  if (ctx.primary) {
    forwarded.emplace(ctx.device, as_pointer(dptr));
  } else {
    charge = budget::take_through(as_pointer(dptr));
  }
  const CUresult result = real();
  // The bookkeeping first: once the guard ends, a free of the same address may go on.
  if (forwarded) forwarded->finish(result == CUDA_SUCCESS);
  budget::settle_through(charge, result == CUDA_SUCCESS);
  if (guard != nullptr) guard->end();
  return result;
}

// What a free of `dptr` by `api` answers once the pools said `freed`: success when they freed
// it, a refusal, or for memory they do not own `real` under a ForeignFree guard after a second
// look (Note [Foreign frees] in foreign_frees.cpp).
template <typename Real>
CUresult finish_free(const char* api, const driver::CurrentContext& ctx, CUdeviceptr dptr,
                     const pooling::Freed& freed, Real&& real) {
  switch (freed.outcome) {
    case FreeOutcome::freed:
      return CUDA_SUCCESS;
    case FreeOutcome::not_mine: {
      ForeignFree guard(as_pointer(dptr));
      Registry::instance().await_new_managed_slabs();  // step 3 of Note [Foreign frees]
      const pooling::Freed again = release(ctx, dptr);
      if (again.outcome == FreeOutcome::freed) return CUDA_SUCCESS;
      if (again.outcome != FreeOutcome::not_mine) {
        pooling::log_refused_free(api, as_pointer(dptr), again);
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (!guard.may_free()) return CUDA_ERROR_INVALID_VALUE;
      return forward_free(ctx, dptr, real, &guard);
    }
    case FreeOutcome::double_free:
    case FreeOutcome::interior_pointer:
    case FreeOutcome::not_allocated:
      break;
  }
  pooling::log_refused_free(api, as_pointer(dptr), freed);
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

CUresult mem_free(CUdeviceptr dptr) {
  const driver::CurrentContext ctx = driver::current_context();
  driver_used(ctx);
  if (!ctx.live() || dptr == 0) return driver_real::cuMemFree_v2()(dptr);
  return finish_free("cuMemFree", ctx, dptr, release(ctx, dptr),
                     [&] { return driver_real::cuMemFree_v2()(dptr); });
}

CUresult mem_free_async(CUdeviceptr dptr, CUstream stream, bool per_thread) {
  auto real_call = [&] {
    return per_thread ? driver_real::cuMemFreeAsync_ptsz()(dptr, stream)
                      : driver_real::cuMemFreeAsync()(dptr, stream);
  };
  const driver::CurrentContext ctx = driver::current_context();
  driver_used(ctx);
  if (!ctx.live() || dptr == 0) return real_call();
  const cudaStream_t named =
      per_thread && stream == nullptr ? cudaStreamPerThread : as_runtime(stream);
  // The stream's capture, asked of the driver: a program of the driver API alone (or of the
  // static runtime) has no runtime to ask. A handle the driver does not know frees nothing (Note
  // [Stream handles] in hooks.cpp). A default stream is asked only while a capture is open on
  // the device (its query may fail beside another stream's capture, and then tells nothing).
  const bool default_stream = named == nullptr || named == cudaStreamLegacy ||
                              named == cudaStreamPerThread;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!default_stream || (ctx.primary && hooks::capture_open(ctx.device))) {
    const CUresult asked =
        real_driver::cuStreamIsCapturing()(reinterpret_cast<CUstream>(named), &status);
    if (asked != CUDA_SUCCESS && !default_stream) return asked;
    // The legacy stream beside a blocking stream's capture: refused, and that capture
    // invalidated, as by the plain free (Note [The legacy stream beside a capture] in hooks.cpp).
    if (asked == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
      CUevent event = nullptr;
      if (real_driver::cuEventCreate()(&event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
        real_driver::cuEventRecord()(event, reinterpret_cast<CUstream>(named));
        real_driver::cuEventDestroy_v2()(event);
      }
      return asked;
    }
    if (asked != CUDA_SUCCESS) status = CU_STREAM_CAPTURE_STATUS_NONE;
  }
  // An invalidated capture fails every call on its stream: the plain free frees nothing.
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  // A free captured into a graph may name a graph memory node's address: the real call decides,
  // as for cudaFreeAsync (hooks.cpp).
  const pooling::Freed freed = release(ctx, dptr, named == nullptr ? cudaStreamLegacy : named);
  if (freed.outcome == FreeOutcome::not_mine && status == CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return forward_free(ctx, dptr, real_call);
  return finish_free("cuMemFreeAsync", ctx, dptr, freed, real_call);
}

namespace {

// Gives `device`'s idle pool memory back; false when nothing went back. The pools' own calls run
// in the device's primary context only; the caller's retry runs in the caller's context.
bool give_back_on(const driver::CurrentContext& ctx, int device, pooling::GrowthHold& hold,
                  GiveBackWait wait = GiveBackWait::every_fence) {
  if (ctx.primary && ctx.device == device) return pooling::give_back_idle(device, hold, wait);
  driver::PrimaryScope scope(device);
  return scope.ok() && pooling::give_back_idle(device, hold, wait);
}

// Code waits only for the fences of frees that were not stream-ordered (Note [Launches short of
// memory] in hooks.cpp).
constexpr GiveBackWait kForCode = GiveBackWait::cudafree_fences;

}  // namespace

CUresult with_room_on(int device, std::size_t size, const std::function<CUresult()>& real) {
  return with_room_on([device] { return device; }, size, real);
}

CUresult with_room_on(const std::function<int()>& device_of, std::size_t size,
                      const std::function<CUresult()>& real, bool stream_pool) {
  const pooling::ReturnsSince returns;
  const CUresult first = real();
  if (first != CUDA_ERROR_OUT_OF_MEMORY) return first;
  const int device = device_of();
  if (device < 0) return first;
  // Nothing that comes back could make room: the pools keep their pages, and the refusal comes
  // at once, as the plain call's does (Note [Requests beyond reach] in pooling.cpp).
  if (pooling::beyond_reach(device, size, stream_pool)) return first;
  pooling::GrowthHold hold;  // Note [Room held for the retry] in pooling.cpp
  const bool room = give_back_on(driver::current_context(), device, hold) || returns.moved(device);
  return room ? real() : first;
}

int stream_device(CUstream stream) {
  // Never cuStreamGetDevice on a capturing stream (Note [A capturing stream's device]).
  if (stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD) {
    return hooks::stream_device(as_runtime(stream));
  }
  const driver::CurrentContext ctx = driver::current_context();
  return ctx.handle != nullptr ? ctx.device : -1;
}

CUresult again_with_room_on(int device, const pooling::ReturnsSince& returns,
                            const std::function<CUresult()>& real) {
  if (device < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  pooling::GrowthHold hold;  // Note [Room held for the retry] in pooling.cpp
  return give_back_on(driver::current_context(), device, hold, kForCode) || returns.moved(device)
             ? real()
             : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult again_with_room_anywhere(const pooling::ReturnsSince& returns,
                                  const std::function<CUresult()>& real) {
  const driver::CurrentContext ctx = driver::current_context();
  const int current = ctx.handle != nullptr ? ctx.device : -1;
  std::optional<pooling::ReturnsSince> retried;  // made before the retry on the current device
  pooling::GrowthHold hold;  // Note [Room held for the retry] in pooling.cpp
  if (current >= 0 && (give_back_on(ctx, current, hold, kForCode) || returns.moved(current))) {
    retried.emplace();
    const CUresult result = real();
    if (result != CUDA_ERROR_OUT_OF_MEMORY) return result;
  }
  const pooling::ReturnsSince& last = retried ? *retried : returns;
  bool gave = false;
  for (const int device : Registry::instance().devices()) {
    if (device == current) continue;
    gave = give_back_on(ctx, device, hold, kForCode) || gave;
  }
  return gave || last.moved(current) ? real() : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult with_room(std::size_t size, const std::function<CUresult()>& real) {
  const driver::CurrentContext ctx = driver::current_context();
  return with_room_on(ctx.handle != nullptr ? ctx.device : -1, size, real);
}

CUresult with_room_anywhere(std::size_t size, const std::function<CUresult()>& real) {
  std::optional<pooling::ReturnsSince> last;  // made before each call to the driver
  const auto tracked = [&] {
    last.emplace();
    return real();
  };
  // A memory pool's allocation: the pool may keep memory the library cannot see.
  const driver::CurrentContext current = driver::current_context();
  const CUresult result = with_room_on(
      [&current] { return current.handle != nullptr ? current.device : -1; }, size, tracked, true);
  if (result != CUDA_ERROR_OUT_OF_MEMORY) return result;
  const driver::CurrentContext ctx = driver::current_context();
  bool gave = false;
  pooling::GrowthHold hold;  // Note [Room held for the retry] in pooling.cpp
  for (const int device : Registry::instance().devices()) {
    if (device == ctx.device || pooling::beyond_reach(device, size, true)) continue;
    gave = give_back_on(ctx, device, hold) || gave;
  }
  return gave || last->moved(ctx.handle != nullptr ? ctx.device : -1) ? real() : result;
}

std::size_t limit_growth(CUlimit limit, std::size_t value) {
  if (limit != CU_LIMIT_MALLOC_HEAP_SIZE && limit != CU_LIMIT_PRINTF_FIFO_SIZE &&
      limit != CU_LIMIT_STACK_SIZE)
    return kSizeUnknown;
  std::size_t current = 0;
  if (real_driver::cuCtxGetLimit()(&current, limit) != CUDA_SUCCESS || value <= current)
    return kSizeUnknown;
  const std::size_t more = value - current;
  if (limit != CU_LIMIT_STACK_SIZE) return more;
  CUdevice device = 0;
  int multiprocessors = 0;
  int threads = 0;
  if (real_driver::cuCtxGetDevice()(&device) != CUDA_SUCCESS ||
      real_driver::cuDeviceGetAttribute()(&multiprocessors,
                                          CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                          device) != CUDA_SUCCESS ||
      real_driver::cuDeviceGetAttribute()(
          &threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, device) != CUDA_SUCCESS ||
      multiprocessors <= 0 || threads <= 0)
    return more;  // at least that much
  const std::size_t resident = static_cast<std::size_t>(multiprocessors) *
                               static_cast<std::size_t>(threads);
  return more > SIZE_MAX / resident ? SIZE_MAX : more * resident;
}

// Note [Memory info after a synchronize] in pooling.cpp; only the primary context is pooled.
CUresult ctx_synchronize() {
  const driver::CurrentContext ctx = driver::current_context();
  if (ctx.primary) pooling::before_device_synchronize(ctx.device);
  return driver_real::cuCtxSynchronize()();
}

CUresult ctx_synchronize_named(CUcontext ctx) {
  // A driver older than CUDA 13 lacks it, and resolves the name to cuCtxSynchronize, which
  // would ignore `ctx`: answered as a missing function (real_driver.h).
  if (reinterpret_cast<void*>(driver_real::cuCtxSynchronize_v2()) ==
      reinterpret_cast<void*>(driver_real::cuCtxSynchronize()))
    return CUDA_ERROR_NOT_FOUND;
  int device = -1;  // stays -1 for a context of cuCtxCreate
  if (ctx == nullptr) {
    const driver::CurrentContext current = driver::current_context();
    if (current.primary) device = current.device;
  } else {
    driver::is_primary(ctx, &device);
  }
  if (device >= 0) pooling::before_device_synchronize(device);
  return driver_real::cuCtxSynchronize_v2()(ctx);
}

CUresult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  // The device's figures, whichever of its contexts asks: the pools' idle pages are the
  // device's free memory in a context of cuCtxCreate too. The pools' own calls (fences) run in
  // the primary context, as for a give-back.
  const driver::CurrentContext ctx = driver::current_context();
  const std::uint64_t grown_before = budget::growth_so_far(ctx.device);  // before the figure
  const CUresult result = driver_real::cuMemGetInfo_v2()(free_bytes, total_bytes);
  if (result != CUDA_SUCCESS || free_bytes == nullptr) return result;
  if (!ctx.live() || ctx.device < 0) return result;
  if (ctx.primary) {
    pooling::adjust_memory_info(ctx.device, grown_before, free_bytes, total_bytes);
  } else if (driver::PrimaryScope scope(ctx.device); scope.ok()) {
    pooling::adjust_memory_info(ctx.device, grown_before, free_bytes, total_bytes);
  }
  return result;
}

// Note [Managed address ranges]
// The driver knows a managed slab as one allocation, so its answer for a pointer in a slab is
// the whole slab: a program that zeroes or copies "the allocation" the answer names would reach
// its neighbours. So for a live slab allocation the answer is that allocation (its first byte
// and the size asked for), and for a slab's free space CUDA_ERROR_NOT_FOUND, as for memory the
// program freed. Managed memory has no IPC handle, so nothing needs the slab itself (pooled
// pages keep the page's range: Note [IPC handles] in pooling.cpp). The real call answers first:
// its refusals (no context, a null pointer) stand. It answers into the library's own variables,
// so that a refusal of the library's leaves the program's as they were, as the driver's does.
CUresult mem_get_address_range(CUdeviceptr* base, std::size_t* size, CUdeviceptr dptr) {
  CUdeviceptr real_base = 0;
  std::size_t real_size = 0;
  const CUresult result = driver_real::cuMemGetAddressRange_v2()(
      base != nullptr ? &real_base : nullptr, size != nullptr ? &real_size : nullptr, dptr);
  if (result != CUDA_SUCCESS) return result;
  Registry& registry = Registry::instance();
  pooling::release_passed_managed_frees();
  for (int device = 0; device < registry.managed_bound(); ++device) {
    const ManagedSlabs* chain = registry.managed(device);
    if (chain == nullptr) continue;
    const ManagedLookup found = chain->find(static_cast<DevicePtr>(dptr));
    if (found.kind == ManagedLookup::Kind::not_mine) continue;
    if (found.kind != ManagedLookup::Kind::live || pooling::managed_free_held(found.start))
      return CUDA_ERROR_NOT_FOUND;
    real_base = static_cast<CUdeviceptr>(found.start);
    real_size = found.size;
    break;
  }
  if (base != nullptr) *base = real_base;
  if (size != nullptr) *size = real_size;
  return result;
}

CUresult ipc_get_mem_handle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  if (pooling::ipc_exportable("cuIpcGetMemHandle", as_pointer(dptr)))
    return driver_real::cuIpcGetMemHandle()(handle, dptr);
  // Refused: the driver's own answer for an address that is certainly no device allocation
  // (this host variable), which is CUDA_ERROR_INVALID_VALUE unless the plain call would have
  // failed first (no current context, a sticky error). The program's handle is not written.
  static char not_device_memory;
  CUipcMemHandle scratch{};
  const CUresult raised = driver_real::cuIpcGetMemHandle()(
      &scratch, reinterpret_cast<CUdeviceptr>(&not_device_memory));
  return raised != CUDA_SUCCESS ? raised : CUDA_ERROR_INVALID_VALUE;
}

namespace {

// Streams of a primary context join the stream table; the memory of other contexts is not
// pooled, so their streams cannot touch it.
CUresult track(CUresult result, CUstream* stream, unsigned int flags) {
  const driver::CurrentContext ctx = driver::current_context();
  driver_used(ctx);
  if (result != CUDA_SUCCESS || stream == nullptr) return result;
  if (ctx.primary) pooling::track_stream(as_runtime(*stream), ctx.device, flags);
  return result;
}

}  // namespace

CUresult stream_create(CUstream* stream, unsigned int flags) {
  return track(driver_real::cuStreamCreate()(stream, flags), stream, flags);
}

CUresult stream_create_with_priority(CUstream* stream, unsigned int flags, int priority) {
  return track(driver_real::cuStreamCreateWithPriority()(stream, flags, priority), stream, flags);
}

DriverStream driver_stream(CUstream stream, bool per_thread) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUstream named = per_thread && stream == nullptr ? CU_STREAM_PER_THREAD : stream;
  DriverStream answer;
  answer.known = real_driver::cuStreamIsCapturing()(named, &status) == CUDA_SUCCESS;
  answer.capturing = answer.known && status != CU_STREAM_CAPTURE_STATUS_NONE;
  return answer;
}

CUresult stream_destroy(CUresult (*real)(CUstream), CUstream stream) {
  // A capture still open on the stream ends with it, as failed.
  int capture_device = -1;
  const unsigned long long capture =
      driver_stream(stream).capturing
          ? hooks::stream_capture_id(as_runtime(stream), &capture_device)
          : 0;
  pooling::untrack_stream(as_runtime(stream));
  const CUresult result = real(stream);
  if (capture != 0) {
    hooks::stream_destroyed_while_capturing(as_runtime(stream), capture_device, capture,
                                            result == CUDA_SUCCESS);
  }
  return result;
}

CUresult primary_ctx_reset(CUresult (*real)(CUdevice), CUdevice device) {
  // A device that does not exist has no pools to forget, and must not get any: the driver
  // answers it alone (making its pools first logged that its memory size could not be read).
  // (Only when the count is known: pools kept past a reset would hand out freed memory.)
  // Before cuInit no device exists yet, and no pools either: the driver refuses the call.
  int count = 0;
  const CUresult counted = real_driver::cuDeviceGetCount()(&count);
  if (counted == CUDA_ERROR_NOT_INITIALIZED ||
      (counted == CUDA_SUCCESS && (device < 0 || device >= count)))
    return real(device);
  return static_cast<CUresult>(pooling::reset_device(device, [&] { return real(device); }));
}

// The last release resets the primary context (its memory is gone): the pools forget theirs.
// Whether it is the last is known only afterwards, so the pools forget after the fact; another
// thread may have made a new one meanwhile (Note [Primary contexts replaced] in
// driver_context.cpp).
CUresult primary_ctx_release(CUresult (*real)(CUdevice), CUdevice device) {
  const unsigned long long before = driver::look_at_primary(device);
  const CUresult result = real(device);
  if (result == CUDA_SUCCESS) {
    if (!driver::primary_alive(device)) {
      if (driver::claim_dead_primary(device, before))
        pooling::reset_device(device, [] { return 0; });
    } else {
      driver::look_at_primary(device);
    }
  }
  pooling::forget_replaced_contexts();
  return result;
}

// The driver refuses to destroy a primary context (CUDA_ERROR_INVALID_CONTEXT on CUDA 13): its
// memory, the pools' pages, stays, and so must what the pools know of it. Should a driver take
// the call, the memory is gone, and the pools forget theirs after the fact, as at the last
// release.
CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx) {
  int device = -1;
  const bool primary = driver::is_primary(ctx, &device);
  // What the runtime passed through to CUDA in the program's context goes with it.
  const std::vector<budget::PassedCharge> charges =
      primary ? std::vector<budget::PassedCharge>{} : budget::take_context(ctx);
  const CUresult result = real(ctx);
  for (const budget::PassedCharge& charge : charges)
    budget::settle_through(charge, result == CUDA_SUCCESS);
  if (primary && result == CUDA_SUCCESS) pooling::reset_device(device, [] { return 0; });
  // The destroyed context, if it was current, gave way to the one below it.
  if (result == CUDA_SUCCESS) stream_order::context_switched();
  return result;
}

void map_resolved(bool found, void** fn) {
  if (found && fn != nullptr) *fn = driver::hook_for(*fn);
}

}  // namespace poolcuda::driver_hooks
