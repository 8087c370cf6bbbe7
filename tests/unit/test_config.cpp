// Tests of the POOLCUDA_CONF parser: every key and value, the size grammar, the pool-list
// grammar, every error (key, quoted text, expectation), describe_config round trips, the option
// table used by the CLI's help and report_path expansion.
#include <doctest/doctest.h>

#include <string>

#include "config/config.h"

using namespace poolcuda;

namespace {

Config parse_ok(std::string_view text) {
  auto result = parse_config(text);
  INFO("input: " << std::string(text) << "  error: " << result.error.message());
  REQUIRE(result);
  return *result.config;
}

ConfigError parse_error(std::string_view text) {
  auto result = parse_config(text);
  INFO("input: " << std::string(text));
  REQUIRE_FALSE(result);
  return result.error;
}

PoolSpec only_pool(std::string_view text) {
  const Config config = parse_ok(text);
  REQUIRE(config.pools.preset == PoolPreset::custom);
  REQUIRE(config.pools.custom.size() == 1);
  return config.pools.custom[0];
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Checks an error's three parts and that the message shows all of them.
void check_error(std::string_view input, std::string_view key, std::string_view text,
                 std::string_view expected_part) {
  CAPTURE(input);
  const ConfigError error = parse_error(input);
  CHECK(error.key == key);
  CHECK(error.text == text);
  CHECK_MESSAGE(contains(error.expected, expected_part), error.expected);
  const std::string message = error.message();
  CHECK(contains(message, std::string("'").append(text).append("'")));
  if (!key.empty()) CHECK(contains(message, std::string("key '").append(key).append("'")));
  CHECK(contains(message, error.expected));
}

}  // namespace

TEST_CASE("empty and blank configurations give the defaults") {
  CHECK(parse_ok("") == Config{});
  CHECK(parse_ok("   \t ") == Config{});
  CHECK(parse_ok(",") == Config{});
  const Config defaults;
  CHECK(defaults.pools.preset == PoolPreset::subslices);
  CHECK(defaults.persistent == PersistentMode::enabled);
  CHECK(defaults.free_fence == FreeFence::automatic);
  CHECK(defaults.fence_slack == 64 * MiB);
  CHECK(defaults.thread_cache);
  CHECK(defaults.shards == 0);
  CHECK(defaults.report_signal == ReportSignal::usr1);
  CHECK(defaults.report_format == ReportFormat::text);
  CHECK(defaults.report_path == "stderr");
  CHECK_FALSE(defaults.report_at_exit);
  CHECK(defaults.log == LogLevel::basic);
  CHECK(defaults.managed);
  CHECK(defaults.managed_slab == 64 * MiB);
  CHECK(defaults.memgetinfo == MemGetInfoMode::pooled);
  CHECK_FALSE(defaults.confirm);
  CHECK(describe_config(defaults) ==
        "pools:subslices,persistent:enabled,free_fence:auto,fence_slack:64MiB,hold:1.5,"
        "thread_cache:on,shards:auto,report_signal:USR1,"
        "report_format:text,report_path:stderr,report_at_exit:0,log:basic,capture_share:off,"
        "limit:none,managed:on,"
        "managed_slab:64MiB,memgetinfo:pooled,confirm:0");
}

TEST_CASE("every keyword value of every key") {
  CHECK(parse_ok("persistent:enabled").persistent == PersistentMode::enabled);
  CHECK(parse_ok("persistent:size-match").persistent == PersistentMode::size_match);
  CHECK(parse_ok("persistent:disabled").persistent == PersistentMode::disabled);
  CHECK(parse_ok("persistent:enforced").persistent == PersistentMode::enforced);
  CHECK(parse_ok("free_fence:auto").free_fence == FreeFence::automatic);
  CHECK(parse_ok("free_fence:events").free_fence == FreeFence::events);
  CHECK(parse_ok("free_fence:sync").free_fence == FreeFence::sync);
  CHECK(parse_ok("free_fence:none").free_fence == FreeFence::none);
  CHECK(parse_ok("thread_cache:on").thread_cache);
  CHECK_FALSE(parse_ok("thread_cache:off").thread_cache);
  CHECK(parse_ok("shards:auto").shards == 0);
  CHECK(parse_ok("shards:1").shards == 1);
  CHECK(parse_ok("shards:8").shards == 8);
  CHECK(parse_ok("report_signal:USR1").report_signal == ReportSignal::usr1);
  CHECK(parse_ok("report_signal:USR2").report_signal == ReportSignal::usr2);
  CHECK(parse_ok("report_signal:none").report_signal == ReportSignal::none);
  CHECK(parse_ok("report_format:text").report_format == ReportFormat::text);
  CHECK(parse_ok("report_format:json").report_format == ReportFormat::json);
  CHECK(parse_ok("report_format:wide").report_format == ReportFormat::wide);
  CHECK(parse_ok("report_path:stderr").report_path == "stderr");
  CHECK(parse_ok("report_path:stdout").report_path == "stdout");
  CHECK(parse_ok("report_path:STDOUT").report_path == "stdout");  // as it is described
  CHECK(parse_ok("report_path:StdErr").report_path == "stderr");
  CHECK(parse_ok("report_path:/tmp/r-%p-%n.json").report_path == "/tmp/r-%p-%n.json");
  CHECK(parse_ok("report_path:C:/x(1)[2].txt").report_path == "C:/x(1)[2].txt");
  CHECK(parse_ok("report_at_exit:1").report_at_exit);
  CHECK_FALSE(parse_ok("report_at_exit:0").report_at_exit);
  CHECK(parse_ok("log:off").log == LogLevel::off);
  CHECK(parse_ok("log:basic").log == LogLevel::basic);
  CHECK(parse_ok("log:full").log == LogLevel::full);
  CHECK(parse_ok("managed:on").managed);
  CHECK_FALSE(parse_ok("managed:off").managed);
  CHECK(parse_ok("managed_slab:16M").managed_slab == 16 * MiB);
  CHECK(parse_ok("memgetinfo:pooled").memgetinfo == MemGetInfoMode::pooled);
  CHECK(parse_ok("memgetinfo:raw").memgetinfo == MemGetInfoMode::raw);
  CHECK(parse_ok("confirm:1").confirm);
  CHECK_FALSE(parse_ok("confirm:0").confirm);
  CHECK(parse_ok("pools:subslices").pools == PoolLayout{PoolPreset::subslices, {}});
  CHECK(parse_ok("pools:exclusive").pools == PoolLayout{PoolPreset::exclusive, {}});
}

TEST_CASE("several keys at once, with whitespace around every token") {
  const Config config = parse_ok(
      "  log : full ,free_fence:sync,\tpools : [ sliced ( page = 1M , cap = 4M ) ; "
      "direct( reclaim = 1G ) ] , managed_slab: 2 MiB ");
  CHECK(config.log == LogLevel::full);
  CHECK(config.free_fence == FreeFence::sync);
  CHECK(config.managed_slab == 2 * MiB);
  REQUIRE(config.pools.custom.size() == 2);
  CHECK(config.pools.custom[0].page_size == MiB);
  CHECK(config.pools.custom[0].cap == 4 * MiB);
  CHECK(config.pools.custom[1].kind == PoolKind::direct);
  CHECK(config.pools.custom[1].reclaim_at == GiB);
  // Unmentioned keys keep their defaults.
  CHECK(config.persistent == PersistentMode::enabled);
  CHECK(config.report_path == "stderr");
}

TEST_CASE("size suffixes are binary multiples with optional iB or B") {
  auto slab = [](std::string_view size) {
    return parse_ok("managed_slab:" + std::string(size)).managed_slab;
  };
  CHECK(slab("512") == 512);
  CHECK(slab("512B") == 512);
  CHECK(slab("64K") == 64 * KiB);
  CHECK(slab("64KiB") == 64 * KiB);
  CHECK(slab("64KB") == 64 * KiB);
  CHECK(slab("64k") == 64 * KiB);
  CHECK(slab("64kib") == 64 * KiB);
  CHECK(slab("64MIB") == 64 * MiB);
  CHECK(slab("64Mb") == 64 * MiB);
  CHECK(slab("2 MiB") == 2 * MiB);
  CHECK(slab("512b") == 512);
  CHECK(slab("64M") == 64 * MiB);
  CHECK(slab("64MiB") == 64 * MiB);
  CHECK(slab("64MB") == 64 * MiB);
  CHECK(slab("3G") == 3 * GiB);
  CHECK(slab("3GiB") == 3 * GiB);
  CHECK(parse_ok("fence_slack:1T").fence_slack == 1024 * GiB);
  CHECK(parse_ok("fence_slack:1TiB").fence_slack == 1024 * GiB);
}

TEST_CASE("fence_slack takes a size, and 0 with or without a unit") {
  auto slack = [](std::string_view size) {
    return parse_ok("fence_slack:" + std::string(size)).fence_slack;
  };
  CHECK(slack("64M") == 64 * MiB);
  CHECK(slack("1G") == GiB);
  CHECK(slack("1536") == 1536);
  CHECK(slack("010K") == 10 * KiB);
  CHECK(slack("0") == 0);
  CHECK(slack("000") == 0);
  CHECK(slack("0MiB") == 0);
  CHECK(slack("0 B") == 0);
  CHECK(parse_ok("free_fence:events, fence_slack: 0 ,log:off").fence_slack == 0);
  Config zero;
  zero.fence_slack = 0;
  CHECK(describe_config(zero).find(",fence_slack:0,") != std::string::npos);
  CHECK(parse_ok(describe_config(zero)) == zero);
}

TEST_CASE("error: a bad fence_slack changes nothing") {
  check_error("fence_slack:", "fence_slack", "", "a size");
  check_error("fence_slack:lots", "fence_slack", "lots", "an integer with an optional K, M, G");
  check_error("fence_slack:-1", "fence_slack", "-1", "a size");
  check_error("fence_slack:0x40", "fence_slack", "0x40", "a size");
  check_error("fence_slack:0Q", "fence_slack", "0Q", "a size");
  check_error("fence_slack:64MiBs", "fence_slack", "64MiBs", "a size");
  check_error("fence_slack:99999999999T", "fence_slack", "99999999999T", "fits in 64 bits");
  check_error("fence_slack:1M,fence_slack:2M", "fence_slack", "fence_slack:2M",
              "each key at most once");
}

TEST_CASE("hold takes off or a factor with at most two decimals") {
  CHECK(Config{}.hold_percent == 150);
  auto hold = [](std::string_view value) {
    return parse_ok("hold:" + std::string(value)).hold_percent;
  };
  CHECK(hold("off") == 0);
  CHECK(hold("OFF") == 0);
  CHECK(hold("2") == 200);
  CHECK(hold("1.5") == 150);
  CHECK(hold("1.25") == 125);
  CHECK(hold("1.10") == 110);
  CHECK(hold("100") == 10000);
  for (const std::uint32_t percent : {0u, 110u, 125u, 150u, 200u, 205u, 10000u}) {
    Config c;
    c.hold_percent = percent;
    CHECK(parse_ok(describe_config(c)) == c);
  }
  Config quarter;
  quarter.hold_percent = 125;
  CHECK(describe_config(quarter).find(",hold:1.25,") != std::string::npos);
}

TEST_CASE("error: a bad hold changes nothing") {
  const std::string expected = "off, or a factor from 1.1 to 100 with at most two decimals";
  for (const char* bad : {"", "1", "1.05", "0.5", "101", "100.01", "1.", ".5", "1.555",
                          "1.5x", "-2", "lots", "1e2", "99999999999"})
    check_error("hold:" + std::string(bad), "hold", bad, expected);
  check_error("hold:2,hold:3", "hold", "hold:3", "each key at most once");
}

TEST_CASE("format_size writes the largest exact binary unit") {
  CHECK(format_size(0) == "0B");
  CHECK(format_size(512) == "512B");
  CHECK(format_size(1536) == "1536B");
  CHECK(format_size(KiB) == "1KiB");
  CHECK(format_size(1536 * KiB) == "1536KiB");
  CHECK(format_size(64 * MiB) == "64MiB");
  CHECK(format_size(3 * GiB) == "3GiB");
  CHECK(format_size(5 * 1024 * GiB) == "5TiB");
}

TEST_CASE("a pool list with every kind and every field") {
  const Config config = parse_ok(
      "pools:[sliced(page=64M,slice=16M,cap=1G,period=5000);exclusive(max=1G,period=10000);"
      "split(max=4G,period=200);direct(reclaim=4G)]");
  REQUIRE(config.pools.preset == PoolPreset::custom);
  REQUIRE(config.pools.custom.size() == 4);
  const PoolSpec& sliced = config.pools.custom[0];
  CHECK(sliced.kind == PoolKind::sliced);
  CHECK(sliced.page_size == 64 * MiB);
  CHECK(sliced.max_slice_size == 16 * MiB);
  CHECK(sliced.cap == GiB);
  CHECK(sliced.dealloc_period == 5000);
  const PoolSpec& exclusive = config.pools.custom[1];
  CHECK(exclusive.kind == PoolKind::exclusive);
  CHECK(exclusive.max_alloc_size == GiB);
  CHECK(exclusive.dealloc_period == 10000);
  CHECK(exclusive.page_size == 0);
  const PoolSpec& split = config.pools.custom[2];
  CHECK(split.kind == PoolKind::split);
  CHECK(split.max_alloc_size == 4 * GiB);
  CHECK(split.dealloc_period == 200);
  const PoolSpec& direct = config.pools.custom[3];
  CHECK(direct.kind == PoolKind::direct);
  CHECK(direct.reclaim_at == 4 * GiB);
  CHECK_FALSE(direct.dealloc_period.has_value());
}

TEST_CASE("optional pool fields take their defaults") {
  const PoolSpec sliced = only_pool("pools:[sliced(page=2M)]");
  CHECK(sliced.page_size == 2 * MiB);
  CHECK(sliced.max_slice_size == 2 * MiB);  // the slice defaults to the page
  CHECK_FALSE(sliced.cap.has_value());
  CHECK_FALSE(sliced.dealloc_period.has_value());
  const PoolSpec exclusive = only_pool("pools:[exclusive(max=8K)]");
  CHECK(exclusive.max_alloc_size == 8 * KiB);
  CHECK_FALSE(exclusive.dealloc_period.has_value());
  const PoolSpec split = only_pool("pools:[split(max=8K)]");
  CHECK(split.kind == PoolKind::split);
  CHECK(split.max_alloc_size == 8 * KiB);
  CHECK_FALSE(split.dealloc_period.has_value());
  // Empty entries and a trailing comma inside a pool are tolerated.
  CHECK(parse_ok("pools:[;sliced(page=1M,);;]").pools.custom.size() == 1);
  // The limits themselves are accepted.
  CHECK(only_pool("pools:[sliced(page=1K,cap=64M)]").cap == 64 * MiB);
  CHECK(only_pool("pools:[sliced(page=1M,slice=1M,cap=1M)]").cap == MiB);
  std::string many = "pools:[";
  for (std::size_t i = 0; i < kMaxPools; ++i)
    many += "exclusive(max=" + std::to_string(i + 1) + "K);";  // each reaches sizes of its own
  CHECK(parse_ok(many + "]").pools.custom.size() == kMaxPools);
}

TEST_CASE("describe_config round-trips") {
  const char* inputs[] = {
      "",
      "pools:exclusive,persistent:size-match,free_fence:none,report_signal:none",
      "pools:split,log:full",
      "report_format:json,report_path:/var/tmp/poolcuda-%p-%n.json,report_at_exit:1,log:off",
      "managed:off,managed_slab:1536,memgetinfo:raw,confirm:1,persistent:enforced",
      "pools:[sliced(page=64M,slice=16M,cap=1G,period=5000);exclusive(max=1G,period=10000);"
      "direct(reclaim=4G)],report_signal:USR2,persistent:disabled,free_fence:sync",
      "pools:[sliced(page=1000);sliced(page=3M,cap=7M);exclusive(max=123457)]",
      "pools:[sliced(page=2M,slice=512K);split(max=16G,period=10000)]",
      "fence_slack:0,free_fence:events",
      "fence_slack:0KiB",
      "fence_slack:1536,log:full",
      "fence_slack:3G",
  };
  for (const char* input : inputs) {
    CAPTURE(input);
    const Config config = parse_ok(input);
    const std::string described = describe_config(config);
    CAPTURE(described);
    CHECK(parse_ok(described) == config);
    CHECK(describe_config(parse_ok(described)) == described);
  }
  Config built;
  PoolSpec direct;
  direct.kind = PoolKind::direct;
  direct.reclaim_at = 5 * GiB;
  built.pools = PoolLayout{PoolPreset::custom, {direct}};
  built.managed_slab = 3 * KiB + 1;
  CHECK(parse_ok(describe_config(built)) == built);
}

TEST_CASE("the option table lists every key once with its default") {
  const auto keys = config_keys();
  const std::vector<std::string_view> names = {
      "pools",         "persistent",     "free_fence", "fence_slack",   "hold", "thread_cache",
      "shards",        "report_signal",  "report_format", "report_path", "report_at_exit", "log",
      "capture_share", "limit",          "managed",     "managed_slab",  "memgetinfo",
      "confirm"};
  REQUIRE(keys.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(keys[i].key == names[i]);
  std::string rebuilt;
  for (const auto& key : keys) {
    CHECK_FALSE(key.summary.empty());
    CHECK_FALSE(key.grammar.empty());
    if (!rebuilt.empty()) rebuilt += ',';
    rebuilt += std::string(key.key) + ":" + key.default_value;
  }
  CHECK(rebuilt == describe_config(Config{}));
  CHECK(keys[2].key == "free_fence");
  CHECK(keys[2].grammar == "auto|events|sync|none");
  CHECK(keys[3].key == "fence_slack");
  CHECK(keys[3].grammar == "SIZE");
  CHECK(keys[3].default_value == "64MiB");
}

TEST_CASE("expand_report_path replaces %p and %n") {
  CHECK(expand_report_path("/tmp/r-%p-%n.json", 4242, 3) == "/tmp/r-4242-3.json");
  CHECK(expand_report_path("plain.txt", 1, 1) == "plain.txt");
  CHECK(expand_report_path("%p%p", 7, 1) == "77");
}

TEST_CASE("error message format") {
  const ConfigError error{"free_fence", "fast", "one of events, sync, none"};
  CHECK(error.message() ==
        "POOLCUDA_CONF: key 'free_fence': got 'fast', expected one of events, sync, none");
  const ConfigError keyless{"", "junk", "key:value"};
  CHECK(keyless.message() == "POOLCUDA_CONF: got 'junk', expected key:value");
  // One line, whatever the value holds, and no byte a terminal would act on.
  const ParseResult broken = parse_config("log:of\nf\x1b[31m");
  REQUIRE(!broken);
  CHECK(broken.error.message() ==
        "POOLCUDA_CONF: key 'log': got 'of\\nf\\x1b[31m', expected one of off, basic, full");
}

TEST_CASE("error: unknown key lists the valid keys") {
  check_error("log:off,fence:sync", "fence", "fence", "one of the keys pools, persistent");
  const ConfigError error = parse_error("colour:blue");
  for (const auto& key : config_keys()) CHECK(contains(error.expected, key.key));
  check_error(":off", "", ":off", "a key before the ':', one of the keys");
  check_error("log:off, :5,confirm:1", "", ":5", "a key before the ':'");
}

TEST_CASE("error: a bad keyword value") {
  check_error("free_fence:fast", "free_fence", "fast", "one of auto, events, sync, none");
  check_error("persistent:always", "persistent", "always",
              "one of enabled, size-match, disabled, enforced");
  check_error("report_signal:HUP", "report_signal", "HUP", "one of USR1, USR2, none");
  check_error("report_format:xml", "report_format", "xml", "one of text, wide, json");
  check_error("report_at_exit:yes", "report_at_exit", "yes", "one of 0, 1");
  check_error("log:verbose", "log", "verbose", "one of off, basic, full");
  check_error("managed:1", "managed", "1", "one of on, off");
  check_error("thread_cache:yes", "thread_cache", "yes", "one of on, off");
  check_error("shards:16", "shards", "16", "one of auto, 1, 2, 3, 4, 5, 6, 7, 8");
  check_error("shards:0", "shards", "0", "one of auto, 1, 2, 3, 4, 5, 6, 7, 8");
  check_error("memgetinfo:both", "memgetinfo", "both", "one of pooled, raw");
  check_error("confirm:", "confirm", "", "one of 0, 1");
  check_error("pools:sliced", "pools", "sliced", "subslices, split, exclusive, or a list");
  check_error("pools:sliced(page=1M)", "pools", "sliced(page=1M)", "in brackets");
}

TEST_CASE("error: a bad report path") {
  check_error("report_path:", "report_path", "", "stderr, stdout or a file path");
  check_error("report_path:/tmp/r-%d", "report_path", "/tmp/r-%d", "%p = pid");
  check_error("report_path:/tmp/r-%", "report_path", "/tmp/r-%", "no other '%' sequence");
  // A control character is refused, and shown escaped.
  const ConfigError newline = parse_error("report_path:/tmp/r\n.txt");
  CHECK(newline.text == "/tmp/r\n.txt");
  CHECK(contains(newline.expected, "control characters"));
  CHECK(contains(newline.message(), "got '/tmp/r\\n.txt'"));
  CHECK(parse_error("report_path:/tmp/r\t%p").key == "report_path");
}

TEST_CASE("error: duplicate key") {
  check_error("log:off,confirm:1,log:full", "log", "log:full", "each key at most once");
  check_error("pools:exclusive,pools:[direct(reclaim=1G)]", "pools",
              "pools:[direct(reclaim=1G)]", "at most once");
}

TEST_CASE("error: missing ':' names the key the entry starts with") {
  check_error("log:off,confirm", "confirm", "confirm", "key:value");
  check_error("log=off", "log", "log=off", "a ':' after the key, e.g. log:basic");
  check_error("free_fence events", "free_fence", "free_fence events", "e.g. free_fence:auto");
  // Not a key at all: the valid keys are listed.
  check_error("nonsense", "nonsense", "nonsense", "one of the keys pools, persistent");
  check_error("freefence=none", "freefence", "freefence=none", "then ':' and a value");
  check_error("=x", "", "=x", "key:value");
}

TEST_CASE("limit: none, one size for every device, or per device") {
  CHECK(parse_ok("").limit == MemoryLimit{});
  CHECK(parse_ok("limit:none").limit == MemoryLimit{});
  const MemoryLimit all = parse_ok("limit:12G").limit;
  CHECK(all.all == std::optional<std::uint64_t>(12 * GiB));
  CHECK(all.for_device(5) == std::optional<std::uint64_t>(12 * GiB));
  const Config per = parse_ok("limit:[1=20G, 0=40G],log:off");
  CHECK(per.log == LogLevel::off);  // the brackets keep their commas from the next key
  CHECK(per.limit.for_device(0) == std::optional<std::uint64_t>(40 * GiB));
  CHECK(per.limit.for_device(1) == std::optional<std::uint64_t>(20 * GiB));
  CHECK(per.limit.for_device(2) == std::nullopt);
  CHECK(describe_config(per).find("limit:[0=40GiB,1=20GiB]") != std::string::npos);
  CHECK(parse_ok(describe_config(per)) == per);
}

TEST_CASE("error: a bad limit") {
  check_error("limit:lots", "limit", "lots", "per device in brackets such as [0=40G,1=20G]");
  check_error("limit:[0=40G,x=1G]", "limit", "x=1G", "DEVICE=SIZE with a device index");
  check_error("limit:[64=1G]", "limit", "64=1G", "from 0 to 63");
  check_error("limit:[-0=1G]", "limit", "-0=1G", "DEVICE=SIZE with a device index");
  check_error("limit:[-1=1G]", "limit", "-1=1G", "DEVICE=SIZE with a device index");
  check_error("limit:[0=1G,0=2G]", "limit", "0=2G", "each device at most once");
  check_error("limit:[0=1G;1=2G]", "limit", "0=1G;1=2G",
              "',' between the devices of a limit, not ';'");
  check_error("limit:[0=1G", "limit", "[0=1G", "balanced brackets: '[' is never closed");
  check_error("limit:[0=1G]x", "limit", "[0=1G]x", "nothing after the list's ']' (offset 5)");
  check_error("limit:[0=1G]]", "limit", "[0=1G]]", "nothing after the list's ']' (offset 5)");
  check_error("limit:[0=0]", "limit", "0=0", "a non-zero size for limit");
  check_error("limit:[]", "limit", "[]", "per device in brackets");
  // An empty entry names the whole list, not '' (a stray comma anywhere in it).
  check_error("limit:[0=1G,,1=2G]", "limit", "[0=1G,,1=2G]", "an entry is empty");
  check_error("limit:[0=1G,]", "limit", "[0=1G,]", "an entry is empty");
  check_error("limit:[ ,0=1G]", "limit", "[ ,0=1G]", "an entry is empty");
}

TEST_CASE("keyword values are case-insensitive, as size units are") {
  const Config config = parse_ok("free_fence:EVENTS,log:Full,persistent:Size-Match,"
                                 "pools:[SLICED(PAGE=2m)]");
  CHECK(config.free_fence == FreeFence::events);
  CHECK(config.log == LogLevel::full);
  CHECK(config.persistent == PersistentMode::size_match);
  CHECK(config.pools.custom.at(0).page_size == 2 * MiB);
  CHECK(parse_ok("pools:Exclusive").pools.preset == PoolPreset::exclusive);
  // describe_config writes the canonical spelling.
  CHECK(describe_config(config).find("free_fence:events") != std::string::npos);
}

TEST_CASE("error: sizes above 1 TiB, including those that would wrap when rounded") {
  check_error("pools:[sliced(page=18446744073709551615)]", "pools",
              "page=18446744073709551615", "at most 1TiB (no device has more memory)");
  check_error("pools:[exclusive(max=2T)]", "pools", "max=2T", "at most 1TiB");
  check_error("managed_slab:1025G", "managed_slab", "1025G", "at most 1TiB");
  CHECK(only_pool("pools:[exclusive(max=1T)]").max_alloc_size == 1024 * GiB);
}

TEST_CASE("error: a cap below one page as the device rounds it") {
  // 1000 B pages are 1024 B on the device (512 B alignment): a 1000 B cap fits no page.
  check_error("pools:[sliced(page=1000B,cap=1000B)]", "pools", "sliced(page=1000B,cap=1000B)",
              "cap (1000B) at least one page (1KiB, the page rounded up to the 512B alignment)");
  check_error("pools:[sliced(page=300B,cap=300B)]", "pools", "sliced(page=300B,cap=300B)",
              "at least one page (512B");
  CHECK(only_pool("pools:[sliced(page=1000B,cap=1K)]").cap == std::optional<std::uint64_t>(KiB));
}

TEST_CASE("error: bad number or suffix") {
  check_error("managed_slab:64X", "managed_slab", "64X", "an integer with an optional K, M, G");
  check_error("managed_slab:M", "managed_slab", "M", "a size");
  check_error("managed_slab:1.5G", "managed_slab", "1.5G", "a size");
  check_error("managed_slab:-1", "managed_slab", "-1", "a size");
  check_error("managed_slab:64MiBs", "managed_slab", "64MiBs", "a size");
  check_error("managed_slab:64iB", "managed_slab", "64iB", "a size");
  check_error("managed_slab:64Mi", "managed_slab", "64Mi", "a size");
  check_error("managed_slab:64KK", "managed_slab", "64KK", "a size");
  check_error("managed_slab:0x40", "managed_slab", "0x40", "a size");
  check_error("managed_slab:64 M B", "managed_slab", "64 M B", "a size");
  check_error("pools:[sliced(page=64Q)]", "pools", "page=64Q", "a size");
  check_error("pools:[exclusive(max=1G,period=5K)]", "pools", "period=5K",
              "positive whole number");
  check_error("pools:[exclusive(max=1G,period=0)]", "pools", "period=0", "positive whole number");
}

TEST_CASE("error: size overflow") {
  check_error("managed_slab:99999999999T", "managed_slab", "99999999999T",
              "a size that fits in 64 bits");
  check_error("managed_slab:16777216T", "managed_slab", "16777216T", "fits in 64 bits");
  check_error("managed_slab:99999999999999999999", "managed_slab", "99999999999999999999",
              "fits in 64 bits");
  check_error("pools:[direct(reclaim=99999999999T)]", "pools", "reclaim=99999999999T",
              "fits in 64 bits");
}

TEST_CASE("error: managed_slab below one granule or above 4 GiB") {
  check_error("managed_slab:511", "managed_slab", "511", "a size from 512B to 4GiB");
  check_error("managed_slab:4097M", "managed_slab", "4097M", "a size from 512B to 4GiB");
  check_error("managed_slab:1T", "managed_slab", "1T", "a size from 512B to 4GiB");
  CHECK(parse_ok("managed_slab:512").managed_slab == 512);
  CHECK(parse_ok("managed_slab:4G").managed_slab == 4 * GiB);
}

TEST_CASE("error: zero size names the field") {
  check_error("managed_slab:0", "managed_slab", "0", "a non-zero size for managed_slab");
  check_error("pools:[sliced(page=0)]", "pools", "page=0", "a non-zero size for page");
  check_error("pools:[sliced(page=1M,slice=0K)]", "pools", "slice=0K", "non-zero size for slice");
  check_error("pools:[direct(reclaim=1G);sliced(page=0)]", "pools", "page=0",
              "a non-zero size for page (pool 2)");
  check_error("pools:[sliced(page=1M,cap=0)]", "pools", "cap=0", "non-zero size for cap");
  check_error("pools:[exclusive(max=0B)]", "pools", "max=0B", "non-zero size for max");
  check_error("pools:[direct(reclaim=0M)]", "pools", "reclaim=0M", "non-zero size for reclaim");
}

TEST_CASE("error: empty pool list") {
  check_error("pools:[]", "pools", "[]", "at least one pool");
  check_error("pools:[ ; ]", "pools", "[ ; ]", "at least one pool");
  check_error("pools:", "pools", "", "subslices, split, exclusive, or a list");
}

TEST_CASE("error: unknown pool kind, unknown field, missing required field") {
  check_error("pools:[sliced(page=1M);bump(size=1M)]", "pools", "bump",
              "a pool kind: sliced, exclusive, split or direct (pool 2)");
  check_error("pools:[(page=1M)]", "pools", "(page=1M)", "a pool kind");
  check_error("pools:[sliced(page=1M,max=2M)]", "pools", "max=2M",
              "a field of sliced pools: page, slice, cap, period");
  check_error("pools:[direct(reclaim=1G,period=10)]", "pools", "period=10",
              "a field of direct pools: reclaim");
  check_error("pools:[split(max=1G,page=2M)]", "pools", "page=2M",
              "a field of split pools: max, period");
  check_error("pools:[split(period=5)]", "pools", "split(period=5)",
              "field 'max' (required for split pools)");
  check_error("pools:[exclusive(max)]", "pools", "max", "field=value");
  check_error("pools:[sliced(page=1M,page=2M)]", "pools", "page=2M", "each field of a pool");
  check_error("pools:[sliced(slice=1M)]", "pools", "sliced(slice=1M)",
              "field 'page' (required for sliced pools)");
  check_error("pools:[sliced]", "pools", "sliced", "field 'page'");
  check_error("pools:[exclusive(period=5)]", "pools", "exclusive(period=5)", "field 'max'");
  check_error("pools:[direct()]", "pools", "direct()", "field 'reclaim'");
  check_error("pools:[sliced(page=1M)x]", "pools", "sliced(page=1M)x", "nothing after the ')'");
}

TEST_CASE("error: pools separated by a comma") {
  check_error("pools:[sliced(page=1M),exclusive(max=1G)]", "pools",
              "sliced(page=1M),exclusive(max=1G)", "';' between the pools of a list, not ','");
  check_error("pools:[sliced(page=1M);exclusive(max=1G), direct(reclaim=1G)]", "pools",
              "exclusive(max=1G), direct(reclaim=1G)", "not ',' (pool 2)");
  // Commas inside a pool's fields are its own.
  CHECK(parse_ok("pools:[sliced(page=1M,slice=256K);exclusive(max=1G)]").pools.custom.size() == 2);
}

TEST_CASE("error: slice larger than page, cap smaller than page") {
  check_error("pools:[sliced(page=1M,slice=2M)]", "pools", "sliced(page=1M,slice=2M)",
              "slice (2MiB) no larger than page (1MiB)");
  check_error("pools:[sliced(page=2K,cap=1K)]", "pools", "sliced(page=2K,cap=1K)",
              "cap (1KiB) at least one page (2KiB)");
}

TEST_CASE("error: too many pages for one pool") {
  check_error("pools:[sliced(page=1K,cap=64G)]", "pools", "sliced(page=1K,cap=64G)",
              "at most 65536 pages per pool (cap/page gives 67108864)");
  // A cap one byte above the limit needs one more page.
  check_error("pools:[sliced(page=1K,cap=67108865)]", "pools", "sliced(page=1K,cap=67108865)",
              "cap/page gives 65537");
  // Pages as the device rounds them: page=1000 is a page of 1 KiB, as page=1K is.
  (void)parse_ok("pools:[sliced(page=1000,cap=64M)]");
  (void)parse_ok("pools:[sliced(page=1,cap=32M)]");
  check_error("pools:[sliced(page=1000,cap=65M)]", "pools", "sliced(page=1000,cap=65M)",
              "at most 65536 pages per pool (cap/page gives 66560, the page rounded up to the "
              "512B alignment)");
}

TEST_CASE("error: a pool that no request reaches") {
  // An earlier pool without a cap takes every size the later one accepts (Note [Unreachable
  // pools] in config/config_pools.cpp).
  check_error("pools:[exclusive(max=1G);sliced(page=2M,slice=512K)]", "pools",
              "sliced(page=2M,slice=512K)",
              "a pool that some request reaches: pool 1 (exclusive(max=1G)) comes first, has no "
              "cap and takes every size up to 1GiB; list pools for smaller sizes first (pool 2)");
  check_error("pools:[sliced(page=8M);sliced(page=2M,slice=512K)]", "pools",
              "sliced(page=2M,slice=512K)", "pool 1 (sliced(page=8M)) comes first");
  check_error("pools:[sliced(page=2M);exclusive(max=1M)]", "pools", "exclusive(max=1M)",
              "every size up to 2MiB");
  check_error("pools:[direct(reclaim=4G);exclusive(max=1K)]", "pools", "exclusive(max=1K)",
              "takes every size; a direct pool belongs last (pool 2)");
  check_error("pools:[direct(reclaim=4G);direct(reclaim=8G)]", "pools", "direct(reclaim=8G)",
              "a direct pool belongs last");
  // The same bound twice, and bounds that only rounding makes equal: an exclusive max is
  // rounded up to the 512 B alignment, so max=1000B already takes every size up to 1 KiB.
  check_error("pools:[exclusive(max=1M);exclusive(max=1M)]", "pools", "exclusive(max=1M)",
              "(pool 2)");
  check_error("pools:[split(max=1G);sliced(page=2M,slice=512K)]", "pools",
              "sliced(page=2M,slice=512K)", "pool 1 (split(max=1G)) comes first");
  check_error("pools:[exclusive(max=1G);split(max=512M)]", "pools", "split(max=512M)",
              "every size up to 1GiB");
  check_error("pools:[exclusive(max=1000B);exclusive(max=1K)]", "pools", "exclusive(max=1K)",
              "every size up to 1KiB");
  // The pool named is the first one that hides it, and the later pool's number is its own.
  check_error(
      "pools:[sliced(page=64K);exclusive(max=4M);sliced(page=1M,cap=8M);direct(reclaim=1G)]",
      "pools", "sliced(page=1M,cap=8M)", "pool 2 (exclusive(max=4M)) comes first");

  // Reachable lists: a capped pool spills when full, a larger bound reaches larger sizes, and
  // an exclusive max one byte past an alignment step rounds up past the earlier bound.
  CHECK(parse_ok("pools:[sliced(page=2M,slice=1M,cap=4M);exclusive(max=1M)]").pools.custom.size() ==
        2);
  CHECK(parse_ok("pools:[sliced(page=2M,cap=2M);sliced(page=1M)]").pools.custom.size() == 2);
  CHECK(parse_ok("pools:[sliced(page=2M,slice=512K);sliced(page=8M,slice=2M);exclusive(max=1G);"
                 "direct(reclaim=4G)]")
            .pools.custom.size() == 4);
  CHECK(parse_ok("pools:[exclusive(max=1K);exclusive(max=1025B)]").pools.custom.size() == 2);
  CHECK(parse_ok("pools:[sliced(page=2K,slice=1000B);exclusive(max=1000B)]").pools.custom.size() ==
        2);
}

TEST_CASE("error: too many pools") {
  std::string many = "pools:[";
  for (std::size_t i = 0; i <= kMaxPools; ++i) {
    many += "exclusive(max=" + std::to_string(i + 1) + "K);";
  }
  check_error(many + "]", "pools", "exclusive(max=33K)", "at most 32 pools (this is pool 33)");
}

TEST_CASE("error: unbalanced brackets") {
  check_error("pools:[sliced(page=1M)", "pools", "[sliced(page=1M)", "'[' is never closed");
  check_error("pools:[sliced(page=1M]", "pools", "[sliced(page=1M]",
              "']' at offset 15 does not match the '(' still open");
  check_error("pools:[sliced(page=1M))]", "pools", "[sliced(page=1M))]", "does not match");
  check_error("pools:]", "pools", "]", "in brackets");
  check_error("pools:[x]]", "pools", "[x]]", "the list closes at offset 2 but text follows");
  check_error("pools:[sliced(page=1M)]]", "pools", "[sliced(page=1M)]]", "text follows");
  check_error("pools:[sliced(page=1M)];x", "pools", "[sliced(page=1M)];x", "text follows");
  // An unclosed list swallows the rest of the string rather than misreading it.
  check_error("pools:[sliced(page=1M,log:off", "pools", "[sliced(page=1M,log:off",
              "never closed");
}

TEST_CASE("the first error wins and nothing partial escapes") {
  const auto result = parse_config("log:off,free_fence:fast,colour:blue");
  CHECK_FALSE(result.config.has_value());
  CHECK(result.error.key == "free_fence");
}

TEST_CASE("mutated inputs never crash, and whatever parses round-trips") {
  // Deterministic mutations of valid configurations: characters of the grammar inserted,
  // deleted and replaced at random positions.
  const std::string seeds[] = {
      "pools:[sliced(page=64M,slice=16M,cap=1G,period=5000);exclusive(max=1G,period=10000);"
      "direct(reclaim=4G)],log:full",
      "persistent:size-match,free_fence:sync,report_path:/tmp/r-%p-%n,managed_slab:2MiB",
      "report_signal:USR2,report_format:json,report_at_exit:1,memgetinfo:raw,confirm:1",
  };
  const std::string alphabet = "[]();,:=% 0123456789KMGTiBpagesliceapmxdrt";
  std::uint64_t state = 0x9e3779b97f4a7c15ULL;
  auto next = [&state](std::uint64_t bound) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % bound;
  };
  int parsed = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text = seeds[next(std::size(seeds))];
    const auto edits = 1 + next(4);
    for (std::uint64_t e = 0; e < edits; ++e) {
      const auto at = next(text.size() + 1);
      const char ch = alphabet[next(alphabet.size())];
      switch (next(3)) {
        case 0: text.insert(at, 1, ch); break;
        case 1: if (at < text.size()) text.erase(at, 1); break;
        default: if (at < text.size()) text[at] = ch; break;
      }
    }
    const ParseResult result = parse_config(text);
    if (result) {
      ++parsed;
      const std::string described = describe_config(*result.config);
      const ParseResult again = parse_config(described);
      CAPTURE(text);
      CAPTURE(described);
      REQUIRE(again);
      CHECK(*again.config == *result.config);
    } else {
      CHECK_FALSE(result.error.expected.empty());
      CHECK(result.error.message().starts_with("POOLCUDA_CONF: "));
    }
  }
  CHECK(parsed > 100);  // the mutations leave many inputs valid, so round trips are exercised
}

// The seed's table of invalid pool lists, each refused with the error that names the problem.
TEST_CASE("resolve_invalid_pool_configs_fail") {
  std::string too_many = "pools:[";
  for (std::size_t i = 0; i <= kMaxPools; ++i) too_many += "exclusive(max=1K);";
  too_many += "]";
  const struct {
    std::string input;
    std::string expected;
  } cases[] = {
      {"pools:[]", "at least one pool"},
      {"pools:[sliced(page=0)]", "a non-zero size for page"},
      {"pools:[sliced(page=1K,slice=2K)]", "slice (2KiB) no larger than page (1KiB)"},
      {"pools:[sliced(page=2K,cap=1K)]", "cap (1KiB) at least one page (2KiB)"},
      {"pools:[sliced(page=1K,cap=64G)]", "at most 65536 pages per pool"},
      {too_many, "at most 32 pools"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.input);
    const ParseResult result = parse_config(c.input);
    REQUIRE_FALSE(result);
    CHECK(result.error.key == "pools");
    CHECK_MESSAGE(contains(result.error.expected, c.expected), result.error.expected);
  }
}
