// The MemoryManager's private state, shared by memory_manager.cpp (routing, free path, fences,
// out-of-memory) and manager_inspect.cpp (reports and consistency checks). Not a public header:
// only those two files include it.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "pools/free_fences.h"
#include "pools/memory_manager.h"
#include "pools/page_pools.h"
#include "pools/pool.h"
#include "pools/slice_index.h"

namespace poolcuda {

// The most a reservation waits, in total, for fences when fence-pending bytes exceed their bound
// (Note [Free fences]). Long enough for a device that merely lags the host to reach the oldest
// fence, so memory stays bounded in the usual case; short enough that a fence which cannot pass
// while the allocating thread waits (its stream parked by a host function only that thread
// releases) never deadlocks it. At worst, when fences never pass, the bound throttles growth to
// one page (or one allocation) per kFenceWaitBoundMicros.
inline constexpr std::uint32_t kFenceWaitBoundMicros = 2000;

struct MemoryManager::Impl {
  Impl(Device& d, const ManagerOptions& o);

  // --- memory_manager.cpp --------------------------------------------------------------------
  void build_pools(const PoolLayout& layout);
  void drop_everything();  // forget(): no device call but fence_destroy
  Slice* route(std::uint64_t size, Error* error, AllocStatus* status);
  bool reclaim_on_miss(bool* refused);  // *refused: the open epoch could not be closed
  std::uint64_t fence_limit() const;     // the bound on fence-pending bytes
  // Bytes after which the open epoch closes even below fence_batch frees: a quarter of
  // fence_slack, so several epochs fit under the bound, but at least 1 MiB, so that a tiny
  // slack does not record a fence per free.
  std::uint64_t epoch_bytes() const {
    return std::max<std::uint64_t>(options.fence_slack / 4, MiB);
  }
  // When over the bound, waits for the oldest closed epoch at most *budget_us (what is left of
  // kFenceWaitBoundMicros for this reservation) and takes the time spent from it.
  bool wait_over_limit(std::uint32_t* budget_us);
  void retire(Slice* slice);  // live/held -> pending or free, by the fence mode
  void close_epoch();
  bool drain();
  void recover_from_oom();
  std::uint64_t cleanup_all(bool explicit_cleanup);
  void implicit_cleanup();
  FreeOutcome classify(DevicePtr ptr) const;
  void log(LogLevel level, const std::string& message) const;
  MemoryUsage usage() const;
  std::uint64_t pending() const;
  std::uint64_t idle() const;        // bytes of whole idle pages
  std::uint64_t free_bytes() const;  // every free byte, idle pages and holes in used pages

  Device& device;
  ManagerOptions options;
  std::uint64_t total_memory = 0;
  mutable std::mutex mutex;
  PoolContext ctx;
  std::unique_ptr<PersistentPool> persistent;
  std::vector<std::unique_ptr<Pool>> pools;
  std::vector<bool> capacity_warned;
  SliceIndex index;
  FenceQueue fences;
  std::uint64_t windows = 0;  // open persistent windows
  std::uint64_t generation = 1;  // bumped by forget(): invalidates RetainedSlice handles
  std::uint64_t oom_recoveries = 0;
  std::uint64_t oom_failures = 0;
  std::uint64_t fence_waits = 0;  // waits for the bound on fence-pending bytes
  std::uint64_t fence_wait_timeouts = 0;  // of those, the ones whose bound expired first
  double fence_wait_seconds = 0;          // time spent in those waits
};

}  // namespace poolcuda
