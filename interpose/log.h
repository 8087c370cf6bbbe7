// The library's own log lines: one write(2) per line to stderr, prefixed "poolcuda: ", filtered
// by the configured log level. Usable before the configuration is known (the level starts at
// basic), from any thread, and after exit handlers have run (nothing here is ever destroyed).
// Not async-signal-safe: never called from a signal handler.
//
// Depends on pools/config.h (LogLevel) only; no CUDA header.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "config/config.h"

namespace poolcuda {

void set_log_level(LogLevel level);
LogLevel log_level();

// True when a message of `level` would be written.
bool log_enabled(LogLevel level);

// Writes "poolcuda: <message>\n" to stderr when `level` is enabled.
void log_line(LogLevel level, std::string_view message);

// printf-style convenience; formats only when the level is enabled.
void log_format(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// A line kept for the calling thread instead of written (one at a time: a later one replaces
// it): the pools' account of a refusal, which matters only if the driver, tried next, refuses
// the request too. say_kept() writes it (at basic), with `then` after it, drop_kept() forgets
// it.
void keep_line(std::string message);
bool has_kept();
void say_kept(std::string_view then = {});
void drop_kept();

// Writes the text to stderr with write(2), retrying short writes, for messages that must appear
// whatever the log level (configuration errors, confirm:1, the exit summary) and for reports.
// Waits at most `wait` for a pipe that is full, then drops what is left (whole lines), and never
// dies of SIGPIPE (Note [Writes to standard error] in log.cpp).
void write_stderr(std::string_view text,
                  std::chrono::milliseconds wait = std::chrono::milliseconds{0});
// The same for descriptor `fd` (report_path:stdout writes reports to descriptor 1). Nothing is
// written to descriptor 1 or 2 when it was closed as the library first ran: then false.
bool write_descriptor(int fd, std::string_view text, std::chrono::milliseconds wait);
// Notes whether descriptors 1 and 2 are open, the first time only: called as the library first
// runs.
void note_standard_streams();
// Whether descriptor `fd` may be written to: 1 and 2 only when they were open when noted.
bool standard_stream_usable(int fd);
// How long a message the user asked for (a configuration error, confirm:1, the exit summary, a
// report) waits for a full pipe; a log line waits for none.
inline constexpr std::chrono::milliseconds kAskedForWait{2000};

}  // namespace poolcuda
