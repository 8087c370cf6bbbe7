// The hooked runtime calls' logic (see hooks.h).
//
// Note [Last error]
// The runtime keeps a per-thread "last error" that cudaGetLastError returns and clears. The pools'
// own device calls leave it as they found it (Note [Own calls] in own_call.h), so an allocation
// that succeeded after trimming shows the program no error. When the pools give up on an
// out-of-memory, the request goes to the real cudaMalloc one last time: it fails as the real
// library would and leaves exactly the last error the real library leaves (or, if memory came free
// meanwhile, it succeeds and the memory is simply not pooled). A size no configured pool accepts (a
// custom layout that does not cover every size) is no reason to refuse what the driver would give:
// it goes to the real cudaMalloc too, and its pointer to the real cudaFree later, since no pool
// owns it. A capped pool that is full with nothing behind it, and a request over the device's
// budget, are deliberate limits: such a refusal has no real call to mirror, so it raises
// cudaErrorMemoryAllocation in the slot with a real cudaMalloc of a size no device has, made into
// the program's pointer, which then holds what a plain refusal leaves there (the pointer left as it
// was let a program free a stale pointer). A refused cudaFree, and a refused cudaIpcGetMemHandle
// (Note [IPC handles] in pooling.cpp), raise cudaErrorInvalidValue the same way.
//
// Depends on the shared pooling core, the driver hooks (for the resolvers), the driver context
// helpers and the real-function tables.
#include "interpose/hooks.h"

#include <atomic>

#include "interpose/budget.h"
#include "interpose/driver_context.h"
#include "interpose/driver_hooks.h"
#include "interpose/foreign_frees.h"
#include "interpose/own_call.h"
#include "interpose/pooling.h"
#include "interpose/real_cuda.h"
#include "interpose/real_driver.h"
#include "interpose/registry.h"

namespace poolcuda::hooks {

// Note [One visible device]
// With one device visible to the process, the current device is that one (index 0) whatever
// the thread did: cudaSetDevice accepts no other index, and a context made through the driver
// API is on that device too. The count is fixed once the runtime has started, so it is asked
// once, and such a process's allocations make no runtime call to learn the device but a
// thread's first (Note [A thread's first call]): on the stand-in that call was about 30 ns of
// the 70 the library added to a pair over the pools' own cost. With more devices the runtime is
// asked each time, and so it is when the count's call failed (no driver, no device), but the
// count is not asked again. Those refusals are the library's, not the program's: a slot that
// was clean before them is cleared again (a program's error already there may be lost).
//
// Note [A thread's first call]
// The program's own cudaMalloc, like every runtime call that needs a context, leaves the
// device's primary context current on a thread that had none, and a thread may go on with the
// driver API on that strength. A pooled call makes no such runtime call (the library's own calls
// leave a thread without a context as they found it: Note [Own calls] in own_call.h), and
// whether the runtime's cudaGetDevice binds a context is not documented. So a thread's first
// call (the first to ask for the current device) makes the primary context of its device
// current when no context is (driver::make_primary_current: only while that context is alive),
// and so does the end of each pooled allocation, free and refusal until that has happened once:
// on the process's first call the context comes alive only as the pools take their first page.
// A thread that later pops its context through the driver is not bound again.
namespace {

// Runs the runtime query `ask`, whose refusal is the library's error, not the program's: a
// last-error slot that was clean before it is clean after it.
template <typename Ask>
cudaError_t quietly(Ask&& ask) {
  const bool slot_clean = real::cudaPeekAtLastError()() == cudaSuccess;
  const cudaError_t result = ask();
  if (result != cudaSuccess && slot_clean) real::cudaGetLastError()();
  return result;
}

// Whether the thread had a context, or was given one, once (Note [A thread's first call]).
__attribute__((tls_model("initial-exec"))) thread_local bool t_bound = false;

}  // namespace

void bind_like_the_runtime(int device) {
  if (t_bound || device < 0) return;
  CUcontext current = nullptr;
  if (real_driver::cuCtxGetCurrent()(&current) != CUDA_SUCCESS) return;
  t_bound = current != nullptr || driver::make_primary_current(device);
}

void bind_after_own_calls() {
  if (!t_bound) (void)current_device();  // which binds
}

int current_device() {
  static std::atomic<int> visible{0};  // 0 until the count was asked, -1 when that failed
  int count = visible.load(std::memory_order_relaxed);
  if (count == 0) {
    if (quietly([&] { return real::cudaGetDeviceCount()(&count); }) != cudaSuccess || count <= 0)
      count = -1;
    visible.store(count, std::memory_order_relaxed);
  }
  if (count == 1 && t_bound) return 0;
  int device = -1;
  const auto ask = [&] { return real::cudaGetDevice()(&device); };
  if ((count < 0 ? quietly(ask) : ask()) != cudaSuccess) return -1;
  bind_like_the_runtime(device);
  return device;
}

// A refused free (double free, interior pointer) leaves cudaErrorInvalidValue in the last-error
// slot, as the real cudaFree of a pointer that starts no allocation does: the real call on an
// address that is certainly no device allocation (this host variable) fails the same way and
// touches nothing. Its answer is the refusal's: under a sticky context error that error, as the
// plain call would have answered. Both raising calls run in relaxed capture mode: a real
// cudaFree or cudaMalloc is unsafe under the program's global or thread-local capture and would
// invalidate it, where the refused call (a cudaFreeAsync of a stale pointer) would not.
cudaError_t raise_invalid_value() {
  static char not_device_memory;
  // Before the raising call: asking for the device may fail (no device), and its error must not
  // take the raised one's place in the slot.
  bind_after_own_calls();
  cudaError_t raised;
  {
    RelaxedCaptureScope relaxed;
    raised = real::cudaFree()(&not_device_memory);
  }
  return raised != cudaSuccess ? raised : cudaErrorInvalidValue;
}

cudaError_t raise_out_of_memory(void** out) {
  // Larger than any device; a real cudaMalloc of it fails with cudaErrorMemoryAllocation. It
  // answers into the program's pointer, which the plain refusal sets (to NULL): left as it was,
  // a program that frees the pointer after a failed allocation freed a stale one.
  constexpr std::size_t kImpossibleSize = std::size_t{1} << 52;
  void* scratch = nullptr;
  void** ptr = out != nullptr ? out : &scratch;
  bind_after_own_calls();  // first, as in raise_invalid_value()
  cudaError_t raised;
  {
    RelaxedCaptureScope relaxed;
    raised = real::cudaMalloc()(ptr, kImpossibleSize);
    if (raised == cudaSuccess) {
      real::cudaFree()(*ptr);
      *ptr = nullptr;
    }
  }
  return raised != cudaSuccess ? raised : cudaErrorMemoryAllocation;
}

namespace {

cudaError_t forward_malloc(int device, void** ptr, std::size_t size) {
  // No pool serves it, but the pools' idle pages take room it may need (Note [Stream-ordered
  // allocations]).
  const int result = pooling::forward(device, size, ptr, [&] {
    return with_room(device, size, [&] { return real::cudaMalloc()(ptr, size); });
  });
  if (result != pooling::kOverBudget) return static_cast<cudaError_t>(result);
  return raise_out_of_memory(ptr);
}

}  // namespace

// Asked of the driver: a program without the runtime (the static one, the driver API alone)
// frees through here too, and a failed query leaves no error in the runtime's slot.
bool capturing(cudaStream_t stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return real_driver::cuStreamIsCapturing()(reinterpret_cast<CUstream>(stream), &status) ==
             CUDA_SUCCESS &&
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// Note [Stream handles]
// A stream-ordered free names a stream, and plain CUDA refuses a handle it does not know (never
// created, or destroyed) with cudaErrorInvalidResourceHandle, freeing nothing. The pools need
// the handle only as a fence token: they freed the slice all the same, handed its memory out
// again at once, and refused the program's own later free as a double free, so the program's
// bytes were overwritten. So before a stream-ordered free of pooled memory, any handle but the
// legacy and per-thread default streams is put to the driver, with the one query that is legal
// during a capture (is-capturing), and a refused handle fails the free with the query's error,
// left in the last-error slot as the plain call leaves it. It costs each such free one
// runtime call.
cudaError_t stream_handle_error(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return cudaSuccess;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return real::cudaStreamIsCapturing()(stream, &status);
}

bool capture_open(int device) {
  CudaDevice* d = device >= 0 ? Registry::instance().device(device) : nullptr;
  return d != nullptr && d->hooked_capture_open();
}

namespace {

// Work queued on `stream`, which fails there as the plain call would (an event record), with
// what that failure does: the error left in the last-error slot, and for the legacy stream the
// blocking stream's capture invalidated. Returns `error`.
cudaError_t refuse_for_capture(cudaStream_t stream, cudaError_t error) {
  cudaEvent_t event = nullptr;
  if (real::cudaEventCreateWithFlags()(&event, cudaEventDisableTiming) == cudaSuccess) {
    real::cudaEventRecord()(event, stream);
    real::cudaEventDestroy()(event);
  }
  return error;
}

}  // namespace

// Note [The legacy stream beside a capture]
// Work on the legacy stream waits for every blocking stream of its device, so while one of them
// captures, CUDA refuses it with cudaErrorStreamCaptureImplicit and invalidates that capture,
// whatever the capture's mode and whichever thread began it: a plain stream-ordered free there
// frees nothing, and the capture's end then fails. The pools took the free as any other (the
// capturing query's error was thrown away as not the program's): it succeeded, the capture made
// a graph, and the program's later free of the same pointer was refused as a double free. So the
// free is refused as the plain call is, and an event record on the legacy stream invalidates the
// capture the same way. The per-thread stream waits for no other stream and is not refused.
cudaError_t capture_refusal(cudaStream_t stream) {
  // No capture, nothing to ask; on any device: the stream may be another's than the current one.
  if (!any_capture_open()) return cudaSuccess;
  // Another failure of the query is not the program's, and is cleared when the slot was clean;
  // one that held the program's error has lost it then.
  const bool slot_clean = real::cudaPeekAtLastError()() == cudaSuccess;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t asked = real::cudaStreamIsCapturing()(stream, &status);
  if (asked == cudaErrorStreamCaptureImplicit) return refuse_for_capture(stream, asked);
  if (asked != cudaSuccess && slot_clean) real::cudaGetLastError()();
  if (asked == cudaSuccess && status == cudaStreamCaptureStatusInvalidated)
    return refuse_on_invalidated_capture(stream);
  return cudaSuccess;
}

cudaError_t refuse_on_invalidated_capture(cudaStream_t stream) {
  return refuse_for_capture(stream, cudaErrorStreamCaptureInvalidated);
}

namespace {

// Whether the driver has less than `size` free (a successful query leaves the last-error slot
// alone; a failed one counts as short).
bool driver_short_of(std::size_t size) {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  return real::cudaMemGetInfo()(&free_bytes, &total_bytes) != cudaSuccess || free_bytes < size;
}

cudaError_t refuse_free(const char* api, void* ptr, const pooling::Freed& freed) {
  pooling::log_refused_free(api, ptr, freed);
  return raise_invalid_value();
}

// A free the pools did not own goes to `real` under a ForeignFree guard, after a second look
// (Note [Foreign frees] in foreign_frees.cpp). A stale pointer is answered as the real call
// answers one, without the call: it could only free what the driver has put there since,
// perhaps a pool's page.
template <typename Real>
cudaError_t free_foreign(const char* api, int device, void* ptr, Real&& real) {
  ForeignFree guard(ptr);
  Registry::instance().await_new_managed_slabs();  // step 3 of the note
  const pooling::Freed again = pooling::release(device, ptr);
  if (again.outcome == FreeOutcome::freed) return cudaSuccess;
  if (again.outcome != FreeOutcome::not_mine) return refuse_free(api, ptr, again);
  if (!guard.may_free()) {
    return raise_invalid_value();
  }
  pooling::ForwardedFree forwarded(device, ptr);
  const cudaError_t result = real();
  // The bookkeeping first: once the guard ends, a free of the same address may go on.
  forwarded.finish(result == cudaSuccess);
  guard.end();
  return result;
}

}  // namespace

cudaError_t malloc(void** ptr, std::size_t size) {
  const int device = current_device();
  // Note [Contexts of the program's] in driver_context.cpp.
  if (driver::in_program_context()) return forward_malloc(device, ptr, size);
  switch (pooling::allocate("cudaMalloc", device, size, ptr)) {
    case pooling::Route::pooled:
      bind_after_own_calls();  // Note [A thread's first call]
      return cudaSuccess;
    case pooling::Route::forward:
      return forward_malloc(device, ptr, size);  // NULL, size 0, no device: as the real call
    case pooling::Route::refused:
      break;
  }
  return raise_out_of_memory(ptr);
}

namespace {

// pooling::release of `ptr` on `device`; in a context of the program's own, in the primary
// context of the device whose pools hold it (Note [Contexts of the program's] in
// driver_context.cpp).
pooling::Freed release_here(int device, void* ptr, StreamToken stream) {
  if (driver::program_contexts_made()) {
    const driver::CurrentContext ctx = driver::current_context();
    if (ctx.live() && !ctx.primary) {
      return driver_hooks::release(ctx, reinterpret_cast<CUdeviceptr>(ptr),
                                   reinterpret_cast<cudaStream_t>(stream));
    }
  }
  return pooling::release(device, ptr, stream);
}

}  // namespace

cudaError_t free(void* ptr) {
  if (ptr == nullptr) {
    // The usual way to make the context before any allocation: the device's pools are built
    // now, so that its first cudaMalloc does not pay for them (Note [Pools made ahead]).
    const int device = current_device();
    pooling::ForwardedFree forwarded(device, ptr);
    const cudaError_t result = real::cudaFree()(ptr);
    forwarded.finish(result == cudaSuccess);
    if (result == cudaSuccess) Registry::instance().prepare(device);
    return result;
  }
  // Every device's pools are searched before a pointer is called foreign, so the first device
  // searched only saves time: with one device in use, the runtime is not asked which is current.
  const int sole = Registry::instance().sole_device();
  const pooling::Freed freed = release_here(sole >= 0 ? sole : current_device(), ptr, kNoStream);
  switch (freed.outcome) {
    case FreeOutcome::freed:
      bind_after_own_calls();  // Note [A thread's first call]
      return cudaSuccess;
    case FreeOutcome::not_mine:
      return free_foreign("cudaFree", current_device(), ptr,
                          [&] { return real::cudaFree()(ptr); });
    default:
      return refuse_free("cudaFree", ptr, freed);
  }
}

// cudaFreeAsync of pooled memory: the program promises that every use of it, on any stream, is
// ordered before the free on `stream`, so under fenced reuse the slice waits for a fence on that
// stream alone (Note [Stream-ordered frees] in pools/memory_manager.cpp). Memory from
// cudaMallocAsync and anything else the pools do not own goes to the real call. On a stream
// whose capture an earlier call invalidated, the free fails with
// cudaErrorStreamCaptureInvalidated and frees nothing, as the plain call does (the program then
// frees the memory some other way). A stream handle the runtime does not know fails it the same
// way (Note [Stream handles]).
cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread) {
  auto real_call = [&] {
    return per_thread ? real::cudaFreeAsync_ptsz()(ptr, stream)
                      : real::cudaFreeAsync()(ptr, stream);
  };
  if (ptr == nullptr) return real_call();
  const int device = current_device();
  const cudaStream_t named = per_thread && stream == nullptr ? cudaStreamPerThread : stream;
  if (const cudaError_t refused = stream_handle_error(named); refused != cudaSuccess)
    return refused;  // Note [Stream handles]
  if (const cudaError_t refused = capture_refusal(named); refused != cudaSuccess) return refused;
  const cudaStream_t ordered_on = named == nullptr ? cudaStreamLegacy : named;
  const pooling::Freed freed =
      release_here(device, ptr, reinterpret_cast<StreamToken>(ordered_on));
  switch (freed.outcome) {
    case FreeOutcome::freed:
      bind_after_own_calls();  // Note [A thread's first call]
      return cudaSuccess;
    case FreeOutcome::not_mine:
      // A free captured into a graph may name a graph memory node's address, which only the
      // graph knows until it runs: no driver query, no refusal (whose real call would break the
      // capture); the real call decides.
      if (capturing(named)) {
        pooling::ForwardedFree forwarded(device, ptr);
        const cudaError_t result = real_call();
        forwarded.finish(result == cudaSuccess);
        return result;
      }
      return free_foreign("cudaFreeAsync", device, ptr, real_call);
    default:
      return refuse_free("cudaFreeAsync", ptr, freed);
  }
}

// Note [Stream-ordered allocations]
// cudaMallocAsync memory comes from the driver's stream-ordered pools, never from ours, but both
// draw on the same device (Note [Room for what the pools do not serve] in pooling.cpp), so a
// cudaMallocAsync the driver refuses for lack of memory gets everything the pools keep for no
// live slice back (MemoryManager::give_back_all(): the fences waited for, bounded) and is tried
// once more; so do pitched allocations and managed ones past the slabs. The failed first try
// left cudaErrorMemoryAllocation in the last-error slot (Note [Last error]), which a successful
// retry must not show: a slot that was clean before is cleared again; a slot that held the
// program's own error cannot be put back, so then the idle pages go back before the first try
// (only when the driver has less free than the request), whose answer is final.
cudaError_t with_room(const std::function<int()>& device_of, std::size_t size,
                      const std::function<cudaError_t()>& real, bool stream_pool) {
  const bool slot_clean = real::cudaPeekAtLastError()() == cudaSuccess;
  pooling::GrowthHold hold;  // Note [Room held for the retry] in pooling.cpp
  if (!slot_clean && driver_short_of(size) &&
      !pooling::beyond_reach(device_of(), size, stream_pool))
    pooling::give_back_idle(device_of(), hold);
  const pooling::ReturnsSince returns;
  const cudaError_t result = real();
  if (result != cudaErrorMemoryAllocation || !slot_clean) return result;
  const int device = device_of();
  // Nothing that comes back could make room: the pools keep their pages, and the refusal comes
  // at once, as the plain call's does (Note [Requests beyond reach] in pooling.cpp).
  if (pooling::beyond_reach(device, size, stream_pool)) return result;
  if (!pooling::give_back_idle(device, hold) && !returns.moved(device)) return result;
  real::cudaGetLastError()();
  return real();
}

cudaError_t with_room(int device, std::size_t size, const std::function<cudaError_t()>& real) {
  return with_room([device] { return device; }, size, real);
}

// Note [Launches short of memory]
// A kernel's first launch loads its module (lazy loading, the default since CUDA 12.2), and a
// launch may need more local memory than the context holds: both take device memory, which the
// pools' idle pages may hold; so does a module or library the program loads. A launch or load
// refused for lack of memory was never queued or loaded, so it is tried once more after the pools
// gave their idle memory back: a launch's from its stream's device (a CUkernel runs in its
// stream's context), a library's load or kernel (a library loads into every context) from the
// current device and then every other, the others from the current device. With lazy loading a
// module's or library's kernels load when the program asks for them (cuModuleGetFunction,
// cuLibraryGetKernel, cuKernelGetFunction, cuFuncLoad), and a kernel, or a module, at its first
// use other than a launch: asking for or setting a kernel's attributes or cache configuration
// (cuFuncGetAttribute, cuFuncSetAttribute, cuFuncSetCacheConfig, the cuKernel forms, which load
// into the device they name), its occupancy (the cuOccupancy calls; the cluster ones take a
// launch's configuration, so its stream's device), a module's or library's variable
// (cuModuleGetGlobal, cuLibraryGetGlobal). The runtime's cudaFuncGetAttributes,
// cudaFuncSetAttribute, occupancy and symbol calls reach the driver through these. All get the
// same. The give-back waits
// only for the fences of frees that were not stream-ordered: memory freed onto a stream the
// program has parked is not free under plain CUDA either, and a launch must not wait 10 s for
// it. As for allocations, a page that reached the driver meanwhile is worth the retry too (Note
// [Room that arrived meanwhile] in pooling.cpp). Through a runtime that reaches the driver's
// launch the driver hook does all that
// (driver_exports.cpp), and the runtime never sees the refusal; launch_again is for one that
// does not. The refusal left cudaErrorMemoryAllocation in the last-error slot, which a
// successful retry must not show, so the slot is cleared then. An error of the program's own
// still waiting there goes with it: asking the slot before every launch, to keep it, would cost
// every launch for the sake of one that may never fail.
// Not covered: a runtime that loads code without these driver calls, graph instantiation, and
// memory freed during a stream capture, whose fences the pools can neither record nor wait for
// then (they give back only what is idle).
cudaError_t launch_again(cudaError_t first, const pooling::ReturnsSince& returns,
                         const std::function<cudaError_t()>& real) {
  const int device = current_device();
  pooling::GrowthHold hold;  // Note [Room held for the retry] in pooling.cpp
  if (!pooling::give_back_idle(device, hold, GiveBackWait::cudafree_fences) &&
      !returns.moved(device))
    return first;
  real::cudaGetLastError()();
  return real();
}

cudaError_t malloc_async(void** ptr, std::size_t size, cudaStream_t stream, bool per_thread) {
  // The memory is the stream's device's, which need not be the current one; asked only when
  // room is needed.
  const auto device_of = [&] {
    const int device = stream_device(stream);
    return device >= 0 ? device : current_device();
  };
  return with_room(
      device_of, size,
      [&] {
        return per_thread ? real::cudaMallocAsync_ptsz()(ptr, size, stream)
                          : real::cudaMallocAsync()(ptr, size, stream);
      },
      true);
}

cudaError_t malloc_pitch(void** ptr, std::size_t* pitch, std::size_t width, std::size_t height) {
  // The size is only weighed against the driver's free memory, with each row padded as the
  // driver pads it (to 512 bytes; less would leave the pools' idle pages where a program whose
  // last-error slot holds an error needs them: Note [Stream-ordered allocations]); a product
  // that overflows is more than any device has.
  constexpr std::size_t kPitchAlignment = 512;
  const std::size_t row = width > SIZE_MAX - (kPitchAlignment - 1)
                              ? SIZE_MAX
                              : (width + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
  const std::size_t size = height != 0 && row > SIZE_MAX / height ? SIZE_MAX : row * height;
  return with_room(current_device(), size,
                   [&] { return real::cudaMallocPitch()(ptr, pitch, width, height); });
}

cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  const int device = current_device();
  const std::uint64_t grown_before = budget::growth_so_far(device);  // before the driver's figure
  const cudaError_t result = real::cudaMemGetInfo()(free_bytes, total_bytes);
  if (result == cudaSuccess)
    pooling::adjust_memory_info(device, grown_before, free_bytes, total_bytes);
  return result;
}

cudaError_t ipc_get_mem_handle(cudaIpcMemHandle_t* handle, void* ptr) {
  // Note [IPC handles] in pooling.cpp.
  if (!pooling::ipc_exportable("cudaIpcGetMemHandle", ptr)) {
    return raise_invalid_value();
  }
  return real::cudaIpcGetMemHandle()(handle, ptr);
}

cudaError_t device_synchronize() {
  pooling::before_device_synchronize(current_device());
  return real::cudaDeviceSynchronize()();
}

cudaError_t device_reset() {
  return static_cast<cudaError_t>(
      pooling::reset_device(current_device(), [] { return real::cudaDeviceReset()(); }));
}

namespace {

cudaError_t track(cudaError_t result, cudaStream_t* stream, unsigned int flags) {
  if (result == cudaSuccess && stream != nullptr) {
    pooling::track_stream(*stream, current_device(), flags);
  }
  return result;
}

}  // namespace

cudaError_t stream_create(cudaStream_t* stream) {
  return track(real::cudaStreamCreate()(stream), stream, cudaStreamDefault);
}

cudaError_t stream_create_with_flags(cudaStream_t* stream, unsigned int flags) {
  return track(real::cudaStreamCreateWithFlags()(stream, flags), stream, flags);
}

cudaError_t stream_create_with_priority(cudaStream_t* stream, unsigned int flags, int priority) {
  return track(real::cudaStreamCreateWithPriority()(stream, flags, priority), stream, flags);
}

cudaError_t stream_destroy(cudaStream_t stream) {
  // A capture still open on the stream ends with it, as failed.
  int capture_device = -1;
  const unsigned long long capture = stream_capture_id(stream, &capture_device);
  pooling::untrack_stream(stream);
  const cudaError_t result = real::cudaStreamDestroy()(stream);
  if (capture != 0) {
    stream_destroyed_while_capturing(stream, capture_device, capture, result == cudaSuccess);
  }
  return result;
}

cudaError_t map_driver_entry(cudaError_t result, void** fn) {
  driver_hooks::map_resolved(result == cudaSuccess, fn);
  return result;
}

}  // namespace poolcuda::hooks
