// render_report: the one emitter for manager reports, as aligned text for a terminal or as one
// JSON object. Works on snapshots only (report.h), so it never runs under a manager's lock.
// Depends on report.h only (the managed section renders itself: managed_report.cpp).
#include "pools/report.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

namespace poolcuda {

namespace {

// "0 B", "512 B", "1.5 KiB", "64.0 MiB": three significant figures in binary units.
std::string human(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  constexpr std::string_view kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, value < 10 ? "%.2f %s" : value < 100 ? "%.1f %s" : "%.0f %s",
                value, std::string(kUnits[unit]).c_str());
  return buffer;
}

std::string pad(std::string text, std::size_t width, bool right) {
  if (text.size() >= width) return text;
  const std::string fill(width - text.size(), ' ');
  return right ? fill + text : text + fill;
}

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

void json_field(std::string& out, std::string_view name, std::uint64_t value, bool comma = true) {
  json_string(out, name);
  out += ':';
  out += std::to_string(value);
  if (comma) out += ',';
}

void json_usage(std::string& out, std::string_view name, const MemoryUsage& u) {
  json_string(out, name);
  out += ":{";
  json_field(out, "number_allocs", u.number_allocs);
  json_field(out, "bytes_in_use", u.bytes_in_use);
  json_field(out, "bytes_padding", u.bytes_padding);
  json_field(out, "bytes_reserved", u.bytes_reserved, false);
  out += '}';
}

void json_pool(std::string& out, const PoolReport& p) {
  out += '{';
  json_string(out, "kind");
  out += ':';
  json_string(out, p.kind);
  out += ',';
  json_string(out, "shape");
  out += ':';
  json_string(out, p.shape);
  out += ',';
  json_field(out, "page_size", p.page_size);
  json_field(out, "max_slice_size", p.max_slice_size);
  json_field(out, "cap", p.cap);
  json_field(out, "pages", p.pages);
  json_field(out, "slices", p.slices);
  json_usage(out, "usage", p.usage);
  out += ',';
  json_field(out, "pages_peak", p.pages_peak);
  json_field(out, "bytes_peak", p.bytes_peak);
  json_field(out, "largest_free", p.largest_free);
  json_field(out, "reservations", p.reservations);
  json_field(out, "device_allocs", p.device_allocs);
  json_field(out, "device_releases", p.device_releases, false);
  out += '}';
}

std::string render_json(const ReportHeader& header, const std::vector<ManagerReport>& managers) {
  std::string out = "{";
  json_field(out, "pid", static_cast<std::uint64_t>(header.pid));
  json_field(out, "sequence", header.sequence);
  json_string(out, "reason");
  out += ':';
  json_string(out, header.reason);
  out += ",\"devices\":[";
  for (std::size_t d = 0; d < managers.size(); ++d) {
    const ManagerReport& m = managers[d];
    if (d != 0) out += ',';
    out += '{';
    json_field(out, "device", static_cast<std::uint64_t>(m.device));
    json_usage(out, "totals", m.totals);
    out += ',';
    json_field(out, "pending_fence_bytes", m.pending_fence_bytes);
    json_field(out, "idle_bytes", m.idle_bytes);
    json_field(out, "oom_recoveries", m.oom_recoveries);
    json_field(out, "oom_failures", m.oom_failures);
    json_field(out, "bytes_in_use_peak", m.bytes_in_use_peak);
    json_field(out, "bytes_reserved_peak", m.bytes_reserved_peak);
    json_field(out, "fence_waits", m.fence_waits);
    json_field(out, "fence_wait_timeouts", m.fence_wait_timeouts);
    json_field(out, "forwarded_mallocs", m.forwarded_mallocs);
    json_field(out, "forwarded_frees", m.forwarded_frees);
    out += "\"pools\":[";
    for (std::size_t i = 0; i < m.dynamic.size(); ++i) {
      if (i != 0) out += ',';
      json_pool(out, m.dynamic[i]);
    }
    out += "],\"persistent\":";
    json_pool(out, m.persistent);
    if (m.managed) {
      out += ",\"managed\":";
      out += render_managed_json(*m.managed);
    }
    out += '}';
  }
  out += "]}\n";
  return out;
}

struct Column {
  std::string_view title;
  bool right;  // numbers align right
};

constexpr Column kColumns[] = {
    {"#", true},          {"kind", false},        {"shape", false},     {"pages", true},
    {"peak", true},       {"slices", true},       {"reserved", true},   {"in use", true},
    {"padding", true},    {"bytes peak", true},   {"largest free", true}, {"reserv.", true},
    {"allocs", true},     {"releases", true},
};

using Row = std::vector<std::string>;

Row pool_row(const std::string& number, const PoolReport& p) {
  return {number, p.kind, p.shape, std::to_string(p.pages), std::to_string(p.pages_peak),
          std::to_string(p.slices), human(p.usage.bytes_reserved), human(p.usage.bytes_in_use),
          human(p.usage.bytes_padding), human(p.bytes_peak), human(p.largest_free),
          std::to_string(p.reservations), std::to_string(p.device_allocs),
          std::to_string(p.device_releases)};
}

// Each column is as wide as its widest cell, so every row of a table has the same width.
void table(std::string& out, const std::vector<Row>& rows) {
  std::vector<std::size_t> width(std::size(kColumns), 0);
  for (const Row& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  for (const Row& row : rows) {
    out += ' ';
    for (std::size_t i = 0; i < row.size(); ++i) {
      out += ' ';
      out += pad(row[i], width[i], kColumns[i].right);
    }
    out += '\n';
  }
}

std::string render_text(const ReportHeader& header, const std::vector<ManagerReport>& managers) {
  std::string out = "poolcuda report #" + std::to_string(header.sequence) + " (pid " +
                    std::to_string(header.pid) + ", " + header.reason + ")\n";
  if (managers.empty()) out += "  no device has pools yet\n";
  for (const ManagerReport& m : managers) {
    const MemoryUsage& t = m.totals;
    out += "device " + std::to_string(m.device) + ": reserved " + human(t.bytes_reserved) +
           ", in use " + human(t.bytes_in_use) + " in " + std::to_string(t.number_allocs) +
           " slices (+" + human(t.bytes_padding) + " padding), idle " + human(m.idle_bytes) +
           ", pending fence " + human(m.pending_fence_bytes) + ", out-of-memory recovered " +
           std::to_string(m.oom_recoveries) + " / failed " + std::to_string(m.oom_failures) +
           ", passed through " + std::to_string(m.forwarded_mallocs) + " cudaMalloc / " +
           std::to_string(m.forwarded_frees) + " cudaFree\n";
    out += "  peak in use " + human(m.bytes_in_use_peak) + ", peak reserved " +
           human(m.bytes_reserved_peak) + "; fence waits " + std::to_string(m.fence_waits) + " (" +
           std::to_string(m.fence_wait_timeouts) + " hit the time bound)\n";
    std::vector<Row> rows;
    Row titles;
    for (const Column& c : kColumns) titles.emplace_back(c.title);
    rows.push_back(std::move(titles));
    for (std::size_t i = 0; i < m.dynamic.size(); ++i)
      rows.push_back(pool_row(std::to_string(i), m.dynamic[i]));
    rows.push_back(pool_row("P", m.persistent));
    table(out, rows);
    if (m.managed) out += render_managed_text(*m.managed);
  }
  return out;
}

}  // namespace

std::string render_report(const ReportHeader& header, const std::vector<ManagerReport>& managers,
                          ReportFormat format) {
  return format == ReportFormat::json ? render_json(header, managers)
                                      : render_text(header, managers);
}

}  // namespace poolcuda
