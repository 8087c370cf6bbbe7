// The option vocabulary the engine is built from: pool kinds and their specifications, layouts,
// the persistent, free-fence and log settings, and the limits a layout must respect. Plain
// values with no grammar: the POOLCUDA_CONF parser (config/) produces them, the engine (pools/)
// consumes them, and neither needs the other's code. Also format_size, the one way a byte
// count is written back in configuration syntax (pool shapes in reports, describe_config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pools/types.h"

namespace poolcuda {

// The library's held bound unless POOLCUDA_CONF says otherwise (`hold`), in hundredths: 1.5
// times the most bytes in use (Note [Held memory bound] in memory_manager.cpp).
inline constexpr std::uint32_t kDefaultHoldPercent = 150;

enum class PersistentMode : std::uint8_t { enabled, size_match, disabled, enforced };
// automatic: immediate reuse while the device's work is one ordered queue, fences otherwise
// (Note [Stream-ordered reuse] in interpose/stream_order.cpp); events: always fences; sync: a
// device-wide synchronize per free; none: immediate reuse, always.
enum class FreeFence : std::uint8_t { automatic, events, sync, none };
enum class LogLevel : std::uint8_t { off, basic, full };
enum class ReportFormat : std::uint8_t { text, wide, json };

enum class PoolKind : std::uint8_t { sliced, exclusive, split, direct };

// One dynamic pool as configured. Fields a kind does not use stay 0 / nullopt.
struct PoolSpec {
  PoolKind kind = PoolKind::sliced;
  // sliced: page size, largest slice it accepts (defaults to the page), optional cap on the
  // bytes the pool may reserve.
  std::uint64_t page_size = 0;
  std::uint64_t max_slice_size = 0;
  std::optional<std::uint64_t> cap;
  // exclusive and split: largest allocation it accepts.
  std::uint64_t max_alloc_size = 0;
  // direct: reserved bytes above which idle allocations are released.
  std::uint64_t reclaim_at = 0;
  // sliced, exclusive and split: reservations of disuse after which an idle page is released.
  std::optional<std::uint64_t> dealloc_period;

  friend bool operator==(const PoolSpec&, const PoolSpec&) = default;
};

enum class PoolPreset : std::uint8_t { subslices, split, exclusive, custom };

struct PoolLayout {
  PoolPreset preset = PoolPreset::subslices;
  std::vector<PoolSpec> custom;  // only for PoolPreset::custom

  friend bool operator==(const PoolLayout&, const PoolLayout&) = default;
};

// Limits a layout must respect. Pools are addressed by a small index and pages per pool are
// bounded so that reports and indexes stay small.
inline constexpr std::size_t kMaxPools = 32;
inline constexpr std::uint64_t kMaxPagesPerPool = 65536;
// The alignment of every device address and slice the library hands out (cudaMalloc itself
// guarantees 256); configured sizes are rounded up to it.
inline constexpr std::uint64_t kDeviceAlignment = 512;
// No configured size may exceed this: no device has more memory, and every size stays far from
// wrapping when it is rounded up to an alignment.
inline constexpr std::uint64_t kLargestConfiguredSize = std::uint64_t{1} << 40;  // 1 TiB
// The largest managed slab (managed_slab; the smallest is kDeviceAlignment): the host metadata
// of a slab is about 1/100 of it.
inline constexpr std::uint64_t kMaxManagedSlabSize = std::uint64_t{4} << 30;  // 4 GiB

// Formats a byte count the way the parser reads sizes back ("64MiB", "1536B").
std::string format_size(std::uint64_t bytes);

}  // namespace poolcuda
