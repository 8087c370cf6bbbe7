// The managed section of a report (describe(const ManagedReport&), declared in
// managed_slabs.h): every number comes from the X-macro lists beside the snapshot, so a new one
// is one line there. Works on a snapshot only, never under a lock.
//
// Depends on managed_slabs.h and report_tree.h.
#include "pools/managed_slabs.h"

namespace poolcuda {

ReportSection describe(const ManagedReport& report) {
  ReportSection section{"managed", "managed slabs", {}, {}, {}};
#define POOLCUDA_MANAGED_FIELD(member, label, unit, detail) \
  section.add(#member, label, ReportValue::of(Unit::unit, report.member), Detail::detail);
  POOLCUDA_MANAGED_NUMBERS(POOLCUDA_MANAGED_FIELD)
#undef POOLCUDA_MANAGED_FIELD
  ReportTable table;
  table.key = "slabs";
#define POOLCUDA_MANAGED_COLUMN(member, label, unit, detail) \
  table.columns.push_back({#member, label, Detail::detail, true});
  POOLCUDA_MANAGED_SLAB_NUMBERS(POOLCUDA_MANAGED_COLUMN)
#undef POOLCUDA_MANAGED_COLUMN
  for (const ManagedSlabReport& slab : report.slabs) {
    std::vector<ReportValue>& row = table.rows.emplace_back();
#define POOLCUDA_MANAGED_CELL(member, label, unit, detail) \
  row.push_back(ReportValue::of(Unit::unit, slab.member));
    POOLCUDA_MANAGED_SLAB_NUMBERS(POOLCUDA_MANAGED_CELL)
#undef POOLCUDA_MANAGED_CELL
  }
  section.tables.push_back(std::move(table));
  return section;
}

}  // namespace poolcuda
