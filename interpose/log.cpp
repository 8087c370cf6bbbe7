// The library's log sink (see log.h). Lines are assembled in one buffer and written with a single
// write(2) so that lines from several threads never interleave mid-line.
//
// Depends on pools/config.h and no_sigpipe.h only; no CUDA header.
#include "interpose/log.h"

#include <limits.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "interpose/no_sigpipe.h"
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

// Note [Writes to standard error]
// The program's standard error may be a pipe that nobody reads yet (a parent that reads the
// child's standard output to the end first) or whose reader is gone. Plain CUDA writes nothing
// there, so the library's lines must neither block the program nor kill it: a full pipe blocked
// a program that was refused memory over and over in write(2) once 64 KiB of lines had filled
// it, and a closed one killed it with SIGPIPE (its buffered output lost). So each piece is
// written only once poll(2) says the descriptor takes bytes, at most PIPE_BUF at a time (a
// pipe that takes any takes that many without blocking; a pty may still block, as before),
// ending at a line's end where the text goes on, waiting at most `wait`: nothing for a log line,
// which is dropped when the pipe is full, kAskedForWait for what the user asked for. SIGPIPE is
// blocked meanwhile; the write fails with EPIPE instead.
//
// Note [A standard error that is no longer one]
// A program that runs with standard error closed (`prog 2>&-`, a daemon started with its
// descriptors closed) gets descriptor 2 for the next file it opens, and the library's lines went
// into that file, among the program's own bytes. So the library notes whether descriptors 1 and
// 2 are open when it first runs (its constructor, or an earlier hook that a constructor of the
// program's own libraries called), and never writes to one that was closed then. One the program
// replaces later is written to: a program that sends its standard error to a log file
// (freopen, dup2) wants the library's lines there too, and the library cannot tell that from a
// program that closed descriptor 2 and opened a file of its own in its place.
namespace {

bool g_open_at_load[3];  // by descriptor: 1 and 2; written once, before g_noted is 2
std::atomic<int> g_noted{0};  // 0: not yet, 1: being noted, 2: noted

}  // namespace

void note_standard_streams() {
  int expected = 0;
  if (!g_noted.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    while (g_noted.load(std::memory_order_acquire) != 2) {
    }
    return;
  }
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st {};
    g_open_at_load[fd] = ::fstat(fd, &st) == 0;
  }
  g_noted.store(2, std::memory_order_release);
}

bool standard_stream_usable(int fd) {
  if (fd != STDOUT_FILENO && fd != STDERR_FILENO) return true;
  note_standard_streams();
  return g_open_at_load[fd];
}

void write_stderr(std::string_view text, std::chrono::milliseconds wait) {
  (void)write_descriptor(STDERR_FILENO, text, wait);
}

bool write_descriptor(int fd, std::string_view text, std::chrono::milliseconds wait) {
  if (!standard_stream_usable(fd)) return false;  // Note [A standard error that is no longer one]
  NoCancel no_cancel;  // a log line inside the program's call (Note [Cancellation])
  NoSigpipe no_sigpipe;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!text.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd ready{fd, POLLOUT, 0};
    const int polled =
        ::poll(&ready, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0 || (ready.revents & (POLLERR | POLLNVAL)) != 0) return true;
    // Whole lines when the text is longer: what a full pipe drops is never half a line.
    std::size_t piece = std::min<std::size_t>(text.size(), PIPE_BUF);
    if (piece < text.size()) {
      const std::size_t last_line = text.substr(0, piece).rfind('\n');
      if (last_line != std::string_view::npos) piece = last_line + 1;
    }
    const ssize_t n = ::write(fd, text.data(), piece);
    if (n < 0) {
      if (errno == EINTR) continue;
      return true;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
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
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  if (n < 0) {
    va_end(again);
    return;
  }
  if (static_cast<std::size_t>(n) < sizeof buffer) {
    va_end(again);
    log_line(level, std::string_view(buffer, static_cast<std::size_t>(n)));
    return;
  }
  // A longer line (a report path of thousands of bytes) is written whole: cut, it lost the
  // reason that came after the path.
  std::string whole(static_cast<std::size_t>(n) + 1, '\0');
  std::vsnprintf(whole.data(), whole.size(), format, again);
  va_end(again);
  whole.pop_back();
  log_line(level, whole);
}

namespace {
// The kept line is plain bytes, never destroyed: a std::string here was destroyed at thread exit
// before destructors the program registered earlier (a pthread key's, a thread_local object's),
// and a refused cudaMalloc in one of them wrote into the freed string and freed it again (glibc
// aborted the thread). Longer lines are cut.
constexpr std::size_t kKeptBytes = 1024;
thread_local char t_kept[kKeptBytes];
thread_local std::size_t t_kept_length = 0;
// Whether t_kept holds a line: read by every pooled allocation, so of the cheapest model.
__attribute__((tls_model("initial-exec"))) thread_local bool t_has_kept = false;

void append_kept(std::string_view text) {
  const std::size_t n = std::min(text.size(), kKeptBytes - t_kept_length);
  if (n == 0) return;  // an empty view's data() may be null, which memcpy must never see
  std::memcpy(t_kept + t_kept_length, text.data(), n);
  t_kept_length += n;
}
}  // namespace

void keep_line(std::string message) {
  t_kept_length = 0;
  append_kept(message);
  t_has_kept = true;
}

bool has_kept() { return t_has_kept; }

void say_kept(std::string_view then) {
  if (!t_has_kept) return;
  append_kept(then);
  log_line(LogLevel::basic, std::string_view(t_kept, t_kept_length));
  drop_kept();
}

void drop_kept() {
  if (!t_has_kept) return;
  t_kept_length = 0;
  t_has_kept = false;
}

}  // namespace poolcuda
