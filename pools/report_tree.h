// The report model every part of the library reports through: a document of sections holding
// named values and tables, built from snapshots (never under a lock that an allocation needs),
// and the one emitter that writes a document as text (narrow or wide) or as JSON. A counter is
// declared once, in the X-macro list of the snapshot that owns it (report.h for the pools; the
// interposer, the capture layer and the managed slabs have lists of their own); the lists turn
// into sections here, so both formats always carry the same numbers.
// Depends on options.h (ReportFormat) only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pools/options.h"

namespace poolcuda {

enum class Unit : std::uint8_t {
  count,    // a plain number
  bytes,    // shown as "1.50 MiB" in text, exact in JSON
  ratio,    // a fraction, two decimals
  seconds,  // a duration in seconds
  text,     // a string
  address,  // a device address, hexadecimal in both formats
};

// Where a value appears: `normal` in text and JSON, `wide` in JSON and in wide text only,
// `json` in JSON only (configuration echoes and exact figures a person does not need).
enum class Detail : std::uint8_t { normal, wide, json };

struct ReportValue {
  Unit unit = Unit::count;
  std::uint64_t number = 0;  // count, bytes, address
  double real = 0;           // ratio, seconds
  std::string text;          // text

  static ReportValue of(Unit unit, std::uint64_t number) { return {unit, number, 0, {}}; }
  static ReportValue fraction(double value) { return {Unit::ratio, 0, value, {}}; }
  static ReportValue duration(double seconds) { return {Unit::seconds, 0, seconds, {}}; }
  static ReportValue words(std::string text) { return {Unit::text, 0, 0, std::move(text)}; }
};

struct ReportField {
  std::string key;    // JSON key, snake_case
  std::string label;  // text label
  ReportValue value;
  Detail detail = Detail::normal;
};

struct ReportColumn {
  std::string key;
  std::string label;
  Detail detail = Detail::normal;
  bool right = true;  // numbers align right, words left
};

// Rows of values under shared columns (one row per pool, per histogram bucket...). In JSON a
// table is an array of objects keyed by the column keys.
struct ReportTable {
  std::string key;
  std::vector<ReportColumn> columns;
  std::vector<std::vector<ReportValue>> rows;
};

// A named group: fields on one (wrapped) text line "title: label value, ...", then its tables
// and nested sections indented below. In JSON an object with the same keys.
struct ReportSection {
  std::string key;
  std::string title;
  std::vector<ReportField> fields;
  std::vector<ReportTable> tables;
  std::vector<ReportSection> sections;

  // Appends a field (the common case in the X-macro expansions).
  void add(std::string key, std::string label, ReportValue value,
           Detail detail = Detail::normal);
  // The child section with this key, created (empty, with `title`) if absent.
  ReportSection& child(std::string_view key, std::string_view title);
};

struct ReportHeader {
  long pid = 0;
  std::uint64_t sequence = 0;   // 1 for the first report of the process
  std::string reason;           // "signal", "exit", "request"
  std::int64_t unix_time = 0;   // when the report was taken (0: not known)
  double uptime_seconds = 0;    // since the library loaded
};

struct ReportDocument {
  ReportHeader header;
  ReportSection summary;                // one line across every device
  std::vector<ReportSection> devices;   // one per device with pools, in device order
  std::string empty_note;               // the text line shown when `devices` is empty
};

// Renders a document. Text lines are at most about 100 columns unless a single word is longer;
// the wide format adds the `wide` fields and columns; JSON is one valid JSON object.
std::string render(const ReportDocument& document, ReportFormat format);

// "0 B", "512 B", "1.50 KiB", "64.0 MiB": three significant figures in binary units.
std::string human_bytes(std::uint64_t bytes);

// "250 us", "12.5 ms", "3.25 s", "2m 5s", "1h 0m 0s".
std::string text_duration(double seconds);

}  // namespace poolcuda
