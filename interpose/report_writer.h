// Rendering a report from snapshots and delivering it where report_path says: standard error,
// a file replaced atomically, or a FIFO or device written in place (Note [Report files] and
// Note [Reports into devices and FIFOs] in report_writer.cpp). Reports are numbered per process
// (%n in report_path); two deliveries never interleave.
//
// Depends on the snapshots, the registry (the document), the log and the configuration. Never
// called from a signal handler.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "interpose/snapshots.h"
#include "config/config.h"

namespace poolcuda {

struct RenderedReport {
  std::uint64_t sequence = 0;  // 1 for the process's first report
  std::string text;            // ends with a newline
};

// Renders `snapshots` with the next sequence number, the time and the library's uptime.
// `reason` is "signal", "exit" or "request". Devices the snapshots skipped are named in the
// summary ("skipped").
RenderedReport render_snapshots(std::string_view reason, ReportFormat format,
                                const Snapshots& snapshots);

struct Delivery {
  bool ok = false;
  std::string where;  // "standard error" or the file's path; on failure, what went wrong
};

// Writes the report where report_path sends reports (one log line names a file it went to).
// With `wait`, gives up (one log line) when another report is still being written after it.
Delivery deliver(const RenderedReport& report,
                 std::optional<std::chrono::milliseconds> wait = std::nullopt);

// Snapshots now (on this thread), renders in the configured format and delivers.
Delivery write_report(std::string_view reason);

// Refuses every later delivery, and waits up to `wait` for one under way to end: the process is
// exiting, and one the reporter thread was making as it ended left its temporary file behind.
void close_deliveries(std::chrono::milliseconds wait);

}  // namespace poolcuda
