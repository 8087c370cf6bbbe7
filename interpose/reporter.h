// Reports of every device's pools, on a signal and at exit (DESIGN.md decision 10). The signal
// handler only writes one byte to a pipe; a reporter thread started with every signal blocked
// reads it, snapshots each manager under its lock and renders outside it, then writes the
// report to stderr or to report_path (%p = pid, %n = sequence number).
//
// Depends on the registry, pools/report.h and the configuration.
#pragma once

#include <string_view>

#include "config/config.h"

namespace poolcuda {

// Installs the report signal's handler and starts the reporter thread. When the program (or
// another library) already handles that signal, leaves it alone and logs one warning: reports
// then come only from report_at_exit. Called once, from the library's constructor.
void start_reporter(const Config& config);

// Renders and writes one report now. `reason` is "signal", "exit" or "request". Serialised: two
// reports never interleave.
void write_report(std::string_view reason);

}  // namespace poolcuda
