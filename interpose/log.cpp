// The library's log sink (see log.h). Lines are assembled in one buffer and written with a single
// write(2) so that lines from several threads never interleave mid-line.
//
// Depends on pools/config.h only; no CUDA header.
#include "interpose/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "pools/no_cancel.h"

namespace poolcuda {

namespace {

std::atomic<LogLevel> g_level{LogLevel::basic};

}  // namespace

void set_log_level(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }

LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

bool log_enabled(LogLevel level) {
  return level != LogLevel::off &&
         static_cast<int>(level) <= static_cast<int>(g_level.load(std::memory_order_relaxed));
}

void write_stderr(std::string_view text) {
  NoCancel no_cancel;  // a log line inside the program's call (Note [Cancellation])
  while (!text.empty()) {
    ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

void log_line(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  std::string line;
  line.reserve(message.size() + 12);
  line += "poolcuda: ";
  line += message;
  if (line.back() != '\n') line += '\n';
  write_stderr(line);
}

void log_format(LogLevel level, const char* format, ...) {
  if (!log_enabled(level)) return;
  char buffer[1024];
  va_list args;
  va_start(args, format);
  int n = std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  if (n < 0) return;
  std::size_t length = static_cast<std::size_t>(n) < sizeof buffer ? static_cast<std::size_t>(n)
                                                                     : sizeof buffer - 1;
  log_line(level, std::string_view(buffer, length));
}

}  // namespace poolcuda
