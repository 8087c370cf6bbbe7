// Reports: the JSON form parses back (with a small strict JSON reader written here) and carries
// the manager's numbers; strings are escaped; the text form has a header with time and uptime, a
// summary, aligned pool rows within 100 columns, and the wide form adds the detail columns.
#include <doctest/doctest.h>

#include <cctype>
#include <map>
#include <memory>
#include <sstream>
#include <variant>

#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

// A strict JSON value: enough to walk a report and compare numbers.
struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<Json>,
               std::map<std::string, Json>>
      v;
  const Json& operator[](const std::string& key) const {
    return std::get<std::map<std::string, Json>>(v).at(key);
  }
  const Json& operator[](std::size_t i) const { return std::get<std::vector<Json>>(v).at(i); }
  double num() const { return std::get<double>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  std::size_t size() const { return std::get<std::vector<Json>>(v).size(); }
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : s_(text) {}

  // Parses the whole text; throws std::runtime_error with the offset on any deviation.
  Json document() {
    Json value = parse_value();
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    throw std::runtime_error(why + " at offset " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  char peek() {
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  Json parse_value() {
    const char c = peek();
    if (c == '{') return parse_object();
    if (c == '[') return parse_array();
    if (c == '"') return Json{parse_string()};
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return parse_number();
    for (auto [word, value] : {std::pair<std::string_view, Json>{"true", Json{true}},
                               {"false", Json{false}}, {"null", Json{nullptr}}}) {
      if (s_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return value;
      }
    }
    fail("unexpected character");
  }
  Json parse_object() {
    expect('{');
    std::map<std::string, Json> members;
    if (peek() == '}') {
      ++i_;
      return Json{members};
    }
    for (;;) {
      if (peek() != '"') fail("expected a key");
      std::string key = parse_string();
      if (members.count(key)) fail("duplicate key " + key);
      expect(':');
      members.emplace(std::move(key), parse_value());
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return Json{members};
    }
  }
  Json parse_array() {
    expect('[');
    std::vector<Json> items;
    if (peek() == ']') {
      ++i_;
      return Json{items};
    }
    for (;;) {
      items.push_back(parse_value());
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']');
      return Json{items};
    }
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      const char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("dangling escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          for (int k = 0; k < 4; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(s_[i_ + k]))) fail("bad \\u escape");
          out += static_cast<char>(std::stoi(std::string(s_.substr(i_, 4)), nullptr, 16));
          i_ += 4;
          break;
        }
        default: fail("bad escape");
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json parse_number() {
    const std::size_t start = i_;
    if (s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) fail("bad number");
    if (s_[i_] == '0' && i_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_ + 1])))
      fail("leading zero");
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) fail("bad fraction");
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    return Json{std::stod(std::string(s_.substr(start, i_ - start)))};
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

bool parses(std::string_view text) {
  try {
    JsonReader(text).document();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("sizes_and_durations_read_in_three_significant_figures") {
  CHECK(human_bytes(1000) == "1000 B");
  CHECK(human_bytes(2000) == "1.95 KiB");
  CHECK(human_bytes(10239) == "10.0 KiB");       // 9.999 KiB: not "10.00"
  CHECK(human_bytes(1048575) == "1.00 MiB");     // 1023.999 KiB: not "1024 KiB"
  CHECK(human_bytes(104855000) == "100 MiB");    // 99.998 MiB: not "100.0"
  CHECK(human_bytes(std::uint64_t{64} << 20) == "64.0 MiB");
  CHECK(human_bytes(std::uint64_t{282} << 20) == "282 MiB");
  CHECK(text_duration(250e-6) == "250 us");
  CHECK(text_duration(999.7e-6) == "1.0 ms");   // not "1000 us"
  CHECK(text_duration(0.99996) == "1.00 s");     // not "1000.0 ms"
  CHECK(text_duration(59.999) == "1m 0s");       // not "60.00 s"
  CHECK(text_duration(125) == "2m 5s");
}

TEST_CASE("json_reader_rejects_invalid_json") {
  // The validator must be able to fail, or the report test proves nothing.
  CHECK(parses(R"({"a":[1,2,{"b":"c\n"}],"d":null})"));
  CHECK_FALSE(parses(R"({"a":1,})"));
  CHECK_FALSE(parses(R"({"a":1 "b":2})"));
  CHECK_FALSE(parses("{\"a\":\"raw\ttab\"}"));
  CHECK_FALSE(parses(R"({"a":01})"));
  CHECK_FALSE(parses(R"({"a":1}})"));
  CHECK_FALSE(parses(R"({"a":"\x"})"));
  CHECK_FALSE(parses(R"({"a":1,"a":2})"));
}

TEST_CASE("json_report_parses_back_with_the_managers_numbers") {
  Rig rig(custom({sliced(4096, 2048, 8192), exclusive(1 * MiB), direct(1 * MiB)}), 512);
  rig.device.set_fence_mode(HostDevice::FenceMode::manual);
  const DevicePtr a = rig.reserve(1000);
  const DevicePtr b = rig.reserve(100 * KiB);
  rig.manager.set_mode(AllocationMode::persistent);
  REQUIRE(rig.reserve(3000) != 0);
  rig.manager.set_mode(AllocationMode::automatic);
  rig.manager.free(b);  // pending behind a fence
  (void)a;
  ManagerReport second = rig.manager.report();
  second.device = 1;
  const std::vector<ManagerReport> managers = {rig.manager.report(), second};
  const ReportHeader header{4242, 3, "signal \"USR1\"\n\\", 1764547200, 12.5};
  const std::string text = render_report(header, managers, ReportFormat::json);
  Json doc;
  REQUIRE_NOTHROW(doc = JsonReader(text).document());
  CHECK(doc["pid"].num() == 4242);
  CHECK(doc["sequence"].num() == 3);
  CHECK(doc["reason"].str() == header.reason);
  CHECK(doc["time"].str() == "2025-12-01T00:00:00Z");
  CHECK(doc["uptime_seconds"].num() == 12.5);
  REQUIRE(doc["devices"].size() == 2);
  const Json& d0 = doc["devices"][0];
  const ManagerReport& r = managers[0];
  CHECK(d0["device"].num() == 0);
  CHECK(doc["devices"][1]["device"].num() == 1);
  CHECK(d0["memory"]["bytes_in_use"].num() == static_cast<double>(r.bytes_in_use));
  CHECK(d0["memory"]["bytes_reserved"].num() == static_cast<double>(r.bytes_reserved));
  CHECK(d0["memory"]["pending_fence_bytes"].num() == 104 * KiB);  // its page: a size class
  CHECK(d0["memory"]["idle_bytes"].num() == static_cast<double>(r.idle_bytes));
  CHECK(d0["peaks"]["bytes_in_use_peak"].num() == 100 * KiB + 4000);
  // Three dynamic pools, then the persistent pool.
  REQUIRE(d0["pools"].size() == 4);
  CHECK(d0["pools"][0]["kind"].str() == "sliced");
  CHECK(d0["pools"][0]["cap"].num() == 8192);
  CHECK(d0["pools"][0]["page_size"].num() == 4096);
  CHECK(d0["pools"][0]["bytes_in_use"].num() == 1000);
  CHECK(d0["pools"][0]["pages_peak"].num() == 1);
  CHECK(d0["pools"][0]["largest_free"].num() == 4096 - 1024);
  CHECK(d0["pools"][1]["kind"].str() == "exclusive");
  CHECK(d0["pools"][1]["device_allocs"].num() == 1);
  CHECK(d0["pools"][1]["bytes_pending"].num() == 104 * KiB);
  CHECK(d0["pools"][2]["kind"].str() == "direct");
  CHECK(d0["pools"][3]["index"].str() == "P");
  CHECK(d0["pools"][3]["kind"].str() == "persistent");
  CHECK(d0["pools"][3]["bytes_in_use"].num() == 3000);
  CHECK(d0["pools"][3]["reservations"].num() == 1);
  // The live sizes: 1000 B and 3000 B are live (the 100 KiB slice was freed).
  REQUIRE(d0["live_sizes"].size() == 2);
  CHECK(d0["live_sizes"][0]["up_to"].num() == 1024);
  CHECK(d0["live_sizes"][0]["bytes"].num() == 1000);
  CHECK(d0["live_sizes"][1]["up_to"].num() == 4096);
  CHECK(d0["live_sizes"][1]["slices"].num() == 1);
  // The summary adds both devices.
  CHECK(doc["summary"]["devices"].num() == 2);
  CHECK(doc["summary"]["bytes_in_use"].num() == 2.0 * static_cast<double>(r.bytes_in_use));
}

TEST_CASE("report_says_how_freed_memory_is_reused") {
  auto reuse_of = [](FreeFence fence, bool stream_ordered) {
    Rig rig(preset(PoolPreset::subslices), 512, 1 * GiB, fence);
    rig.manager.set_stream_ordered(stream_ordered);
    Json doc = JsonReader(render_report(ReportHeader{1, 1, "request"}, {rig.manager.report()},
                                        ReportFormat::json))
                   .document();
    return doc["devices"][0]["fences"]["reuse"].str();
  };
  CHECK(reuse_of(FreeFence::automatic, true) == "ordered");
  CHECK(reuse_of(FreeFence::automatic, false) == "fenced");
  CHECK(reuse_of(FreeFence::events, false) == "fenced");
  CHECK(reuse_of(FreeFence::events, true) == "fenced");  // only auto follows the stream order
  CHECK(reuse_of(FreeFence::sync, false) == "synchronized");
  CHECK(reuse_of(FreeFence::none, false) == "unfenced");
  // In text too, on the fences line.
  Rig rig(preset(PoolPreset::subslices), 512, 1 * GiB, FreeFence::automatic);
  rig.manager.set_stream_ordered(true);
  const std::string text =
      render_report(ReportHeader{1, 1, "request"}, {rig.manager.report()}, ReportFormat::text);
  CHECK(text.find("  fences: waits 0") != std::string::npos);
  CHECK(text.find("reuse ordered") != std::string::npos);
}

TEST_CASE("json_report_of_no_manager_is_valid") {
  const std::string text = render_report(ReportHeader{1, 1, "exit"}, {}, ReportFormat::json);
  CHECK(parses(text));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(line);
  return rows;
}

// The rows of the text pool table: from its title row to the line before the next section.
std::vector<std::string> pool_table(const std::vector<std::string>& rows) {
  std::vector<std::string> table;
  bool inside = false;
  for (const std::string& row : rows) {
    if (row == "  pools:") {
      inside = true;
    } else if (inside && row.rfind("    ", 0) == 0) {
      table.push_back(row);
    } else if (inside) {
      break;
    }
  }
  return table;
}

TEST_CASE("text_report_has_a_header_a_summary_and_one_aligned_row_per_pool") {
  Rig rig(preset(PoolPreset::subslices), 512, 1 * GiB);
  REQUIRE(rig.reserve(3 * KiB) != 0);
  REQUIRE(rig.reserve(20 * MiB) != 0);
  const ManagerReport r = rig.manager.report();
  const std::vector<std::string> rows = lines_of(
      render_report(ReportHeader{77, 1, "request", 1764547200, 65}, {r}, ReportFormat::text));
  CHECK(rows[0] == "poolcuda report #1 (pid 77, request) 2025-12-01 00:00:00 UTC, up 1m 5s");
  CHECK(rows[1] == "summary: in use 20.0 MiB, peak in use 20.0 MiB, reserved 22.0 MiB, "
                   "peak reserved 22.0 MiB,");
  CHECK(rows[2] == "    peak reserved/in use 1.10");
  CHECK(rows[3] == "device 0:");
  CHECK(rows[4].find("  memory: in use 20.0 MiB, slices 2") == 0);
  const std::vector<std::string> table = pool_table(rows);
  REQUIRE(table.size() == 1 + r.dynamic.size() + 1);
  CHECK(table[0].find("kind") != std::string::npos);
  CHECK(table[0].find("largest free") != std::string::npos);
  CHECK(table[0].find("allocs") == std::string::npos);  // a wide column
  CHECK(table[1].find("sliced") != std::string::npos);
  CHECK(table[1].find("2.00 MiB") != std::string::npos);
  CHECK(table.back().find("persistent") != std::string::npos);
  // The columns line up: every row ends where the title row ends (right-aligned numbers).
  for (const std::string& row : table) CHECK(row.size() == table[0].size());
  // Narrow text fits 100 columns.
  for (const std::string& row : rows) CHECK_MESSAGE(row.size() <= 100, row);
}

TEST_CASE("text_report_lists_live_sizes_only_while_something_lives") {
  Rig rig(preset(PoolPreset::subslices), 512, 1 * GiB);
  const DevicePtr p = rig.reserve(3 * KiB);
  REQUIRE(p != 0);
  auto live_sizes_heading = [&] {
    const std::string text = render_report(ReportHeader{77, 1, "request", 0, 1},
                                           {rig.manager.report()}, ReportFormat::text);
    return text.find("live slices by size") != std::string::npos;
  };
  CHECK(live_sizes_heading());
  rig.manager.set_mode(AllocationMode::automatic);
  rig.manager.free(p);
  CHECK_FALSE(live_sizes_heading());  // no heading over an empty list
}

TEST_CASE("wide_text_adds_the_detail_columns") {
  Rig rig(custom({sliced(2048, 0, 512, 5000), exclusive(1 * GiB, 123456789)}), 32);
  REQUIRE(rig.reserve(100) != 0);
  const std::vector<std::string> table = pool_table(lines_of(
      render_report(ReportHeader{1, 2, "exit"}, {rig.manager.report()}, ReportFormat::wide)));
  REQUIRE(table.size() == 4);
  CHECK(table[0].find("allocs") != std::string::npos);
  CHECK(table[1].find("page shrunk to the cap, period=5000") != std::string::npos);
  CHECK(table[2].find("period=123456789") != std::string::npos);
}

TEST_CASE("manager_peaks_follow_the_high_water_marks_and_restart_with_a_layout") {
  Rig rig(custom({sliced(4096)}), 512);
  const DevicePtr a = rig.reserve(1000);
  const DevicePtr b = rig.reserve(1000);
  const DevicePtr c = rig.reserve(3000);  // a second page: 8 KiB reserved
  REQUIRE((a != 0 && b != 0 && c != 0));
  CHECK(rig.manager.free(b) == FreeOutcome::freed);
  CHECK(rig.manager.free(c) == FreeOutcome::freed);
  ManagerReport r = rig.manager.report();
  CHECK(r.bytes_in_use == 1000);
  CHECK(r.bytes_in_use_peak == 5000);
  CHECK(r.bytes_reserved_peak == 8192);
  CHECK(rig.manager.check_consistency().empty());
  Json json;
  REQUIRE_NOTHROW(json = JsonReader(render_report(ReportHeader{1, 1, "request"}, {r},
                                                  ReportFormat::json))
                             .document());
  CHECK(json["devices"][0]["peaks"]["bytes_in_use_peak"].num() == 5000);
  CHECK(json["devices"][0]["peaks"]["bytes_reserved_peak"].num() == 8192);

  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  REQUIRE(!rig.manager.install_layout(custom({sliced(4096)})));
  r = rig.manager.report();
  CHECK(r.bytes_in_use_peak == 0);
  CHECK(r.bytes_reserved_peak == 0);
  REQUIRE(rig.reserve(2000) != 0);
  CHECK(rig.manager.report().bytes_in_use_peak == 2000);
}

TEST_CASE("idle_pages_and_holes_are_told_apart") {
  Rig rig(custom({sliced(4096)}), 512, 128 * MiB, FreeFence::none);
  const DevicePtr a = rig.reserve(1024);
  const DevicePtr b = rig.reserve(1024);
  const DevicePtr c = rig.reserve(4096);  // a page of its own
  REQUIRE((a != 0 && b != 0 && c != 0));
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.manager.free(c) == FreeOutcome::freed);
  const ManagerReport r = rig.manager.report();
  CHECK(r.idle_bytes == 4096);            // c's page is whole and idle
  CHECK(r.hole_bytes == 4096 - 1024);     // around b, in a page b keeps
  CHECK(rig.manager.idle_bytes() == 4096);
}

}  // TEST_SUITE
