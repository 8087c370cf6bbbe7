// Snapshots of a manager's state (taken under its lock by MemoryManager::report()) and their
// place in the report model (report_tree.h). Every number is declared once, in the X-macro
// lists below: the list gives the struct member, its JSON key, its text label, its unit and
// where it shows; describe() turns a snapshot into a report section from the same lists, so a
// new counter is one line here plus the code that fills it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "pools/report_tree.h"
#include "pools/types.h"

namespace poolcuda {

// How a unit is stored in a snapshot.
template <Unit>
struct UnitStorage {
  using type = std::uint64_t;
};
template <>
struct UnitStorage<Unit::seconds> {
  using type = double;
};
template <>
struct UnitStorage<Unit::ratio> {
  using type = double;
};

// One pool: X(member, label, unit, detail). Exact configuration echoes show in JSON only.
#define POOLCUDA_POOL_NUMBERS(X)                          \
  X(page_size, "page", bytes, json)                       \
  X(max_slice_size, "largest request", bytes, json)       \
  X(cap, "cap", bytes, json)                              \
  X(pages, "pages", count, normal)                        \
  X(pages_peak, "peak pages", count, wide)                \
  X(slices, "slices", count, wide)                        \
  X(bytes_reserved, "reserved", bytes, normal)            \
  X(bytes_in_use, "in use", bytes, normal)                \
  X(bytes_padding, "padding", bytes, normal)              \
  X(bytes_pending, "pending", bytes, wide)                \
  X(bytes_peak, "peak reserved", bytes, wide)             \
  X(largest_free, "largest free", bytes, normal)          \
  X(reservations, "served", count, wide)                  \
  X(device_allocs, "allocs", count, wide)                 \
  X(device_releases, "releases", count, wide)             \
  X(stale_releases, "stale released", count, wide)        \
  X(pages_borrowed, "borrowed", count, wide)              \
  X(pages_lent, "lent", count, wide)                      \
  X(capacity_spills, "spilled", count, wide)              \
  X(capacity_refusals, "refused", count, wide)

struct PoolReport {
  std::string kind;   // "sliced", "exclusive", "split", "direct", "persistent"
  std::string shape;  // what decides the pool's requests, e.g. "page=64MiB slice<=16MiB"
  std::string notes;  // the rest of its configuration, e.g. "period=5000" (wide text, JSON)
#define POOLCUDA_MEMBER(member, label, unit, detail) \
  UnitStorage<Unit::unit>::type member = {};
  POOLCUDA_POOL_NUMBERS(POOLCUDA_MEMBER)
};

// The whole device: X(group, member, label, unit, detail). The group names the text line (and
// the JSON object) the number belongs to.
#define POOLCUDA_MANAGER_NUMBERS(X)                                          \
  X(memory, bytes_in_use, "in use", bytes, normal)                           \
  X(memory, slices, "slices", count, normal)                                 \
  X(memory, bytes_padding, "padding", bytes, normal)                         \
  X(memory, bytes_reserved, "reserved", bytes, normal)                       \
  X(memory, idle_bytes, "idle pages", bytes, normal)                         \
  X(memory, pending_fence_bytes, "pending fence", bytes, normal)             \
  X(memory, hole_bytes, "free in used pages", bytes, normal)                 \
  X(peaks, bytes_in_use_peak, "in use", bytes, normal)                       \
  X(peaks, bytes_reserved_peak, "reserved", bytes, normal)                   \
  X(fences, fence_waits, "waits", count, normal)                             \
  X(fences, fence_wait_timeouts, "at the time bound", count, normal)         \
  X(fences, fence_wait_seconds, "time waiting", seconds, normal)             \
  X(out_of_memory, oom_recoveries, "recovered", count, normal)               \
  X(out_of_memory, oom_failures, "failed", count, normal)                    \
  X(out_of_memory, oom_growth_waits, "growths waited", count, normal)        \
  X(out_of_memory, cap_refusals, "refused at a cap", count, normal)          \
  X(held, held_released_bytes, "given back", bytes, normal)                 \
  X(held, held_overruns, "growths past it", count, normal)                  \
  X(held, held_early_growths, "growths before those arrived", count, normal) \
  X(given_back, give_backs, "times", count, normal)                          \
  X(given_back, give_back_timeouts, "at the time bound", count, normal)      \
  X(thread_caches, thread_caches, "caches", count, normal)                   \
  X(thread_caches, thread_parked_bytes, "parked", bytes, normal)             \
  X(thread_caches, thread_cache_hits, "reused", count, normal)               \
  X(shards, shards, "made", count, normal)                                   \
  X(shards, shard_limit, "at most", count, normal)

// Live slices by requested size: bucket i holds sizes in (2^(i-1), 2^i].
inline constexpr std::size_t kSizeBuckets = 64;
struct SizeHistogram {
  std::array<std::uint64_t, kSizeBuckets> slices{};
  std::array<std::uint64_t, kSizeBuckets> bytes{};
  static std::size_t bucket(std::uint64_t size) {
    return size <= 1 ? 0 : static_cast<std::size_t>(64 - __builtin_clzll(size - 1));
  }
};

struct ManagerReport {
  int device = 0;
  // How a freed slice becomes reusable now: "ordered" (at once, free_fence:auto while the
  // device's work is one ordered queue), "fenced" (after its fence events), "synchronized"
  // (after a device synchronize) or "unfenced" (at once, free_fence:none).
  std::string reuse;
  std::vector<PoolReport> dynamic;  // in routing order
  PoolReport persistent;
  SizeHistogram live_sizes;
#define POOLCUDA_GROUPED_MEMBER(group, member, label, unit, detail) \
  UnitStorage<Unit::unit>::type member = {};
  POOLCUDA_MANAGER_NUMBERS(POOLCUDA_GROUPED_MEMBER)
#undef POOLCUDA_GROUPED_MEMBER
};
#undef POOLCUDA_MEMBER

// The report section of one device: its numbers by group, the pool table (dynamic pools in
// routing order, then the persistent pool as "P") and the live-size histogram.
ReportSection describe(const ManagerReport& manager);

// The summary line over several devices: totals now, peaks summed, and the overhead (peak
// reserved / peak in use).
ReportSection summarize(const std::vector<ManagerReport>& managers);

// A whole document from manager snapshots alone (the interposer adds its own sections to each
// device before rendering; see interpose/reporter.cpp).
ReportDocument make_document(const ReportHeader& header,
                             const std::vector<ManagerReport>& managers);

// make_document + render.
std::string render_report(const ReportHeader& header, const std::vector<ManagerReport>& managers,
                          ReportFormat format);

}  // namespace poolcuda
