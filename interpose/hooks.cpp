// The hooked calls' logic (see hooks.h).
//
// Note [Last error]
// The runtime keeps a per-thread "last error" that cudaGetLastError returns and clears. The
// pools' own device calls leave it as they found it (Note [Own calls] in cuda_device.cpp), so
// an allocation that succeeded after trimming shows the program no error. When the pools give
// up on an out-of-memory, the request goes to the real cudaMalloc one last time: it fails as
// the real library would and leaves exactly the last error the real library leaves (or, if
// memory came free meanwhile, it succeeds and the memory is simply not pooled). A size no
// configured pool accepts (a custom layout that does not cover every size) is no reason to
// refuse what the driver would give: it goes to the real cudaMalloc too, and its pointer to the
// real cudaFree later, since no pool owns it. A capped pool that is full with nothing behind it
// is a deliberate budget: that refusal has no real call to mirror, so it raises
// cudaErrorMemoryAllocation in the slot with a real cudaMalloc of a size no device has. A
// refused cudaFree raises cudaErrorInvalidValue the same way.
//
// Depends on the registry, the CUDA device, the real-function table, the log and the
// configuration.
#include "interpose/hooks.h"

#include "interpose/budget.h"
#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/real_cuda.h"
#include "interpose/registry.h"
#include "interpose/release_worker.h"
#include "interpose/stream_order.h"

namespace poolcuda::hooks {

namespace {

// Larger than any device; a real cudaMalloc of it fails with cudaErrorMemoryAllocation.
constexpr std::size_t kImpossibleSize = std::size_t{1} << 52;

// The device current on the calling thread, or -1.
int current_device() {
  int device = -1;
  if (real::cudaGetDevice()(&device) != cudaSuccess) return -1;
  return device;
}

void raise_out_of_memory();

// A request the pools do not serve goes to the driver, within the device's budget (Note
// [Budget] in budget.cpp).
cudaError_t forward_malloc(int device, void** ptr, std::size_t size) {
  if (PassthroughCounters* counters = Registry::instance().passthrough(device))
    counters->mallocs.fetch_add(1, std::memory_order_relaxed);
  if (ptr == nullptr || size == 0) return real::cudaMalloc()(ptr, size);
  if (!budget::charge(device, size)) {
    raise_out_of_memory();
    return cudaErrorMemoryAllocation;
  }
  const cudaError_t result = real::cudaMalloc()(ptr, size);
  if (result == cudaSuccess) {
    budget::passed_through(device, *ptr, size);
  } else {
    budget::uncharge(device, size);
  }
  return result;
}

// The driver frees a pointer the pools do not own.
cudaError_t forward_free(void* ptr) {
  const cudaError_t result = real::cudaFree()(ptr);
  if (result == cudaSuccess && ptr != nullptr) budget::freed_through(ptr);
  return result;
}

void count_forwarded_free(Registry& registry, int device) {
  if (PassthroughCounters* counters = registry.passthrough(device))
    counters->frees.fetch_add(1, std::memory_order_relaxed);
}

void raise_out_of_memory() {
  void* ptr = nullptr;
  if (real::cudaMalloc()(&ptr, kImpossibleSize) == cudaSuccess) real::cudaFree()(ptr);
}

// A refused free (double free, interior pointer) leaves cudaErrorInvalidValue in the last-error
// slot, as the real cudaFree of a pointer that starts no allocation does: the real call on an
// address that is certainly no device allocation (this host variable) fails the same way and
// touches nothing.
void raise_invalid_value() {
  static char not_device_memory;
  real::cudaFree()(&not_device_memory);
}

// Refusals the pools decide themselves (the manager logs device out-of-memory breakdowns).
void log_refusal(int device, std::size_t size, const Error& error) {
  log_format(LogLevel::basic, "cudaMalloc(%zu B) on device %d refused: %s", size, device,
             describe(error).c_str());
}

}  // namespace

cudaError_t malloc(void** ptr, std::size_t size) {
  int device = current_device();
  // NULL, size 0 and an unusable device behave exactly as the real call does.
  if (ptr == nullptr || size == 0 || device < 0) return forward_malloc(device, ptr, size);
  Registry& registry = Registry::instance();
  MemoryManager* manager = registry.manager_or_create(device);
  if (manager == nullptr) return forward_malloc(device, ptr, size);
  // Larger than the device: the real call fails cleanly and sets its own error.
  if (size > registry.device(device)->total_bytes()) return forward_malloc(device, ptr, size);

  CapturePolicy& capture = *registry.capture(device);
  if (capture.releases_pending()) capture.drain_releases();  // Note [Graph lifetimes]
  Reservation reservation = capture.open() ? capture.allocate(size) : manager->allocate(size);
  // A sticky context error is not checked on a hit: that would cost a runtime call on every
  // allocation, and the program's next launch or synchronisation reports the error anyway.
  if (reservation.ptr != 0) {
    *ptr = reinterpret_cast<void*>(reservation.ptr);
    return cudaSuccess;
  }
  switch (reservation.error.kind) {
    case ErrorKind::out_of_memory:
    case ErrorKind::device_error:
      // Note [Last error]: the real call's own failure is the answer.
      return forward_malloc(device, ptr, size);
    case ErrorKind::buffer_too_big:
      // Note [Last error]: not the pools' size, but the driver may well have it.
      if (registry.first_time(Registry::Once::no_pool_accepts, device)) {
        log_format(LogLevel::basic,
                   "device %d: no pool accepts %zu bytes; passing such requests to cudaMalloc",
                   device, size);
      }
      return forward_malloc(device, ptr, size);
    default:
      log_refusal(device, size, reservation.error);
      raise_out_of_memory();
      return cudaErrorMemoryAllocation;
  }
}

namespace {

// A pooled pointer goes back to its manager; anything else answers `not_mine`. `device` is the
// current one, tried first; a pointer allocated on another device may be freed with any device
// current. *owner is the device whose manager answered.
FreeOutcome free_on(Registry& registry, int device, DevicePtr address) {
  MemoryManager* manager = registry.manager(device);
  if (manager == nullptr) return FreeOutcome::not_mine;
  CapturePolicy& capture = *registry.capture(device);
  if (capture.releases_pending()) capture.drain_releases();  // Note [Graph lifetimes]
  return capture.routes_frees() ? capture.free(address) : manager->free(address);
}

FreeOutcome free_pooled(Registry& registry, int device, void* ptr, int* owner) {
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  FreeOutcome outcome = free_on(registry, device, address);
  *owner = device;
  for (int other = 0; outcome == FreeOutcome::not_mine && other < Registry::kMaxDevices;
       ++other) {
    if (other == device) continue;
    outcome = free_on(registry, other, address);
    *owner = other;
  }
  return outcome;
}

// The answer to a pooled free that changed nothing (Note [Last error]).
cudaError_t refuse_free(const char* call, void* ptr, int owner, FreeOutcome outcome) {
  const char* why = outcome == FreeOutcome::double_free ? "double free"
                    : outcome == FreeOutcome::interior_pointer
                        ? "not the start of an allocation"
                        : "lies in pooled free memory but was never handed out";
  log_format(LogLevel::basic, "%s(%p) on device %d: %s; nothing changed", call, ptr, owner, why);
  raise_invalid_value();
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t free(void* ptr) {
  int device = current_device();
  Registry& registry = Registry::instance();
  if (ptr == nullptr) {
    count_forwarded_free(registry, device);
    return real::cudaFree()(ptr);
  }
  int owner = device;
  const FreeOutcome outcome = free_pooled(registry, device, ptr, &owner);
  switch (outcome) {
    case FreeOutcome::freed:
      return cudaSuccess;
    case FreeOutcome::not_mine:
      count_forwarded_free(registry, device);
      return forward_free(ptr);
    default:
      return refuse_free("cudaFree", ptr, owner, outcome);
  }
}

// cudaFreeAsync of pooled memory: the program promises that no work ordered after the free on
// `stream` uses it; work ordered before it is exactly what a free fence waits for (the fence of
// the epoch the slice joins is recorded later, on the streams Note [Fence streams] names), so
// the slice takes the same path as a cudaFree. Memory from cudaMallocAsync and anything else
// the pools do not own goes to the real call.
cudaError_t free_async(void* ptr, cudaStream_t stream, bool per_thread) {
  auto real_call = [&] {
    return per_thread ? real::cudaFreeAsync_ptsz()(ptr, stream)
                      : real::cudaFreeAsync()(ptr, stream);
  };
  if (ptr == nullptr) return real_call();
  Registry& registry = Registry::instance();
  int owner = -1;
  const FreeOutcome outcome = free_pooled(registry, current_device(), ptr, &owner);
  switch (outcome) {
    case FreeOutcome::freed:
      return cudaSuccess;
    case FreeOutcome::not_mine: {
      const cudaError_t result = real_call();
      if (result == cudaSuccess) budget::freed_through(ptr);
      return result;
    }
    default:
      return refuse_free("cudaFreeAsync", ptr, owner, outcome);
  }
}

cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  cudaError_t result = real::cudaMemGetInfo()(free_bytes, total_bytes);
  if (result != cudaSuccess || free_bytes == nullptr) return result;
  const int device = current_device();
  MemoryManager* manager = Registry::instance().manager(device);
  // Only whole idle pages: the out-of-memory path returns them to the driver, so a request of
  // any size can really get them. Free space inside pages that live slices keep (holes) serves
  // only requests that fit a hole, so counting it would let cudaMalloc(reported free) fail.
  const std::uint64_t idle = manager != nullptr ? manager->idle_bytes() : 0;
  if (config().memgetinfo == MemGetInfoMode::pooled && idle != 0) {
    const std::uint64_t room = total_bytes != nullptr && *total_bytes > *free_bytes
                                   ? *total_bytes - *free_bytes
                                   : idle;
    *free_bytes += static_cast<std::size_t>(idle < room ? idle : room);
  }
  budget::adjust_memory_info(device, idle, free_bytes, total_bytes);
  return result;
}

// Note [Device reset]
// ~~~~~~~~~~~~~~~~~~~
// cudaDeviceReset frees every allocation and destroys every stream and event of the device:
// the pools forget theirs instead of releasing them (MemoryManager::forget). Other threads may
// allocate and free on the device meanwhile (CUDA leaves that race undefined; plain programs
// survive it), so the manager is frozen from before the first forget to after the reset: it
// takes no new page from the driver (such a page could be freed by the reset and its address
// handed out again by the driver while the pools still hold it: two pages at one address), and
// requests it cannot serve from memory it already has go to the real cudaMalloc, unpooled, as
// they would without the library. Whatever it handed out from its own memory after the first
// forget is forgotten again after the reset. Every manager operation is atomic under its lock,
// so whatever the order the pools stay consistent. The release worker never frees a page of
// the device from the first forget to the end of the reset (its address may already belong to
// someone else), and the device's event caches drop every event from before the reset.
cudaError_t device_reset() {
  int device = current_device();
  Registry& registry = Registry::instance();
  // Created now if it does not exist yet, so that no racing first allocation can create an
  // unfrozen one during the reset.
  MemoryManager* manager = registry.manager_or_create(device);
  auto forget = [&] {
    if (manager != nullptr) {
      manager->forget();
      registry.capture(device)->forget();
      registry.device(device)->forget_events();
      registry.device(device)->captures_forgotten();
    }
    registry.streams().forget_device(device);
  };
  if (manager != nullptr) manager->set_frozen(true);
  ReleaseWorker::instance().begin_reset(device);
  forget();
  const cudaError_t result = real::cudaDeviceReset()();
  forget();
  budget::forget_device(device);
  ReleaseWorker::instance().end_reset(device);
  if (manager != nullptr) manager->set_frozen(false);
  return result;
}

namespace {

cudaError_t track(cudaError_t result, cudaStream_t* stream, unsigned int flags) {
  if (result == cudaSuccess && stream != nullptr) {
    const int device = current_device();
    Registry::instance().streams().add(*stream, device, flags);
    stream_order::stream_created(device, *stream, (flags & cudaStreamNonBlocking) != 0);
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
  Registry& registry = Registry::instance();
  // A capture still open on the stream ends with it, as failed.
  int capture_device = -1;
  const unsigned long long capture = stream_capture_id(stream, &capture_device);
  {
    // Out of the table first: no fence may be recorded on it once the real destroy has run.
    // Its queued work still runs after the destroy, so later fences wait for its tail (Note
    // [Destroyed streams] in cuda_device.cpp); under the table's lock, so that no fence falls
    // between the removal and the tail.
    auto table = registry.streams().lock();
    TrackedStream removed;
    if (registry.streams().remove_locked(stream, &removed) &&
        (config().free_fence == FreeFence::events ||
         config().free_fence == FreeFence::automatic)) {
      if (CudaDevice* device = registry.device(removed.device)) device->adopt_stream_tail(stream);
    }
  }
  const cudaError_t result = real::cudaStreamDestroy()(stream);
  if (capture != 0) stream_destroyed_while_capturing(stream, capture_device, capture);
  return result;
}

}  // namespace poolcuda::hooks
