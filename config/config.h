// The whole configuration of poolcuda as one value, and the pure parser that produces it from
// the POOLCUDA_CONF string. Parsing does no I/O and no CUDA call: errors are values, so the
// interposer can print them and stop before main, and `poolcuda check-conf` can reuse them.
// The option table (every key, its default, its grammar) lives in config.cpp; docs/config.md
// documents the same table. Builds as its own library (config/) over the engine's vocabulary
// (pools/options.h); the engine never includes this header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pools/options.h"

namespace poolcuda {

enum class ReportSignal : std::uint8_t { usr1, usr2, none };
enum class MemGetInfoMode : std::uint8_t { pooled, raw };

// The `limit` key: a budget of device memory the library may hold on each device (pools, managed
// slabs and the allocations it passes to the driver). `all` applies to every device not listed
// in `devices`; a device with neither has no budget.
struct MemoryLimit {
  std::optional<std::uint64_t> all;
  std::vector<std::pair<int, std::uint64_t>> devices;  // (device index, bytes), by index

  std::optional<std::uint64_t> for_device(int device) const;
  friend bool operator==(const MemoryLimit&, const MemoryLimit&) = default;
};

struct Config {
  PoolLayout pools;
  PersistentMode persistent = PersistentMode::enabled;
  FreeFence free_fence = FreeFence::automatic;
  // Bytes freed memory may hold while it waits for free fences before a reservation that
  // would grow a pool waits for the oldest fence instead; 0: always wait first.
  std::uint64_t fence_slack = 64 * MiB;
  // The most bytes the pools keep reserved, in hundredths of the most bytes in use (150: 1.5
  // times); 0: no bound.
  std::uint32_t hold_percent = kDefaultHoldPercent;
  // Each thread reuses the slices it freed for its next requests of the same size.
  bool thread_cache = true;
  // The most sets of pools per device that contending threads spread over; 0: auto.
  std::uint32_t shards = 0;
  ReportSignal report_signal = ReportSignal::usr1;
  ReportFormat report_format = ReportFormat::text;
  std::string report_path = "stderr";  // or a path; %p = pid, %n = sequence number
  bool report_at_exit = false;
  LogLevel log = LogLevel::basic;
  bool capture_share = false;
  MemoryLimit limit;
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
