// The cross-stream race detector. Every stream operation declares the device byte ranges it reads
// and writes; while it executes it is "active". When an operation starts while an active
// operation of another stream overlaps it and at least one of the two writes, the two ran with no
// ordering between them (an ordered pair never executes at the same time): that is a race.
// Races are counted, described (both operations), printed at exit, and abort the process in
// strict mode. Leaf module: its own mutex only.
#include "core.h"

#include <cstdio>
#include <cstdlib>

namespace poolcuda::sim {
namespace {

struct Active {
  uint64_t op_id;
  uint64_t stream_id;
  const std::string* desc;
  const std::vector<Range>* ranges;
};

constexpr size_t kKeptReports = 64;

struct Detector {
  std::mutex m;
  std::vector<Active> active;
  std::vector<std::string> reports;  // the first kKeptReports races
  uint64_t total = 0;
};

Detector& detector() {
  static auto* d = new Detector;  // never destroyed: workers may still run at exit
  return *d;
}

bool conflict(const std::vector<Range>& a, const std::vector<Range>& b, const Range** ra,
              const Range** rb) {
  for (const Range& x : a)
    for (const Range& y : b)
      if ((x.write || y.write) && x.begin < y.end && y.begin < x.end) {
        *ra = &x;
        *rb = &y;
        return true;
      }
  return false;
}

std::string describe(uint64_t stream_id, const std::string& desc, const Range& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "[stream %llu] %s %s [0x%llx, 0x%llx)",
                static_cast<unsigned long long>(stream_id), desc.c_str(),
                r.write ? "writes" : "reads", static_cast<unsigned long long>(r.begin),
                static_cast<unsigned long long>(r.end));
  return buf;
}

}  // namespace

void race_begin(uint64_t op_id, uint64_t stream_id, const std::string* desc,
                const std::vector<Range>* ranges) {
  Detector& d = detector();
  std::string fatal;
  {
    std::lock_guard lock(d.m);
    if (!ranges->empty()) {
      for (const Active& other : d.active) {
        if (other.stream_id == stream_id) continue;
        const Range* mine = nullptr;
        const Range* theirs = nullptr;
        if (!conflict(*ranges, *other.ranges, &mine, &theirs)) continue;
        ++d.total;
        bump(Counter::races);
        std::string text = "race: " + describe(stream_id, *desc, *mine) + " while " +
                           describe(other.stream_id, *other.desc, *theirs) +
                           " with no ordering between them";
        if (d.reports.size() < kKeptReports) d.reports.push_back(text);
        if (config().strict) fatal = text;
      }
    }
    d.active.push_back(Active{op_id, stream_id, desc, ranges});
  }
  if (!fatal.empty()) {
    std::fprintf(stderr, "simcuda: %s\nsimcuda: SIMCUDA_STRICT is set: aborting\n", fatal.c_str());
    std::abort();
  }
}

void race_end(uint64_t op_id) {
  Detector& d = detector();
  std::lock_guard lock(d.m);
  for (size_t i = 0; i < d.active.size(); ++i) {
    if (d.active[i].op_id == op_id) {
      d.active[i] = d.active.back();
      d.active.pop_back();
      return;
    }
  }
}

void race_report_at_exit() {
  Detector& d = detector();
  std::lock_guard lock(d.m);
  if (d.total == 0) return;
  std::fprintf(stderr, "simcuda: %llu race(s) detected between unordered streams\n",
               static_cast<unsigned long long>(d.total));
  for (const std::string& r : d.reports) std::fprintf(stderr, "simcuda: %s\n", r.c_str());
  if (d.total > d.reports.size())
    std::fprintf(stderr, "simcuda: ... %llu more not shown\n",
                 static_cast<unsigned long long>(d.total - d.reports.size()));
}

}  // namespace poolcuda::sim
