// Manager snapshots as report sections (see report.h). Everything here expands the X-macro
// lists, so the sections always carry exactly the declared numbers.
#include "pools/report.h"

#include <string_view>

namespace poolcuda {

namespace {

template <typename T>
ReportValue value_of(Unit unit, T number) {
  if constexpr (std::is_floating_point_v<T>) {
    return unit == Unit::seconds ? ReportValue::duration(number) : ReportValue::fraction(number);
  } else {
    return ReportValue::of(unit, number);
  }
}

std::vector<ReportColumn> pool_columns() {
  std::vector<ReportColumn> columns = {
      {"index", "#", Detail::normal, true},
      {"kind", "kind", Detail::normal, false},
      {"shape", "shape", Detail::normal, false},
  };
#define POOLCUDA_COLUMN(member, label, unit, detail) \
  columns.push_back({#member, label, Detail::detail, true});
  POOLCUDA_POOL_NUMBERS(POOLCUDA_COLUMN)
#undef POOLCUDA_COLUMN
  columns.push_back({"notes", "notes", Detail::wide, false});
  return columns;
}

std::vector<ReportValue> pool_row(const std::string& index, const PoolReport& p) {
  std::vector<ReportValue> row = {ReportValue::words(index), ReportValue::words(p.kind),
                                  ReportValue::words(p.shape)};
#define POOLCUDA_CELL(member, label, unit, detail) row.push_back(value_of(Unit::unit, p.member));
  POOLCUDA_POOL_NUMBERS(POOLCUDA_CELL)
#undef POOLCUDA_CELL
  row.push_back(ReportValue::words(p.notes));
  return row;
}

std::string_view group_title(std::string_view group) {
  if (group == "out_of_memory") return "out of memory";
  if (group == "held") return "held bound";
  // Everything idle given back before host functions and refused cudaMallocAsync calls.
  if (group == "given_back") return "all idle given back";
  if (group == "thread_caches") return "thread caches";
  return group;
}

ReportTable size_table(const SizeHistogram& h) {
  ReportTable table{"live_sizes",
                    {{"up_to", "size up to", Detail::normal, true},
                     {"slices", "slices", Detail::normal, true},
                     {"bytes", "bytes", Detail::normal, true}},
                    {}};
  for (std::size_t i = 0; i < kSizeBuckets; ++i) {
    if (h.slices[i] == 0) continue;
    table.rows.push_back({ReportValue::of(Unit::bytes, std::uint64_t{1} << i),
                          ReportValue::of(Unit::count, h.slices[i]),
                          ReportValue::of(Unit::bytes, h.bytes[i])});
  }
  return table;
}

}  // namespace

ReportSection describe(const ManagerReport& m) {
  ReportSection device{"device", "device " + std::to_string(m.device), {}, {}, {}};
  device.add("device", "", ReportValue::of(Unit::count, static_cast<std::uint64_t>(m.device)),
             Detail::json);
#define POOLCUDA_GROUPED_FIELD(group, member, label, unit, detail)              \
  device.child(#group, group_title(#group))                                      \
      .add(#member, label, value_of(Unit::unit, m.member), Detail::detail);
  POOLCUDA_MANAGER_NUMBERS(POOLCUDA_GROUPED_FIELD)
#undef POOLCUDA_GROUPED_FIELD
  device.child("fences", "fences").add("reuse", "reuse", ReportValue::words(m.reuse));
  ReportSection& pools = device.child("pools", "pools");
  ReportTable table{"table", pool_columns(), {}};
  for (std::size_t i = 0; i < m.dynamic.size(); ++i)
    table.rows.push_back(pool_row(std::to_string(i), m.dynamic[i]));
  table.rows.push_back(pool_row("P", m.persistent));
  pools.tables.push_back(std::move(table));
  ReportSection& sizes = device.child("live_sizes", "live slices by size");
  sizes.tables.push_back(size_table(m.live_sizes));
  return device;
}

ReportSection summarize(const std::vector<ManagerReport>& managers) {
  std::uint64_t in_use = 0, reserved = 0, in_use_peak = 0, reserved_peak = 0;
  for (const ManagerReport& m : managers) {
    in_use += m.bytes_in_use;
    reserved += m.bytes_reserved;
    in_use_peak += m.bytes_in_use_peak;
    reserved_peak += m.bytes_reserved_peak;
  }
  ReportSection s{"summary", "summary", {}, {}, {}};
  s.add("devices", "devices", ReportValue::of(Unit::count, managers.size()), Detail::json);
  s.add("bytes_in_use", "in use", ReportValue::of(Unit::bytes, in_use));
  s.add("bytes_in_use_peak", "peak in use", ReportValue::of(Unit::bytes, in_use_peak));
  s.add("bytes_reserved", "reserved", ReportValue::of(Unit::bytes, reserved));
  s.add("bytes_reserved_peak", "peak reserved", ReportValue::of(Unit::bytes, reserved_peak));
  // The pools' memory overhead at its worst: what they held at peak per byte the program held.
  s.add("overhead", "peak reserved/in use",
        ReportValue::fraction(in_use_peak == 0 ? 0.0
                                               : static_cast<double>(reserved_peak) /
                                                     static_cast<double>(in_use_peak)));
  return s;
}

ReportDocument make_document(const ReportHeader& header,
                             const std::vector<ManagerReport>& managers) {
  ReportDocument d;
  d.header = header;
  d.summary = summarize(managers);
  for (const ManagerReport& m : managers) d.devices.push_back(describe(m));
  d.empty_note = "no device has pools yet";
  return d;
}

std::string render_report(const ReportHeader& header, const std::vector<ManagerReport>& managers,
                          ReportFormat format) {
  return render(make_document(header, managers), format);
}

}  // namespace poolcuda
