// The report signal: its handler, the reporter thread that does what the handler only records,
// and the readiness mark that tells `poolcuda report` the process can answer (Note [Report
// signal] in reporter.cpp). Requests that come with a reply channel are answered through it
// (report_channel.h); a plain signal (kill -USR1) writes a report where report_path says.
//
// Depends on the report channel, the report writer, the log and the configuration.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace poolcuda {

// Installs the report signal's handler, publishes the readiness mark and starts the reporter
// thread. When the program (or another library) already handles or ignores that signal, leaves it
// alone and says so: reports then come only from report_at_exit. Called at the process's first
// CUDA call (Note [Silent processes] in lifecycle.cpp), and at that of a forked child that keeps
// the pools (Note [Fork]).
void start_reporter(const Config& config);

// In a forked child: puts back the disposition the signal had before the library installed its
// handler, removes the readiness mark and drops requests the parent had not served (Note [Fork]
// in lifecycle.cpp).
void restore_report_signal_after_fork();

}  // namespace poolcuda
