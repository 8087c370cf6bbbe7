// The one report emitter (see report_tree.h): text for a terminal, narrow (at most about 100
// columns) or wide, and JSON. Works on a finished document only, so it never runs under a lock
// an allocation needs.
#include "pools/report_tree.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace poolcuda {

namespace {

constexpr std::size_t kTextWidth = 100;

bool shown(Detail detail, ReportFormat format) {
  switch (detail) {
    case Detail::normal: return true;
    case Detail::wide: return format != ReportFormat::text;
    case Detail::json: return format == ReportFormat::json;
  }
  return true;
}

std::string printf_string(const char* format, double value) {
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

std::string hex(std::uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%" PRIx64, value);
  return buffer;
}

std::string text_value(const ReportValue& v) {
  switch (v.unit) {
    case Unit::count: return std::to_string(v.number);
    case Unit::bytes: return human_bytes(v.number);
    case Unit::ratio: return printf_string("%.2f", v.real);
    case Unit::seconds: return text_duration(v.real);
    case Unit::text: return v.text;
    case Unit::address: return hex(v.number);
  }
  return {};
}

// --- JSON ----------------------------------------------------------------------------------------

void json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const ReportValue& v) {
  switch (v.unit) {
    case Unit::count:
    case Unit::bytes:
      out += std::to_string(v.number);
      return;
    case Unit::ratio:
    case Unit::seconds:
      out += std::isfinite(v.real) ? printf_string("%.6g", v.real) : "null";
      return;
    case Unit::text:
      json_string(out, v.text);
      return;
    case Unit::address:
      json_string(out, hex(v.number));
      return;
  }
}

void json_key(std::string& out, bool& first, std::string_view key) {
  if (!first) out += ',';
  first = false;
  json_string(out, key);
  out += ':';
}

void json_table(std::string& out, const ReportTable& t) {
  out += '[';
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    if (r != 0) out += ',';
    out += '{';
    bool first_cell = true;
    for (std::size_t c = 0; c < t.columns.size() && c < t.rows[r].size(); ++c) {
      json_key(out, first_cell, t.columns[c].key);
      json_value(out, t.rows[r][c]);
    }
    out += '}';
  }
  out += ']';
}

// A section that is only a table (the pools, the size histogram) is that table's array.
void json_section(std::string& out, const ReportSection& section) {
  if (section.fields.empty() && section.sections.empty() && section.tables.size() == 1) {
    json_table(out, section.tables.front());
    return;
  }
  out += '{';
  bool first = true;
  for (const ReportField& f : section.fields) {
    json_key(out, first, f.key);
    json_value(out, f.value);
  }
  for (const ReportTable& t : section.tables) {
    json_key(out, first, t.key);
    json_table(out, t);
  }
  for (const ReportSection& child : section.sections) {
    json_key(out, first, child.key);
    json_section(out, child);
  }
  out += '}';
}

std::string utc_time(std::int64_t unix_time, bool iso) {
  const std::time_t t = static_cast<std::time_t>(unix_time);
  std::tm parts{};
  gmtime_r(&t, &parts);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, iso ? "%Y-%m-%dT%H:%M:%SZ" : "%Y-%m-%d %H:%M:%S UTC",
                &parts);
  return buffer;
}

std::string render_json(const ReportDocument& d) {
  std::string out = "{";
  bool first = true;
  json_key(out, first, "pid");
  out += std::to_string(d.header.pid);
  json_key(out, first, "sequence");
  out += std::to_string(d.header.sequence);
  json_key(out, first, "reason");
  json_string(out, d.header.reason);
  if (d.header.unix_time != 0) {
    json_key(out, first, "time");
    json_string(out, utc_time(d.header.unix_time, true));
  }
  json_key(out, first, "uptime_seconds");
  json_value(out, ReportValue::duration(d.header.uptime_seconds));
  json_key(out, first, "summary");
  json_section(out, d.summary);
  json_key(out, first, "devices");
  out += '[';
  for (std::size_t i = 0; i < d.devices.size(); ++i) {
    if (i != 0) out += ',';
    json_section(out, d.devices[i]);
  }
  out += "]}\n";
  return out;
}

// --- Text ----------------------------------------------------------------------------------------

// Writes `items` after `head`, separated by ", ", wrapping before kTextWidth with continuation
// lines indented by `indent` + 4.
void wrapped_line(std::string& out, const std::string& head, const std::vector<std::string>& items,
                  std::size_t indent) {
  std::string line = head;
  bool first = true;
  for (const std::string& item : items) {
    const std::string piece = first ? item : ", " + item;
    if (!first && line.size() + piece.size() > kTextWidth) {
      out += line + ",\n";
      line = std::string(indent + 4, ' ') + item;
    } else {
      line += piece;
    }
    first = false;
  }
  out += line + '\n';
}

void text_table(std::string& out, const ReportTable& table, std::size_t indent,
                ReportFormat format) {
  std::vector<std::size_t> visible;
  for (std::size_t c = 0; c < table.columns.size(); ++c)
    if (shown(table.columns[c].detail, format)) visible.push_back(c);
  std::vector<std::vector<std::string>> cells;
  cells.emplace_back();
  for (std::size_t c : visible) cells.back().push_back(table.columns[c].label);
  for (const auto& row : table.rows) {
    cells.emplace_back();
    for (std::size_t c : visible) cells.back().push_back(c < row.size() ? text_value(row[c]) : "");
  }
  std::vector<std::size_t> width(visible.size(), 0);
  for (const auto& row : cells)
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  for (const auto& row : cells) {
    std::string line(indent, ' ');
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i != 0) line += "  ";
      const std::size_t fill = width[i] - row[i].size();
      const bool right = table.columns[visible[i]].right;
      line += right ? std::string(fill, ' ') + row[i] : row[i] + std::string(fill, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
}

void text_section(std::string& out, const ReportSection& section, std::size_t indent,
                  ReportFormat format) {
  std::vector<std::string> items;
  for (const ReportField& f : section.fields) {
    if (!shown(f.detail, format)) continue;
    const std::string value = text_value(f.value);
    items.push_back(f.label.empty() ? value : f.label + " " + value);
  }
  const std::string head = std::string(indent, ' ') + section.title;
  if (!items.empty()) {
    wrapped_line(out, head + ": ", items, indent);
  } else if (!section.sections.empty() ||
             std::any_of(section.tables.begin(), section.tables.end(),
                         [](const ReportTable& t) { return !t.rows.empty(); })) {
    out += head + ":\n";  // a heading over nothing (no live slice to list) is left out
  }
  for (const ReportTable& table : section.tables)
    if (!table.rows.empty()) text_table(out, table, indent + 2, format);
  for (const ReportSection& child : section.sections) text_section(out, child, indent + 2, format);
}

std::string render_text(const ReportDocument& d, ReportFormat format) {
  std::string out = "poolcuda report #" + std::to_string(d.header.sequence) + " (pid " +
                    std::to_string(d.header.pid) + ", " + d.header.reason + ")";
  if (d.header.unix_time != 0) {
    out += ' ';
    out += utc_time(d.header.unix_time, false);
  }
  out += ", up ";
  out += text_duration(d.header.uptime_seconds);
  out += '\n';
  if (d.devices.empty()) {
    out += "  " + d.empty_note + "\n";
    return out;
  }
  text_section(out, d.summary, 0, format);
  for (const ReportSection& device : d.devices) text_section(out, device, 0, format);
  return out;
}

}  // namespace

void ReportSection::add(std::string field_key, std::string label, ReportValue value,
                        Detail detail) {
  fields.push_back(ReportField{std::move(field_key), std::move(label), std::move(value), detail});
}

ReportSection& ReportSection::child(std::string_view child_key, std::string_view child_title) {
  for (ReportSection& s : sections)
    if (s.key == child_key) return s;
  sections.push_back(ReportSection{std::string(child_key), std::string(child_title), {}, {}, {}});
  return sections.back();
}

std::string human_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  constexpr std::string_view kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  // The decimals for three significant figures, picked from the value as rounded: 10,239 B is
  // 10.0 KiB, not 10.00, and 1,048,575 B is 1.00 MiB, not 1024 KiB.
  const auto decimals = [](double v) { return v < 10 ? 2 : v < 100 ? 1 : 0; };
  const auto rounded = [](double v, int places) {
    const double scale = places == 2 ? 100.0 : places == 1 ? 10.0 : 1.0;
    return std::round(v * scale) / scale;
  };
  int places = decimals(rounded(value, decimals(value)));
  if (rounded(value, places) >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
    places = 2;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f %s", places, value,
                std::string(kUnits[unit]).c_str());
  return buffer;
}

std::string text_duration(double seconds) {
  // Rounded before the unit is picked: 999.7 us reads 1.0 ms, not 1000 us.
  if (std::round(seconds * 1e6) < 1000) return printf_string("%.0f us", seconds * 1e6);
  if (std::round(seconds * 1e4) < 10000) return printf_string("%.1f ms", seconds * 1e3);
  if (std::round(seconds * 1e2) < 6000) return printf_string("%.2f s", seconds);
  const auto whole = static_cast<std::uint64_t>(std::round(seconds));
  std::string out;
  if (whole >= 3600) out += std::to_string(whole / 3600) + "h ";
  out += std::to_string(whole / 60 % 60) + "m " + std::to_string(whole % 60) + "s";
  return out;
}

std::string render(const ReportDocument& document, ReportFormat format) {
  return format == ReportFormat::json ? render_json(document) : render_text(document, format);
}

}  // namespace poolcuda
