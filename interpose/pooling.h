// What the pools do for an allocation, a free, a memory query, a device reset and the creation
// and destruction of streams, whichever layer asked: the runtime hooks (hooks.cpp) and the driver
// hooks (driver_hooks.cpp) share one set of per-device managers and one stream table, so a
// pointer from cudaMalloc may be freed with cuMemFree and the reverse. Callers pass the device
// (the runtime's current device, or the device of the current primary context); these functions
// answer in the pools' terms and leave the CUDA error codes and the real calls to the caller.
//
// Depends on the registry, the CUDA device, the log and the configuration.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "pools/types.h"

namespace poolcuda::pooling {

enum class Route {
  pooled,   // *ptr is a pooled allocation
  forward,  // the real allocator answers (size 0, no pools for the device, too large, no pool
            // accepts the size, out of memory after the pools' own recovery)
  refused,  // a capped pool is full: out of memory without asking the driver (logged)
};

// `api` names the call in log lines ("cudaMalloc", "cuMemAlloc").
Route allocate(const char* api, int device, std::size_t size, void** ptr);

// Counts a real allocation or free made on the program's behalf without a pool.
void count_forwarded_malloc(int device);
void count_forwarded_free(int device);

struct Freed {
  FreeOutcome outcome = FreeOutcome::not_mine;
  int owner = -1;  // the device whose pools own the pointer
};

// Returns `ptr` to the pools that own it: `device`'s first, then every other device's (a pointer
// may be freed with any device current). not_mine: the real free answers.
Freed release(int device, const void* ptr);

// Logs a refused free (double free, interior pointer), naming `api`.
void log_refused_free(const char* api, const void* ptr, const Freed& freed);

// memgetinfo:pooled: adds to *free_bytes what `device`'s pools hold but nobody uses.
void add_pooled_free(int device, std::size_t* free_bytes, const std::size_t* total_bytes);

// A device reset (cudaDeviceReset, cuDevicePrimaryCtxReset, the last release of the primary
// context) freed its memory and destroyed its streams and events: the pools forget them.
void forget_device(int device);

// Streams enter the table when created (in a device's primary context) and leave it just before
// the real destroy (Note [Destroyed streams] in cuda_device.cpp).
void track_stream(cudaStream_t stream, int device, unsigned int flags);
void untrack_stream(cudaStream_t stream);

}  // namespace poolcuda::pooling
