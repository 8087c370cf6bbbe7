// The whole configuration of poolcuda as one value, and the pure parser that produces it from
// the POOLCUDA_CONF string. Parsing does no I/O and no CUDA call: errors are values, so the
// interposer can print them and stop before main, and `poolcuda check-conf` can reuse them.
// The option table (every key, its default, its grammar) lives in config.cpp; the README's
// configuration reference documents the same table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pools/types.h"

namespace poolcuda {

enum class PersistentMode : std::uint8_t { enabled, size_match, disabled, enforced };
enum class FreeFence : std::uint8_t { events, sync, none };
enum class ReportSignal : std::uint8_t { usr1, usr2, none };
enum class ReportFormat : std::uint8_t { text, json };
enum class LogLevel : std::uint8_t { off, basic, full };
enum class MemGetInfoMode : std::uint8_t { pooled, raw };

enum class PoolKind : std::uint8_t { sliced, exclusive, direct };

// One dynamic pool as configured. Fields a kind does not use stay 0 / nullopt.
struct PoolSpec {
  PoolKind kind = PoolKind::sliced;
  // sliced: page size, largest slice it accepts (defaults to the page), optional cap on the
  // bytes the pool may reserve.
  std::uint64_t page_size = 0;
  std::uint64_t max_slice_size = 0;
  std::optional<std::uint64_t> cap;
  // exclusive: largest allocation it accepts.
  std::uint64_t max_alloc_size = 0;
  // direct: reserved bytes above which idle allocations are released.
  std::uint64_t reclaim_at = 0;
  // sliced and exclusive: reservations of disuse after which an idle page is released.
  std::optional<std::uint64_t> dealloc_period;

  friend bool operator==(const PoolSpec&, const PoolSpec&) = default;
};

enum class PoolPreset : std::uint8_t { subslices, exclusive, custom };

struct PoolLayout {
  PoolPreset preset = PoolPreset::subslices;
  std::vector<PoolSpec> custom;  // only for PoolPreset::custom

  friend bool operator==(const PoolLayout&, const PoolLayout&) = default;
};

// Limits a layout must respect. Pools are addressed by a small index and pages per pool are
// bounded so that reports and indexes stay small.
inline constexpr std::size_t kMaxPools = 32;
inline constexpr std::uint64_t kMaxPagesPerPool = 65536;

struct Config {
  PoolLayout pools;
  PersistentMode persistent = PersistentMode::enabled;
  FreeFence free_fence = FreeFence::events;
  // Bytes freed memory may hold while it waits for free fences before a reservation that
  // would grow a pool waits for the oldest fence instead; 0: always wait first.
  std::uint64_t fence_slack = 64 * MiB;
  ReportSignal report_signal = ReportSignal::usr1;
  ReportFormat report_format = ReportFormat::text;
  std::string report_path = "stderr";  // or a path; %p = pid, %n = sequence number
  bool report_at_exit = false;
  LogLevel log = LogLevel::basic;
  bool managed = true;
  std::uint64_t managed_slab = 64 * MiB;
  MemGetInfoMode memgetinfo = MemGetInfoMode::pooled;
  bool confirm = false;

  friend bool operator==(const Config&, const Config&) = default;
};

// A configuration error: which key, the offending text, and what was expected.
struct ConfigError {
  std::string key;       // e.g. "pools", "free_fence"; empty when the entry has no key at all
  std::string text;      // the offending text, verbatim
  std::string expected;  // e.g. "one of events, sync, none"

  // "POOLCUDA_CONF: key 'free_fence': got 'fast', expected one of events, sync, none"
  std::string message() const;
};

struct ParseResult {
  std::optional<Config> config;  // set on success
  ConfigError error;             // meaningful only when config is empty

  explicit operator bool() const { return config.has_value(); }
};

// Parses a POOLCUDA_CONF value. An empty string yields the defaults.
ParseResult parse_config(std::string_view text);

// The effective configuration in the same grammar, every key spelled out; parsing the result
// gives back an equal Config.
std::string describe_config(const Config& config);

// Formats a byte count the way the parser reads sizes back ("64MiB", "1536B").
std::string format_size(std::uint64_t bytes);

// One row of the option table, for help texts (`poolcuda --help`) and documentation. The rows
// come from the same table the parser and describe_config use, in the same order.
struct ConfigKeyInfo {
  std::string_view key;
  std::string grammar;        // the values it takes, e.g. "events|sync|none"
  std::string default_value;  // as describe_config writes it for a default Config
  std::string_view summary;   // one line on what it controls
};
std::vector<ConfigKeyInfo> config_keys();

// Expands a report_path pattern: %p becomes `pid`, %n becomes `sequence` (1 for a process's
// first report). parse_config accepts no other '%' sequence, so nothing else is rewritten.
std::string expand_report_path(std::string_view pattern, long pid, std::uint64_t sequence);

}  // namespace poolcuda
