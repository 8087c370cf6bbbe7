// Snapshot types of a manager's state, and the one emitter that renders snapshots as text or
// JSON. Snapshots are plain values taken under the manager's lock; rendering happens outside
// it (DESIGN.md decision 10), so formatting never delays an allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pools/options.h"
#include "pools/types.h"

namespace poolcuda {

struct PoolReport {
  std::string kind;   // "sliced", "exclusive", "direct", "persistent"
  std::string shape;  // human summary, e.g. "page=64MiB slice<=16MiB cap=1GiB"
  std::uint64_t page_size = 0;       // sliced: page size; others 0
  std::uint64_t max_slice_size = 0;  // largest request the pool accepts (0 = any)
  std::uint64_t cap = 0;             // 0 = uncapped
  std::uint64_t pages = 0;           // device allocations held now
  std::uint64_t slices = 0;          // live slices now
  MemoryUsage usage;
  std::uint64_t pages_peak = 0;      // high-water mark of `pages` since the layout was built
  std::uint64_t bytes_peak = 0;      // high-water mark of usage.bytes_reserved
  std::uint64_t largest_free = 0;    // largest contiguous free fragment, bytes
  std::uint64_t reservations = 0;    // reservations this pool served
  std::uint64_t device_allocs = 0;   // Device::allocate calls that succeeded
  std::uint64_t device_releases = 0; // Device::release calls
};

struct ManagerReport {
  int device = 0;
  std::vector<PoolReport> dynamic;  // in routing order
  PoolReport persistent;
  MemoryUsage totals;               // dynamic + persistent
  std::uint64_t pending_fence_bytes = 0;  // freed, waiting for their free fence
  std::uint64_t idle_bytes = 0;           // reserved, not in use, not pending
  std::uint64_t oom_recoveries = 0;       // allocations that succeeded after trimming
  std::uint64_t oom_failures = 0;         // allocations that failed after trimming
  std::uint64_t bytes_in_use_peak = 0;    // most bytes in use at once (since the layout was built)
  std::uint64_t bytes_reserved_peak = 0;  // most bytes reserved at once (same period)
  std::uint64_t fence_waits = 0;          // allocations that waited for an old free fence
  std::uint64_t fence_wait_timeouts = 0;  // of those, waits that hit their time bound
  // Real cudaMalloc / cudaFree calls the interposer passed through without a pool (size 0, NULL,
  // foreign pointers, requests larger than the device), counted per current device. Filled by
  // the interposer; 0 elsewhere.
  std::uint64_t forwarded_mallocs = 0;
  std::uint64_t forwarded_frees = 0;
};

struct ReportHeader {
  long pid = 0;
  std::uint64_t sequence = 0;   // 1 for the first report of the process
  std::string reason;           // "signal", "exit", "request"
};

// Renders every manager's report. JSON output is one valid JSON object.
std::string render_report(const ReportHeader& header, const std::vector<ManagerReport>& managers,
                          ReportFormat format);

}  // namespace poolcuda
