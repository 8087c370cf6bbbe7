// The managed section of a report: render_managed_text and render_managed_json (declared in
// managed_slabs.h). Self-contained, so the report emitter calls one function per format and
// nothing else needs to know the section's layout. Works on a snapshot only, never under a lock.
// Depends on managed_slabs.h and config.h (format_size).
#include <cinttypes>
#include <cstdio>

#include "pools/config.h"
#include "pools/managed_slabs.h"

namespace poolcuda {

namespace {

std::string hex(DevicePtr address) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%" PRIx64, address);
  return buffer;
}

std::string size_text(std::uint64_t bytes) { return bytes == 0 ? "0" : format_size(bytes); }

void field(std::string& out, const char* name, std::uint64_t value, bool comma = true) {
  out += '"';
  out += name;
  out += "\":";
  out += std::to_string(value);
  if (comma) out += ',';
}

}  // namespace

std::string render_managed_text(const ManagedReport& r) {
  std::string out = "  managed: " + std::to_string(r.slabs.size()) + " slabs of " +
                    size_text(r.slab_size) + " (at most " + std::to_string(r.max_slabs) +
                    "), " + std::to_string(r.live_allocations) + " live, issued " +
                    size_text(r.issued_total) + " in total, " + std::to_string(r.resets) +
                    " resets, " + std::to_string(r.slabs_allocated) + " slabs allocated / " +
                    std::to_string(r.slabs_released) + " released, passed through " +
                    std::to_string(r.passed_through) + " cudaMallocManaged\n";
  for (const ManagedSlabReport& s : r.slabs) {
    out += "    slab " + hex(s.base) + ": capacity " + size_text(s.capacity) + ", bump " +
           size_text(s.bump) + ", dirty " + size_text(s.dirty) + ", live " +
           std::to_string(s.live) + ", issued " + size_text(s.issued) + ", resets " +
           std::to_string(s.resets) + "\n";
  }
  return out;
}

std::string render_managed_json(const ManagedReport& r) {
  std::string out = "{";
  field(out, "slab_size", r.slab_size);
  field(out, "max_slabs", r.max_slabs);
  field(out, "live_allocations", r.live_allocations);
  field(out, "issued_total", r.issued_total);
  field(out, "resets", r.resets);
  field(out, "slabs_allocated", r.slabs_allocated);
  field(out, "slabs_released", r.slabs_released);
  field(out, "passed_through", r.passed_through);
  out += "\"slabs\":[";
  for (std::size_t i = 0; i < r.slabs.size(); ++i) {
    const ManagedSlabReport& s = r.slabs[i];
    if (i != 0) out += ',';
    out += '{';
    field(out, "base", s.base);
    field(out, "capacity", s.capacity);
    field(out, "bump", s.bump);
    field(out, "dirty", s.dirty);
    field(out, "live", s.live);
    field(out, "issued", s.issued);
    field(out, "resets", s.resets, false);
    out += '}';
  }
  out += "]}";
  return out;
}

}  // namespace poolcuda
