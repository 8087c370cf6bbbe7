// The grammar of the `pools` key of POOLCUDA_CONF: a preset (`subslices`, `split`, `exclusive`)
// or a bracketed list of pools tried in order, `[sliced(page=64M,slice=16M,cap=1G,period=5000);
// exclusive(max=1G,period=10000);split(max=8G);direct(reclaim=4G)]`, and its inverse. Validates
// each pool against the limits in pools/options.h so that a layout the parser accepts can always
// be built, and refuses a list in which some pool could never serve a request (Note [Unreachable
// pools]).
// Pure string work; depends only on pools/options.h and the parser's internal helpers.
//
// Note [Unreachable pools]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The manager routes a request to the first pool of the list that accepts its size, and only a
// capped sliced pool that is full passes a request it accepts on to later pools (a spill); any
// other pool serves the request, grows, or fails it. A pool accepts every size from 1 byte up
// to a bound: `slice` for a sliced pool, `max` rounded up to the alignment for an exclusive or a
// split pool (the engine rounds it so: layout.cpp), every size for a direct pool. So a pool is never
// reached when an earlier pool that cannot spill has a bound at least as large as its own, and
// it can serve no request at all: almost always a list written largest first, or a rounding
// the writer did not expect (exclusive(max=1000B) already takes every size up to 1 KiB). Such a
// list is refused, naming both pools. A sliced pool's rounded page always holds its largest
// slice (slice <= page, both rounded up alike) and a cap is at least one rounded page, so a
// pool that some request reaches can always serve it.
#include <array>
#include <charconv>
#include <cstdint>
#include <vector>

#include "config/config_parse.h"

namespace poolcuda {

namespace {

enum Field : std::uint8_t { kPage, kSlice, kCap, kMax, kReclaim, kPeriod, kFieldCount };

constexpr std::array<std::string_view, kFieldCount> kFieldNames = {"page",    "slice", "cap",
                                                                   "max",     "reclaim",
                                                                   "period"};

struct KindSpec {
  std::string_view name;
  PoolKind kind;
  Field required;
  std::array<bool, kFieldCount> allowed;
};

constexpr std::array<KindSpec, 4> kKinds = {{
    {"sliced", PoolKind::sliced, kPage, {true, true, true, false, false, true}},
    {"exclusive", PoolKind::exclusive, kMax, {false, false, false, true, false, true}},
    {"split", PoolKind::split, kMax, {false, false, false, true, false, true}},
    {"direct", PoolKind::direct, kReclaim, {false, false, false, false, true, false}},
}};

constexpr std::string_view kLayoutExpected =
    "subslices, split, exclusive, or a list of pools in brackets such as "
    "[sliced(page=64M,slice=16M,cap=1G);exclusive(max=1G);direct(reclaim=4G)]";

std::string kind_fields(const KindSpec& spec) {
  std::string out;
  for (std::size_t f = 0; f < kFieldCount; ++f) {
    if (!spec.allowed[f]) continue;
    if (!out.empty()) out += ", ";
    out += kFieldNames[f];
  }
  return out;
}

ConfigError pool_error(std::string_view key, std::string_view text, std::string expected) {
  return ConfigError{std::string(key), std::string(text), std::move(expected)};
}

// Reads a reservation count: a positive integer without suffix.
std::optional<std::uint64_t> parse_count(std::string_view text) {
  std::uint64_t value = 0;
  auto [next, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || next != text.data() + text.size() || text.empty() || value == 0) {
    return std::nullopt;
  }
  return value;
}

// Parses one `kind(field=value,...)` entry of the list.
std::optional<ConfigError> parse_pool(std::string_view key, std::string_view entry,
                                      PoolSpec& out) {
  const auto open = entry.find('(');
  const auto kind_text = trim(entry.substr(0, open));
  const KindSpec* spec = nullptr;
  for (const auto& candidate : kKinds) {
    if (same_word(candidate.name, kind_text)) spec = &candidate;
  }
  if (spec == nullptr) {
    return pool_error(key, kind_text.empty() ? entry : kind_text,
                      "a pool kind: sliced, exclusive, split or direct");
  }
  std::array<std::optional<std::uint64_t>, kFieldCount> values;
  if (open != std::string_view::npos) {
    if (entry.back() != ')') {
      return pool_error(key, entry, "nothing after the ')' closing the fields of a pool");
    }
    const std::string_view fields = entry.substr(open + 1, entry.size() - open - 2);
    std::size_t start = 0;
    while (start <= fields.size()) {
      auto comma = fields.find(',', start);
      if (comma == std::string_view::npos) comma = fields.size();
      const auto field = trim(fields.substr(start, comma - start));
      start = comma + 1;
      if (field.empty()) continue;
      const auto equals = field.find('=');
      if (equals == std::string_view::npos) {
        return pool_error(key, field, "field=value, e.g. page=64M");
      }
      const auto name = trim(field.substr(0, equals));
      const auto value = trim(field.substr(equals + 1));
      std::size_t f = 0;
      while (f < kFieldCount && !(spec->allowed[f] && same_word(kFieldNames[f], name))) ++f;
      if (f == kFieldCount) {
        return pool_error(key, field,
                          "a field of " + std::string(spec->name) + " pools: " +
                              kind_fields(*spec));
      }
      if (values[f]) {
        return pool_error(key, field, "each field of a pool at most once");
      }
      if (f == kPeriod) {
        values[f] = parse_count(value);
        if (!values[f]) {
          return pool_error(key, field,
                            "period: a positive whole number of reservations (no suffix)");
        }
      } else {
        auto size = parse_size_field(key, value, kFieldNames[f]);
        if (size.error) {
          size.error->text = std::string(field);
          return size.error;
        }
        values[f] = size.value;
      }
    }
  }
  if (!values[spec->required]) {
    return pool_error(key, entry,
                      "field '" + std::string(kFieldNames[spec->required]) + "' (required for " +
                          std::string(spec->name) + " pools)");
  }

  out = PoolSpec{};
  out.kind = spec->kind;
  out.dealloc_period = values[kPeriod];
  switch (spec->kind) {
    case PoolKind::sliced: {
      const std::uint64_t page = *values[kPage];
      const std::uint64_t slice = values[kSlice].value_or(page);
      if (slice > page) {
        return pool_error(key, entry,
                          "slice (" + format_size(slice) + ") no larger than page (" +
                              format_size(page) + ")");
      }
      // A cap below one page (as the device rounds it, to the alignment) would shrink the
      // pool's pages until some request it accepts could never be served.
      const std::uint64_t aligned_page = align_up(page, kDeviceAlignment);
      if (values[kCap] && *values[kCap] < aligned_page) {
        return pool_error(key, entry,
                          "cap (" + format_size(*values[kCap]) + ") at least one page (" +
                              format_size(aligned_page) +
                              (aligned_page != page ? ", the page rounded up to the " +
                                                          format_size(kDeviceAlignment) +
                                                          " alignment)"
                                                    : ")"));
      }
      if (values[kCap]) {
        // Pages as the device rounds them: page=1000 makes pages of 1024 bytes.
        const std::uint64_t pages =
            *values[kCap] / aligned_page + (*values[kCap] % aligned_page != 0 ? 1 : 0);
        if (pages > kMaxPagesPerPool) {
          return pool_error(key, entry,
                            "at most " + std::to_string(kMaxPagesPerPool) +
                                " pages per pool (cap/page gives " + std::to_string(pages) +
                                (aligned_page != page ? ", the page rounded up to the " +
                                                            format_size(kDeviceAlignment) +
                                                            " alignment"
                                                      : std::string()) +
                                ")");
        }
      }
      out.page_size = page;
      out.max_slice_size = slice;
      out.cap = values[kCap];
      break;
    }
    case PoolKind::exclusive:
    case PoolKind::split:
      out.max_alloc_size = *values[kMax];
      break;
    case PoolKind::direct:
      out.reclaim_at = *values[kReclaim];
      break;
  }
  return std::nullopt;
}

// Checks that brackets and parentheses nest; returns the offending explanation or nothing.
std::optional<std::string> check_nesting(std::string_view value) {
  std::vector<char> open;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const char ch = value[i];
    if (ch == '[' || ch == '(') {
      open.push_back(ch);
    } else if (ch == ']' || ch == ')') {
      const char want = ch == ']' ? '[' : '(';
      // The value starts with '[' and returns as soon as that closes early, so `open` is never
      // empty here.
      if (open.back() != want) {
        return "balanced brackets: '" + std::string(1, ch) + "' at offset " + std::to_string(i) +
               " does not match the '" + std::string(1, open.back()) + "' still open";
      }
      open.pop_back();
      if (open.empty() && i + 1 != value.size()) {
        return "balanced brackets: the list closes at offset " + std::to_string(i) +
               " but text follows it";
      }
    }
  }
  if (!open.empty()) {
    return "balanced brackets: '" + std::string(1, open.back()) + "' is never closed";
  }
  return std::nullopt;
}

// The largest request `pool` accepts, as the engine judges it (Note [Unreachable pools]).
std::uint64_t accepted_up_to(const PoolSpec& pool) {
  switch (pool.kind) {
    case PoolKind::sliced:
      return pool.max_slice_size;
    case PoolKind::exclusive:
    case PoolKind::split:
      return align_up(pool.max_alloc_size, kDeviceAlignment);
    case PoolKind::direct:
      break;
  }
  return UINT64_MAX;
}

// A list in which some pool is never reached (Note [Unreachable pools]): the error names it and
// the earlier pool that takes its requests. `texts` holds each pool's text as written.
std::optional<ConfigError> check_reachable(std::string_view key,
                                           const std::vector<PoolSpec>& pools,
                                           const std::vector<std::string_view>& texts) {
  for (std::size_t later = 1; later < pools.size(); ++later) {
    for (std::size_t first = 0; first < later; ++first) {
      const PoolSpec& taker = pools[first];
      if (taker.kind == PoolKind::sliced && taker.cap) continue;  // spills when full
      if (accepted_up_to(taker) < accepted_up_to(pools[later])) continue;
      const std::string takes =
          taker.kind == PoolKind::direct
              ? "takes every size; a direct pool belongs last"
              : "takes every size up to " + format_size(accepted_up_to(taker)) +
                    "; list pools for smaller sizes first";
      return pool_error(key, texts[later],
                        "a pool that some request reaches: pool " + std::to_string(first + 1) +
                            " (" + std::string(texts[first]) + ") comes first, has no cap and " +
                            takes + " (pool " + std::to_string(later + 1) + ")");
    }
  }
  return std::nullopt;
}

void describe_pool(const PoolSpec& pool, std::string& out) {
  auto field = [&](std::string_view name, const std::string& value) {
    if (out.back() != '(') out += ',';
    out += std::string(name) + "=" + value;
  };
  switch (pool.kind) {
    case PoolKind::sliced:
      out += "sliced(";
      field("page", format_size(pool.page_size));
      if (pool.max_slice_size != 0) field("slice", format_size(pool.max_slice_size));
      if (pool.cap) field("cap", format_size(*pool.cap));
      break;
    case PoolKind::exclusive:
    case PoolKind::split:
      out += pool.kind == PoolKind::split ? "split(" : "exclusive(";
      field("max", format_size(pool.max_alloc_size));
      break;
    case PoolKind::direct:
      out += "direct(";
      field("reclaim", format_size(pool.reclaim_at));
      break;
  }
  if (pool.dealloc_period && pool.kind != PoolKind::direct) {
    field("period", std::to_string(*pool.dealloc_period));
  }
  out += ')';
}

}  // namespace

std::optional<ConfigError> parse_pool_layout(std::string_view key, std::string_view value,
                                             PoolLayout& layout) {
  for (const auto& [name, preset] : {std::pair{"subslices", PoolPreset::subslices},
                                      std::pair{"split", PoolPreset::split},
                                      std::pair{"exclusive", PoolPreset::exclusive}}) {
    if (!same_word(value, name)) continue;
    layout = PoolLayout{preset, {}};
    return std::nullopt;
  }
  if (value.empty() || value.front() != '[') {
    return pool_error(key, value, std::string(kLayoutExpected));
  }
  if (auto problem = check_nesting(value)) return pool_error(key, value, *problem);

  // Split the inside of the brackets on ';' outside parentheses.
  std::vector<PoolSpec> pools;
  std::vector<std::string_view> texts;
  const std::string_view inner = value.substr(1, value.size() - 2);
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= inner.size(); ++i) {
    const char ch = i < inner.size() ? inner[i] : ';';
    if (ch == '(' || ch == '[') ++depth;
    if (ch == ')' || ch == ']') --depth;
    // A comma between two pools: the fields' parser would report a field of the first pool
    // ("got 'page=1M)'"), not the separator.
    if (ch == ',' && depth == 0) {
      return pool_error(key, trim(inner.substr(start)),
                        "';' between the pools of a list, not ',' (pool " +
                            std::to_string(pools.size() + 1) + ")");
    }
    if (ch != ';' || depth != 0) continue;
    const auto entry = trim(inner.substr(start, i - start));
    start = i + 1;
    if (entry.empty()) continue;
    if (pools.size() == kMaxPools) {
      return pool_error(key, entry,
                        "at most " + std::to_string(kMaxPools) + " pools (this is pool " +
                            std::to_string(kMaxPools + 1) + ")");
    }
    PoolSpec pool;
    if (auto error = parse_pool(key, entry, pool)) {
      // Name the pool: the same field text may appear in several of them.
      error->expected += " (pool " + std::to_string(pools.size() + 1) + ")";
      return error;
    }
    pools.push_back(pool);
    texts.push_back(entry);
  }
  if (pools.empty()) {
    return pool_error(key, value, "at least one pool in the list, e.g. [sliced(page=64M)]");
  }
  if (auto error = check_reachable(key, pools, texts)) return error;
  layout = PoolLayout{PoolPreset::custom, std::move(pools)};
  return std::nullopt;
}

std::string describe_pool_layout(const PoolLayout& layout) {
  switch (layout.preset) {
    case PoolPreset::subslices:
      return "subslices";
    case PoolPreset::split:
      return "split";
    case PoolPreset::exclusive:
      return "exclusive";
    case PoolPreset::custom:
      break;
  }
  std::string out = "[";
  for (std::size_t i = 0; i < layout.custom.size(); ++i) {
    if (i > 0) out += ';';
    describe_pool(layout.custom[i], out);
  }
  return out + "]";
}

}  // namespace poolcuda
