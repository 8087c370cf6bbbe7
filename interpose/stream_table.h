// The streams the program created, as the stream hooks see them: which device each belongs to
// and whether it is non-blocking. Free fences need one event per live non-blocking stream and
// must know every stream to check for open captures (Note [Fence streams] in cuda_device.cpp).
// A stream leaves the table before the real cudaStreamDestroy runs, and a fence holds the
// table's lock while it records, so no event is recorded on a stream destroyed through the
// hooks. A stream destroyed behind their back (cuStreamDestroy, a primary-context reset) stays
// until a fence finds its handle invalid and drops it (Note [Stale streams] in cuda_device.cpp).
//
// Depends on the CUDA runtime header only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "pools/lock_order.h"

namespace poolcuda {

struct TrackedStream {
  cudaStream_t stream = nullptr;
  int device = 0;
  bool non_blocking = false;
  // Which creation this is: a later stream given a destroyed one's handle gets another number.
  std::uint64_t serial = 0;
};

class StreamTable {
 public:
  // A handle already in the table (the runtime reused the value of a stream destroyed behind
  // the hooks' back) is replaced, never listed twice.
  void add(cudaStream_t stream, int device, unsigned int flags);
  // False when the stream was not tracked (created before the library loaded, or twice
  // destroyed): the real destroy still runs.
  bool remove(cudaStream_t stream);
  // remove() with lock() already held; the entry removed is copied to *removed.
  bool remove_locked(cudaStream_t stream, TrackedStream* removed);
  // cudaDeviceReset destroyed every stream of the device.
  void forget_device(int device);

  // Holds the table while a fence is checked and recorded.
  std::unique_lock<RankedMutex> lock() { return std::unique_lock<RankedMutex>(mutex_); }
  // Only with lock() held.
  const std::vector<TrackedStream>& streams() const { return streams_; }

  std::size_t size();

 private:
  RankedMutex mutex_{LockRank::stream_table};
  std::vector<TrackedStream> streams_;
  std::uint64_t next_serial_ = 1;  // under mutex_
};

}  // namespace poolcuda
