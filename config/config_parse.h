// Internal to the configuration parser (config.cpp and config_pools.cpp): the shared token
// helpers and the pool-list grammar. Not part of the public API; include config/config.h instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"

namespace poolcuda {

// `text` without leading and trailing whitespace.
std::string_view trim(std::string_view text);

// Keyword comparison: keyword values are case-insensitive, as size units are ("64m", "Events").
bool same_word(std::string_view a, std::string_view b);

struct SizeResult {
  std::uint64_t value = 0;
  std::optional<ConfigError> error;  // set when `text` is not a non-zero size
};

// Reads a size ("64M", "64MiB", "64MB", "512", "512B"; binary multiples). Zero is an error that
// names `field`; so is a value above kLargestConfiguredSize (which also keeps every size far
// from wrapping when it is rounded up). Errors carry `key` and `text`.
SizeResult parse_size_field(std::string_view key, std::string_view text, std::string_view field);

// The value of the `pools` key: a preset name or a bracketed list of pools.
std::optional<ConfigError> parse_pool_layout(std::string_view key, std::string_view value,
                                             PoolLayout& layout);

// The inverse of parse_pool_layout.
std::string describe_pool_layout(const PoolLayout& layout);

}  // namespace poolcuda
