// The release worker: threads of the library's own, one per device, that hand pages the pools
// gave up back to the driver (Note [Release worker] in release_worker.cpp). The real cudaFree
// synchronizes the device, so it must never run on a thread that is allocating: a program may
// park a stream on a host function that only the allocating thread will release.
//
// Depends on the real-function table and OwnCallScope; knows nothing of the pools.
#pragma once

#include <atomic>
#include <cstdint>

#include "pools/wait_bound.h"

namespace poolcuda {

class ReleaseWorker {
 public:
  // Devices 0 to kMaxDevices - 1 may have a lane (the registry pools no others): made by
  // add_lane(), or by the first release, flush, capture or reset call of the device that needs
  // one.
  static constexpr int kMaxDevices = 64;

  // The one worker of the process (allocated once, never destroyed; a device's thread starts at
  // its first release).
  static ReleaseWorker& instance();

  // Makes `device`'s lane, when it has none: the registry calls it before the device gets its
  // pools, so that the device's first release or flush does not pay for making it.
  void add_lane(int device);

  // Queues `ptr`, an allocation of `size` bytes of `device` from the real cudaMalloc, for the
  // real cudaFree. Returns at once. A device out of range (it never has a lane) has its page
  // freed now, on the calling thread.
  void release(int device, void* ptr, std::uint64_t size);

  // Waits at most `max_microseconds` until every page of `device` queued before the call has
  // reached the driver; true when it has. Pages held back (a free the driver refused for a
  // capture, a reset under way) count as not yet released.
  bool flush(int device, std::uint32_t max_microseconds);

  // A capture ended: pages held back may go now.
  void wake();

  // A stream capture is about to begin on `device` (Note [Releases during capture]): no page of
  // the device starts its driver free until capture_begun(), and a free already inside the
  // driver is waited for, at most `max_microseconds`.
  void capture_beginning(int device, std::uint32_t max_microseconds);
  void capture_begun(int device);

  // cudaDeviceReset frees every allocation of the device, so its pages must never reach the
  // driver's free afterwards: the address may belong to a new allocation by then. begin_reset
  // drops the device's queued pages, waits for a free of the device in flight to finish, and
  // holds back any page of the device queued until end_reset, which drops them too (they were
  // allocated before the reset and are gone with it). Note [Device reset] in pooling.cpp.
  void begin_reset(int device);
  void end_reset(int device);

  // True while `ptr` is a page queued or held back, or being freed and the foreign free with
  // `ticket` registered before that free began: the library's memory, not the program's (Note
  // [Foreign frees] in foreign_frees.cpp).
  bool owns(const void* ptr, std::uint64_t ticket) const;

  // True while `ptr` lies in a page queued, held back or being freed: memory the program freed,
  // on its way to the driver, which still counts it as allocated. (Once the driver has freed a
  // page it may hand the address out before the free returns: in that moment a new allocation
  // there is answered as this page.)
  bool holds(const void* ptr) const;

  // Waits, within `bound`, while a driver free of the page at `ptr` that began before the
  // foreign free with `ticket` registered is under way (it may wait for the device): false when
  // the bound ran out first (Note [Foreign frees] in foreign_frees.cpp).
  bool wait_while_freeing(const void* ptr, std::uint64_t ticket, WaitBound& bound) const;

  // Bytes of `device` queued, held back or being freed now: memory the driver will get back.
  std::uint64_t waiting_bytes(int device) const;

  // Bytes of `device` queued now, whose driver free has not begun: the driver still counts
  // them as allocated (Note [Memory on its way to the driver] in pooling.cpp). Pages held back
  // are left out, also once queued again: while a capture is open the driver may refuse them
  // again.
  std::uint64_t queued_bytes(int device) const;

  // The ticket of `device`'s page inside the driver's free now (every page queued gets a new
  // one), or 0 when none is.
  std::uint64_t in_flight(int device) const;

  // How many pages the driver has taken back from every lane so far: a call the driver refused
  // for lack of memory may find room once this moved (Note [Room that arrived meanwhile] in
  // pooling.cpp). One atomic load.
  static std::uint64_t pages_returned() { return returned_.load(std::memory_order_acquire); }

  struct State;  // release_worker.cpp

 private:
  friend struct ReleaseLane;
  static inline std::atomic<std::uint64_t> returned_{0};

  ReleaseWorker() = default;
  State& state() const;
};

}  // namespace poolcuda
