// The POOLCUDA_CONF parser, its inverse (describe_config) and the one option table both use.
// Every key is declared once, in kOptions below, with its grammar, its summary and the functions
// that read and write it; config_keys() hands the same rows to the CLI's help, and
// docs/configuration.md lists them in the same order (tests/docs checks it). Pure string work:
// no I/O, no CUDA, no exception for bad input — every mistake becomes a ConfigError naming the
// key, quoting the text and saying what was expected.
// The pool-list grammar (`pools:[kind(field=value,...);...]`) lives in config_pools.cpp.
#include "config/config.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "config/config_parse.h"

namespace poolcuda {

namespace {

// A keyword value of an enum or boolean key. The first entry for a value is how it is written.
template <typename T>
struct Word {
  std::string_view name;
  T value;
};

constexpr Word<PersistentMode> kPersistentWords[] = {{"enabled", PersistentMode::enabled},
                                                     {"size-match", PersistentMode::size_match},
                                                     {"disabled", PersistentMode::disabled},
                                                     {"enforced", PersistentMode::enforced}};
constexpr Word<FreeFence> kFenceWords[] = {
    {"auto", FreeFence::automatic},
    {"events", FreeFence::events},
    {"sync", FreeFence::sync},
    {"none", FreeFence::none}};
constexpr Word<ReportSignal> kSignalWords[] = {
    {"USR1", ReportSignal::usr1}, {"USR2", ReportSignal::usr2}, {"none", ReportSignal::none}};
constexpr Word<ReportFormat> kFormatWords[] = {
    {"text", ReportFormat::text}, {"wide", ReportFormat::wide}, {"json", ReportFormat::json}};
constexpr Word<LogLevel> kLogWords[] = {
    {"off", LogLevel::off}, {"basic", LogLevel::basic}, {"full", LogLevel::full}};
constexpr Word<MemGetInfoMode> kMemGetInfoWords[] = {{"pooled", MemGetInfoMode::pooled},
                                                     {"raw", MemGetInfoMode::raw}};
constexpr Word<bool> kBitWords[] = {{"0", false}, {"1", true}};
constexpr Word<bool> kOnOffWords[] = {{"on", true}, {"off", false}};
// 0 stands for auto: the registry picks the count from the CPUs the process may use.
constexpr Word<std::uint32_t> kShardWords[] = {
    {"auto", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}, {"5", 5}, {"6", 6}, {"7", 7}, {"8", 8}};

template <auto& words>
std::string word_grammar(std::string_view separator) {
  std::string out;
  for (const auto& word : words) {
    if (!out.empty()) out += separator;
    out += word.name;
  }
  return out;
}

template <auto& words, auto member>
std::optional<ConfigError> parse_word(std::string_view key, std::string_view value, Config& c) {
  for (const auto& word : words) {
    if (same_word(word.name, value)) {
      c.*member = word.value;
      return std::nullopt;
    }
  }
  return ConfigError{std::string(key), std::string(value), "one of " + word_grammar<words>(", ")};
}

template <auto& words, auto member>
std::string describe_word(const Config& c) {
  for (const auto& word : words) {
    if (word.value == c.*member) return std::string(word.name);
  }
  return "?";  // unreachable for a value of the enum
}

template <auto& words>
std::string grammar_words() {
  return word_grammar<words>("|");
}

std::optional<ConfigError> parse_managed_slab(std::string_view key, std::string_view value,
                                              Config& c) {
  auto size = parse_size_field(key, value, "managed_slab");
  if (size.error) return size.error;
  // A slab holds at least one granule, and its host metadata (about 1/100 of it) stays modest.
  if (size.value < kDeviceAlignment || size.value > kMaxManagedSlabSize) {
    return ConfigError{std::string(key), std::string(value),
                       "a size from " + format_size(kDeviceAlignment) + " to " +
                           format_size(kMaxManagedSlabSize)};
  }
  c.managed_slab = size.value;
  return std::nullopt;
}

std::string describe_managed_slab(const Config& c) { return format_size(c.managed_slab); }

constexpr int kLargestDeviceIndex = 63;
constexpr std::string_view kLimitExpected =
    "none, a size (every device), or per device in brackets such as [0=40G,1=20G]";

std::optional<ConfigError> parse_limit(std::string_view key, std::string_view value, Config& c) {
  MemoryLimit limit;
  if (same_word(value, "none")) {
    c.limit = limit;
    return std::nullopt;
  }
  if (value.empty() || value.front() != '[') {
    auto size = parse_size_field(key, value, "limit");
    if (size.error) {
      size.error->expected = std::string(kLimitExpected) + ": " + size.error->expected;
      return size.error;
    }
    limit.all = size.value;
    c.limit = limit;
    return std::nullopt;
  }
  // The first ']' ends the list: text after it is not part of the value ("[0=1G]x").
  const auto close = value.find(']');
  if (close == std::string_view::npos)
    return ConfigError{std::string(key), std::string(value),
                       "balanced brackets: '[' is never closed"};
  if (close + 1 != value.size())
    return ConfigError{std::string(key), std::string(value),
                       "nothing after the list's ']' (offset " + std::to_string(close) + ")"};
  if (value.size() < 3)
    return ConfigError{std::string(key), std::string(value), std::string(kLimitExpected)};
  std::string_view rest = value.substr(1, value.size() - 2);
  for (bool more = true; more;) {
    const auto comma = rest.find(',');
    const std::string_view entry = trim(rest.substr(0, comma));
    more = comma != std::string_view::npos;
    rest = more ? rest.substr(comma + 1) : std::string_view{};
    if (entry.empty())
      return ConfigError{std::string(key), std::string(value),
                         "DEVICE=SIZE entries with one ',' between them: an entry is empty"};
    if (entry.find(';') != std::string_view::npos)
      return ConfigError{std::string(key), std::string(entry),
                         "',' between the devices of a limit, not ';'"};
    const auto equals = entry.find('=');
    // Unsigned, so that a sign is refused ("-0" is not a device index).
    unsigned index_value = 0;
    const std::string_view index = trim(entry.substr(0, equals));
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), index_value);
    if (equals == std::string_view::npos || ec != std::errc() ||
        end != index.data() + index.size() ||
        index_value > static_cast<unsigned>(kLargestDeviceIndex))
      return ConfigError{std::string(key), std::string(entry),
                         "DEVICE=SIZE with a device index from 0 to " +
                             std::to_string(kLargestDeviceIndex) + ", e.g. 0=40G"};
    const int device = static_cast<int>(index_value);
    auto size = parse_size_field(key, trim(entry.substr(equals + 1)), "limit");
    if (size.error) {
      size.error->text = std::string(entry);
      return size.error;
    }
    for (const auto& [known, bytes] : limit.devices)
      if (known == device)
        return ConfigError{std::string(key), std::string(entry), "each device at most once"};
    limit.devices.emplace_back(device, size.value);
  }
  if (limit.devices.empty())
    return ConfigError{std::string(key), std::string(value), std::string(kLimitExpected)};
  std::sort(limit.devices.begin(), limit.devices.end());
  c.limit = limit;
  return std::nullopt;
}

std::string describe_limit(const Config& c) {
  if (c.limit.all) return format_size(*c.limit.all);
  if (c.limit.devices.empty()) return "none";
  std::string out = "[";
  for (const auto& [device, bytes] : c.limit.devices) {
    if (out.size() > 1) out += ',';
    out += std::to_string(device) + "=" + format_size(bytes);
  }
  return out + "]";
}

std::string grammar_limit() { return "none|SIZE|[DEVICE=SIZE,...]"; }
std::string grammar_size() { return "SIZE"; }

// A size where 0 is meaningful ("never run ahead"): a zero number with any valid unit is 0;
// everything else goes through the size grammar, so errors read the same as for other sizes.
std::optional<ConfigError> parse_fence_slack(std::string_view key, std::string_view value,
                                             Config& c) {
  const auto digits = value.find_first_not_of('0');
  if (!value.empty() && digits != 0 &&
      (digits == std::string_view::npos || value[digits] < '1' || value[digits] > '9')) {
    // All the digits are zeros: check the unit by reading "1" with the same suffix.
    std::string one(1, '1');  // appended, not "1" + ...: GCC 12 -O3 warns on that (restrict)
    one.append(value.substr(std::min(digits, value.size())));
    if (auto size = parse_size_field(key, one, "fence_slack"); size.error) {
      size.error->text = std::string(value);
      return size.error;
    }
    c.fence_slack = 0;
    return std::nullopt;
  }
  auto size = parse_size_field(key, value, "fence_slack");
  if (size.error) return size.error;
  c.fence_slack = size.value;
  return std::nullopt;
}

std::string describe_fence_slack(const Config& c) {
  return c.fence_slack == 0 ? "0" : format_size(c.fence_slack);
}

// The held bound as a factor with at most two decimals (1.5, 2, 1.25), kept in hundredths.
constexpr std::uint32_t kHoldLeast = 110;    // 1.1: below, rounding alone would trim every growth
constexpr std::uint32_t kHoldMost = 10000;  // 100
constexpr std::string_view kHoldExpected =
    "off, or a factor from 1.1 to 100 with at most two decimals, such as 1.5";

std::optional<ConfigError> parse_hold(std::string_view key, std::string_view value, Config& c) {
  if (same_word(value, "off")) {
    c.hold_percent = 0;
    return std::nullopt;
  }
  const auto error = [&] {
    return ConfigError{std::string(key), std::string(value), std::string(kHoldExpected)};
  };
  const std::string_view whole = value.substr(0, value.find('.'));
  std::uint32_t units = 0;
  const auto [end, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), units);
  if (whole.empty() || ec != std::errc() || end != whole.data() + whole.size() || units > 100)
    return error();
  std::uint32_t hundredths = 0;
  if (whole.size() < value.size()) {
    const std::string_view fraction = value.substr(whole.size() + 1);
    if (fraction.empty() || fraction.size() > 2) return error();
    for (const char digit : fraction) {
      if (digit < '0' || digit > '9') return error();
    }
    hundredths = static_cast<std::uint32_t>(fraction[0] - '0') * 10 +
                 (fraction.size() == 2 ? static_cast<std::uint32_t>(fraction[1] - '0') : 0);
  }
  const std::uint32_t percent = units * 100 + hundredths;
  if (percent < kHoldLeast || percent > kHoldMost) return error();
  c.hold_percent = percent;
  return std::nullopt;
}

std::string describe_hold(const Config& c) {
  if (c.hold_percent == 0) return "off";
  std::string out = std::to_string(c.hold_percent / 100);
  const std::uint32_t hundredths = c.hold_percent % 100;
  if (hundredths != 0) {
    out += '.';
    out += static_cast<char>('0' + hundredths / 10);
    if (hundredths % 10 != 0) out += static_cast<char>('0' + hundredths % 10);
  }
  return out;
}

std::string grammar_hold() { return "off|FACTOR"; }

constexpr std::string_view kPathExpected =
    "stderr, stdout or a file path without ',' or control characters (%p = pid, %n = report "
    "number; no other '%' sequence)";

std::optional<ConfigError> parse_report_path(std::string_view key, std::string_view value,
                                             Config& c) {
  bool ok = !value.empty();
  for (std::size_t i = 0; ok && i < value.size(); ++i) {
    // A newline or tab in a path is a quoting mistake far more often than a file's name.
    const auto byte = static_cast<unsigned char>(value[i]);
    if (byte < 0x20 || byte == 0x7f) ok = false;
    if (value[i] != '%') continue;
    ok = i + 1 < value.size() && (value[i + 1] == 'p' || value[i + 1] == 'n');
    ++i;
  }
  if (!ok) return ConfigError{std::string(key), std::string(value), std::string(kPathExpected)};
  // A keyword in any case is kept in the case it is described in, as other keyword values are.
  c.report_path = same_word(value, "stderr")   ? "stderr"
                  : same_word(value, "stdout") ? "stdout"
                                               : std::string(value);
  return std::nullopt;
}

std::string describe_report_path(const Config& c) { return c.report_path; }
std::string grammar_report_path() { return "stderr|stdout|PATH"; }

std::optional<ConfigError> parse_pools_option(std::string_view key, std::string_view value,
                                              Config& c) {
  return parse_pool_layout(key, value, c.pools);
}
std::string describe_pools(const Config& c) { return describe_pool_layout(c.pools); }
std::string grammar_pools() {
  return "subslices|split|exclusive|[sliced(page=SIZE,slice=SIZE,cap=SIZE,period=N);"
         "exclusive(max=SIZE,period=N);split(max=SIZE,period=N);direct(reclaim=SIZE)]";
}

struct Option {
  std::string_view key;
  std::string_view summary;
  std::optional<ConfigError> (*parse)(std::string_view key, std::string_view value, Config&);
  std::string (*describe)(const Config&);
  std::string (*grammar)();
};

#define POOLCUDA_WORD_OPTION(key, words, member, summary)                             \
  Option {                                                                            \
    key, summary, &parse_word<words, member>, &describe_word<words, member>,          \
        &grammar_words<words>                                                         \
  }

// Note [Option table]: the order here is the order of describe_config, of the CLI's help and
// of the keys in docs/configuration.md. Defaults are not written here: they are whatever a default
// Config holds, rendered by the row's own describe function. constexpr (string views and
// function pointers only): the table is constant-initialised, with no dynamic initialiser, so
// parse_config works even when a hook runs before the library's static initialisers.
constexpr std::array<Option, 18> kOptions = {{
    {"pools", "the dynamic pools: a preset or a list of pools tried in order", &parse_pools_option,
     &describe_pools, &grammar_pools},
    POOLCUDA_WORD_OPTION("persistent", kPersistentWords, &Config::persistent,
                         "when allocations go to the exact-fit persistent pool"),
    POOLCUDA_WORD_OPTION("free_fence", kFenceWords, &Config::free_fence,
                         "how a freed slice waits for the streams that may still use it"),
    {"fence_slack",
     "freed bytes that may wait on fences before a reservation waits instead of growing a pool "
     "(or 1/8 of the bytes in use, if larger)",
     &parse_fence_slack, &describe_fence_slack, &grammar_size},
    {"hold",
     "the most bytes the pools keep reserved, as a multiple of the most bytes ever in use: idle "
     "pages go back before a growth would pass it",
     &parse_hold, &describe_hold, &grammar_hold},
    POOLCUDA_WORD_OPTION("thread_cache", kOnOffWords, &Config::thread_cache,
                         "on: a thread reuses the slices it freed for its next requests "
                         "of the same size, without the pools' lock, while frees need no fence"),
    POOLCUDA_WORD_OPTION("shards", kShardWords, &Config::shards,
                         "the most sets of pools per device; a thread that finds its set busy "
                         "moves to another (auto: one more than the CPUs, at most 5)"),
    POOLCUDA_WORD_OPTION("report_signal", kSignalWords, &Config::report_signal,
                         "the signal that makes the process write a report"),
    POOLCUDA_WORD_OPTION("report_format", kFormatWords, &Config::report_format,
                         "the report's format (wide: text with every column)"),
    {"report_path", "where reports go: stderr, stdout or a file (%p = pid, %n = report number)",
     &parse_report_path, &describe_report_path, &grammar_report_path},
    POOLCUDA_WORD_OPTION("report_at_exit", kBitWords, &Config::report_at_exit,
                         "1: write one report when the process exits"),
    POOLCUDA_WORD_OPTION("log", kLogWords, &Config::log,
                         "log level on stderr (basic: warnings and out-of-memory details)"),
    POOLCUDA_WORD_OPTION("capture_share", kOnOffWords, &Config::capture_share,
                         "on: graphs captured on a device share one pool of pinned memory "
                         "(only for graphs that never run at the same time)"),
    {"limit",
     "the most device memory the library holds on a device (cudaMemGetInfo shows it as the "
     "total)",
     &parse_limit, &describe_limit, &grammar_limit},
    POOLCUDA_WORD_OPTION("managed", kOnOffWords, &Config::managed,
                         "serve cudaMallocManaged from bump slabs"),
    {"managed_slab", "size of one managed-memory slab", &parse_managed_slab,
     &describe_managed_slab, &grammar_size},
    POOLCUDA_WORD_OPTION("memgetinfo", kMemGetInfoWords, &Config::memgetinfo,
                         "pooled: cudaMemGetInfo counts idle pooled bytes as free"),
    POOLCUDA_WORD_OPTION("confirm", kBitWords, &Config::confirm,
                         "1: print the effective configuration at load"),
}};

#undef POOLCUDA_WORD_OPTION

std::string valid_keys() {
  std::string out = "one of the keys ";
  for (std::size_t i = 0; i < kOptions.size(); ++i) {
    if (i > 0) out += ", ";
    out += kOptions[i].key;
  }
  return out;
}

const Option* find_option(std::string_view key) {
  for (const auto& option : kOptions) {
    if (option.key == key) return &option;
  }
  return nullptr;
}

// An entry with no ':' ("log=off", "free_fence events"): the error names the key the entry
// starts with, whether or not it is a valid one, so the message points at the entry to fix.
ConfigError missing_colon(std::string_view entry) {
  std::size_t length = 0;
  while (length < entry.size() &&
         ((entry[length] >= 'a' && entry[length] <= 'z') || entry[length] == '_'))
    ++length;
  const std::string_view key = entry.substr(0, length);
  if (key.empty()) return ConfigError{"", std::string(entry), "key:value (a ':' after the key)"};
  if (find_option(key) == nullptr)
    return ConfigError{std::string(key), std::string(entry),
                       valid_keys() + ", then ':' and a value"};
  return ConfigError{std::string(key), std::string(entry),
                     "key:value (a ':' after the key, e.g. " + std::string(key) + ":" +
                         find_option(key)->describe(Config{}) + ")"};
}

}  // namespace

bool same_word(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  const auto first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(kSpace);
  return text.substr(first, last - first + 1);
}

SizeResult parse_size_field(std::string_view key, std::string_view text, std::string_view field) {
  SizeResult result;
  auto fail = [&](std::string expected) {
    result.error = ConfigError{std::string(key), std::string(text), std::move(expected)};
    return result;
  };
  constexpr std::string_view kSizeExpected =
      "a size: an integer with an optional K, M, G or T and an optional iB or B (e.g. 64M, "
      "64MiB, 512)";
  std::uint64_t number = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [next, ec] = std::from_chars(begin, end, number);
  if (ec == std::errc::result_out_of_range) return fail("a size that fits in 64 bits");
  if (ec != std::errc() || text.empty() || text.front() == '+' || text.front() == '-') {
    return fail(std::string(kSizeExpected));
  }
  // Whitespace may separate the number from its unit ("2 MiB").
  const std::string_view suffix_text(next, static_cast<std::size_t>(end - next));
  std::string_view suffix = trim(suffix_text);
  int shift = 0;
  if (!suffix.empty()) {
    constexpr std::string_view kUnits = "KMGT";
    const auto unit = kUnits.find(static_cast<char>(suffix.front() & ~0x20));
    if (unit != std::string_view::npos) {
      shift = 10 * static_cast<int>(unit + 1);
      suffix.remove_prefix(1);
      if (suffix.size() == 2 && (suffix[0] | 0x20) == 'i' && (suffix[1] | 0x20) == 'b') {
        suffix = {};
      }
    }
    if (suffix.size() == 1 && (suffix[0] | 0x20) == 'b') suffix = {};
    if (!suffix.empty()) return fail(std::string(kSizeExpected));
  }
  if (shift > 0 && number > (UINT64_MAX >> shift)) return fail("a size that fits in 64 bits");
  result.value = number << shift;
  if (result.value == 0) {
    return fail("a non-zero size for " + std::string(field));
  }
  if (result.value > kLargestConfiguredSize) {
    return fail("a size for " + std::string(field) + " of at most " +
                format_size(kLargestConfiguredSize) + " (no device has more memory)");
  }
  return result;
}

namespace {

// `text` with each control byte written as \n, \t, \r or \xHH: the error stays one line, and a
// terminal shows the bytes instead of obeying them (an escape sequence in the value).
std::string visible(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

}  // namespace

std::string ConfigError::message() const {
  std::string out = "POOLCUDA_CONF: ";
  if (!key.empty()) out += "key '" + visible(key) + "': ";
  out += "got '" + visible(text) + "', expected " + expected;
  return out;
}

std::optional<std::uint64_t> MemoryLimit::for_device(int device) const {
  for (const auto& [known, bytes] : devices)
    if (known == device) return bytes;
  return all;
}

ParseResult parse_config(std::string_view text) {
  ParseResult result;
  Config config;
  std::array<bool, kOptions.size()> seen{};
  std::size_t pos = 0;
  while (pos <= text.size()) {
    // The key runs to the first ':'; a ',' before it means the entry has no ':' at all.
    const auto stop = text.find_first_of(":,", pos);
    if (stop == std::string_view::npos || text[stop] == ',') {
      const auto entry = trim(text.substr(pos, stop == std::string_view::npos ? stop : stop - pos));
      if (!entry.empty()) {
        result.error = missing_colon(entry);
        return result;
      }
      if (stop == std::string_view::npos) break;  // trailing or empty entries are ignored
      pos = stop + 1;
      continue;
    }
    const auto key = trim(text.substr(pos, stop - pos));
    if (key.empty()) {  // ":5": the error shows the whole entry, not an empty key
      const auto comma = text.find(',', stop);
      const auto entry =
          trim(text.substr(pos, comma == std::string_view::npos ? comma : comma - pos));
      result.error = ConfigError{"", std::string(entry), "a key before the ':', " + valid_keys()};
      return result;
    }
    const Option* option = find_option(key);
    if (option == nullptr) {
      result.error = ConfigError{std::string(key), std::string(key), valid_keys()};
      return result;
    }
    // The value runs to the next ',' outside brackets and parentheses, so that the commas of a
    // pool list or a per-device limit stay inside it; brackets are only counted for those two
    // keys, so a report path may contain them.
    std::size_t end = stop + 1;
    int depth = 0;
    for (; end < text.size(); ++end) {
      const char ch = text[end];
      if (ch == ',' && depth <= 0) break;
      if (option->parse != &parse_pools_option && option->parse != &parse_limit) continue;
      if (ch == '[' || ch == '(') ++depth;
      if (ch == ']' || ch == ')') --depth;
    }
    const auto value = trim(text.substr(stop + 1, end - stop - 1));
    const auto index = static_cast<std::size_t>(option - kOptions.data());
    if (seen[index]) {
      result.error = ConfigError{std::string(key), std::string(trim(text.substr(pos, end - pos))),
                                 "each key at most once"};
      return result;
    }
    seen[index] = true;
    if (auto error = option->parse(key, value, config)) {
      result.error = std::move(*error);
      return result;
    }
    pos = end + 1;
  }
  result.config = std::move(config);
  return result;
}

std::string describe_config(const Config& config) {
  std::string out;
  for (const auto& option : kOptions) {
    if (!out.empty()) out += ',';
    out += std::string(option.key) + ":" + option.describe(config);
  }
  return out;
}

std::vector<ConfigKeyInfo> config_keys() {
  const Config defaults;
  std::vector<ConfigKeyInfo> keys;
  keys.reserve(kOptions.size());
  for (const auto& option : kOptions) {
    keys.push_back({option.key, option.grammar(), option.describe(defaults), option.summary});
  }
  return keys;
}

std::string expand_report_path(std::string_view pattern, long pid, std::uint64_t sequence) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(pid);
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'n') {
      out += std::to_string(sequence);
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

}  // namespace poolcuda
