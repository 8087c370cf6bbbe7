// The pools' side of the hooked calls, shared by the runtime and driver hooks (see pooling.h).
//
// Depends on the registry, the CUDA device, the log and the configuration.
#include "interpose/pooling.h"

#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/registry.h"

namespace poolcuda::pooling {

Route allocate(const char* api, int device, std::size_t size, void** ptr) {
  if (ptr == nullptr || size == 0 || device < 0) return Route::forward;
  Registry& registry = Registry::instance();
  MemoryManager* manager = registry.manager_or_create(device);
  if (manager == nullptr) return Route::forward;
  // Larger than the device: the real call fails cleanly and sets its own error.
  if (size > registry.device(device)->total_bytes()) return Route::forward;

  Reservation reservation = manager->allocate(size);
  // A sticky context error is not checked on a hit: that would cost a CUDA call on every
  // allocation, and the program's next launch or synchronisation reports the error anyway.
  if (reservation.ptr != 0) {
    *ptr = reinterpret_cast<void*>(reservation.ptr);
    return Route::pooled;
  }
  switch (reservation.error.kind) {
    case ErrorKind::out_of_memory:
    case ErrorKind::device_error:
      return Route::forward;  // Note [Last error] in hooks.cpp: the real call's own failure
    case ErrorKind::buffer_too_big:
      // Note [Last error]: not the pools' size, but the driver may well have it.
      if (registry.first_time(Registry::Once::no_pool_accepts, device)) {
        log_format(LogLevel::basic,
                   "device %d: no pool accepts %zu bytes; passing such requests to %s", device,
                   size, api);
      }
      return Route::forward;
    default:
      log_format(LogLevel::basic, "%s(%zu B) on device %d refused: %s", api, size, device,
                 describe(reservation.error).c_str());
      return Route::refused;
  }
}

void count_forwarded_malloc(int device) { Registry::instance().count_forwarded_malloc(device); }

void count_forwarded_free(int device) { Registry::instance().count_forwarded_free(device); }

Freed release(int device, const void* ptr) {
  Registry& registry = Registry::instance();
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  Freed freed;
  freed.owner = device;
  if (MemoryManager* manager = registry.manager(device)) freed.outcome = manager->free(address);
  // A pointer allocated on another device may be freed with any device current.
  for (int other = 0; freed.outcome == FreeOutcome::not_mine && other < Registry::kMaxDevices;
       ++other) {
    if (other == device) continue;
    MemoryManager* manager = registry.manager(other);
    if (manager == nullptr) continue;
    freed.outcome = manager->free(address);
    freed.owner = other;
  }
  return freed;
}

void log_refused_free(const char* api, const void* ptr, const Freed& freed) {
  const char* why = freed.outcome == FreeOutcome::double_free
                        ? "double free"
                        : "not the start of an allocation";
  log_format(LogLevel::basic, "%s(%p) on device %d: %s; nothing changed", api, ptr, freed.owner,
             why);
}

void add_pooled_free(int device, std::size_t* free_bytes, const std::size_t* total_bytes) {
  if (config().memgetinfo != MemGetInfoMode::pooled) return;
  MemoryManager* manager = Registry::instance().manager(device);
  if (manager == nullptr) return;
  // Idle bytes and bytes still waiting for their free fence are both what the next allocation
  // can get (the out-of-memory path waits for pending fences): reserved minus what is in use.
  MemoryUsage usage = manager->memory_usage();
  std::uint64_t used = usage.bytes_in_use + usage.bytes_padding;
  std::uint64_t available = usage.bytes_reserved > used ? usage.bytes_reserved - used : 0;
  std::uint64_t room = total_bytes != nullptr && *total_bytes > *free_bytes
                           ? *total_bytes - *free_bytes
                           : available;
  *free_bytes += static_cast<std::size_t>(available < room ? available : room);
}

void forget_device(int device) {
  Registry& registry = Registry::instance();
  // The reset frees every allocation and destroys every stream and event of the device: the
  // pools forget theirs instead of releasing them.
  if (MemoryManager* manager = registry.manager(device)) {
    manager->forget();
    registry.device(device)->forget_events();
  }
  registry.streams().forget_device(device);
}

void track_stream(cudaStream_t stream, int device, unsigned int flags) {
  if (stream != nullptr && device >= 0) Registry::instance().streams().add(stream, device, flags);
}

void untrack_stream(cudaStream_t stream) {
  Registry& registry = Registry::instance();
  // Out of the table first: no fence may be recorded on it once the real destroy has run. Its
  // queued work still runs after the destroy, so later fences wait for its tail (Note
  // [Destroyed streams] in cuda_device.cpp); under the table's lock, so that no fence falls
  // between the removal and the tail.
  auto table = registry.streams().lock();
  TrackedStream removed;
  if (registry.streams().remove_locked(stream, &removed) &&
      config().free_fence == FreeFence::events) {
    if (CudaDevice* device = registry.device(removed.device)) device->adopt_stream_tail(stream);
  }
}

}  // namespace poolcuda::pooling
