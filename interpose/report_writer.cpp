// Rendering and delivering reports (see report_writer.h).
//
// Note [Report files]
// A report written to a file must never overwrite anything but that file, and a reader must
// never see half a report. So it is written to a temporary file in the same directory (rename
// only replaces within one file system), whose name is short and unpredictable
// (".poolcuda-" and 12 random characters: a report name may be as long as the file system
// allows, and no other user can plant a link at a name it cannot guess) and which is created
// with O_CREAT | O_EXCL | O_NOFOLLOW (an existing file or link at that name is never opened,
// let alone followed), then renamed over the report's name: a link planted there is replaced,
// not followed. The temporary is removed when anything fails.
//
// Note [Reports into devices and FIFOs]
// report_path may name something that is not a file: /dev/null, /dev/stderr (a link to
// /proc/self/fd/2), a terminal, a FIFO a reader tails. Renaming over such a name would replace
// the node with a regular file (as root, the system's /dev/null or /dev/stderr). So
// report_target() (report_destination.h) looks first. A FIFO, a character device or a socket,
// links followed, is written into in place, opened O_WRONLY | O_APPEND | O_NOCTTY (a terminal
// must not become the process's controlling terminal); so is anything a link into /proc leads
// to, a regular file too, and a link to /proc/self/fd/N is descriptor N itself, whose offset the
// program's own writes share (a second open of a file redirected with 2>FILE would be
// overwritten). A link into /proc to nothing or to a directory, and a block device (writing into
// a disk, or renaming over its node, would destroy it), are refused. A FIFO is opened O_NONBLOCK: with
// no reader the open fails and the report is dropped rather than holding the thread, and a
// reader gets kNodeWriteBound to take the whole report before the rest is dropped (at exit
// too). A socket cannot be opened, so its reports are dropped. SIGPIPE is blocked around the
// write: a reader that goes away must not kill the program when the report is written at exit,
// on one of its threads. Links to regular files or to nothing keep Note [Report files], and so
// does a link another user owns (other than root): it may have been planted to make reports land
// in a device, and is replaced, never followed. What is written to must be what was looked at
// (device and inode), so a name changed in between gets nothing.
//
// Depends on the snapshots, the registry, the log, the configuration and report_destination.h.
#include "interpose/report_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>

#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/no_sigpipe.h"
#include "interpose/report_destination.h"
#include "interpose/registry.h"

namespace poolcuda {

namespace {

using Clock = std::chrono::steady_clock;

// How long a FIFO's reader may take to read one report (Note [Reports into devices and FIFOs]).
constexpr std::chrono::milliseconds kNodeWriteBound{2000};

std::atomic<std::uint64_t> g_sequence{0};

std::mutex& output_mutex() {
  static auto* mutex = new std::mutex;  // never destroyed: reports may run during exit
  return *mutex;
}

// Takes `hold`'s mutex within `wait`: false when another holder keeps it that long. Tries and
// short sleeps, not a timed lock: ThreadSanitizer does not see a timed lock taken, and then
// reports its unlock as one of an unlocked mutex.
bool lock_within(std::unique_lock<std::mutex>& hold, std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  while (!hold.try_lock()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Set by close_deliveries(): no delivery starts after it.
std::atomic<bool> g_closed{false};

// 12 characters from [a-z0-9], from getrandom, or (where it is unavailable) from the clock,
// the pid, a counter and an address, which no other user can predict either.
std::string random_suffix() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[12] = {};
  if (::getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof bytes)) {
    static std::atomic<std::uint64_t> counter{0};
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    std::uint64_t mix = static_cast<std::uint64_t>(now.tv_nsec) * 0x9E3779B97F4A7C15u ^
                        static_cast<std::uint64_t>(now.tv_sec) ^
                        static_cast<std::uint64_t>(::getpid()) << 32 ^
                        reinterpret_cast<std::uintptr_t>(&now) ^ counter.fetch_add(1) << 48;
    for (unsigned char& byte : bytes) {
      mix ^= mix >> 29;
      mix *= 0xBF58476D1CE4E5B9u;
      byte = static_cast<unsigned char>(mix >> 56);
    }
  }
  std::string out;
  for (unsigned char byte : bytes) out += kAlphabet[byte % (sizeof kAlphabet - 1)];
  return out;
}

// Writes all of `text`. A non-blocking descriptor waits for room until `deadline`.
bool write_all(int fd, std::string_view text,
               Clock::time_point deadline = Clock::time_point::max()) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n > 0) {
      text.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || errno != EAGAIN) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;  // errno stays EAGAIN
    pollfd ready{fd, POLLOUT, 0};
    if (::poll(&ready, 1, static_cast<int>(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

// Note [Report files]. On failure, errno says why.
bool replace_file(const std::string& path, std::string_view text) {
  const auto slash = path.rfind('/');
  const std::string directory =
      slash == std::string::npos ? std::string(".") : path.substr(0, slash == 0 ? 1 : slash);
  std::string temporary;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    temporary = directory + "/.poolcuda-" + random_suffix();
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) return false;
  }
  if (fd < 0) return false;
  bool ok = write_all(fd, text);
  int error = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (ok && ::rename(temporary.c_str(), path.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    ::unlink(temporary.c_str());
    errno = error;
  }
  return ok;
}

// Note [Reports into devices and FIFOs]: writes into what `path` leads to. Empty when written;
// otherwise why not.
std::string write_in_place(const std::string& path, const ReportTarget& target,
                           std::string_view text) {
  const bool fifo = S_ISFIFO(target.info.st_mode);
  const bool own = target.descriptor >= 0;
  // Non-blocking, a FIFO and a character device too: a terminal nobody reads (a stalled ssh
  // session, a pty whose reader stopped) held the writer for good, and an exit waiting for it.
  const bool node = fifo || S_ISCHR(target.info.st_mode);
  const int fd = own ? target.descriptor
                     : ::open(path.c_str(), O_WRONLY | O_APPEND | O_NOCTTY | O_CLOEXEC |
                                                (node ? O_NONBLOCK : 0));
  if (fd < 0) {
    if (fifo && errno == ENXIO) return "no process has the FIFO open for reading";
    if (S_ISSOCK(target.info.st_mode))
      return std::string("it is a socket, which cannot be opened (") + std::strerror(errno) + ")";
    return std::strerror(errno);
  }
  std::string why;
  struct stat opened {};
  if (::fstat(fd, &opened) != 0 || opened.st_dev != target.info.st_dev ||
      opened.st_ino != target.info.st_ino) {
    why = "it was replaced between the look and the open";  // so nothing is written
  } else {
    NoSigpipe no_sigpipe;
    if (!write_all(fd, text, Clock::now() + kNodeWriteBound)) {
      why = errno == EAGAIN ? "its reader did not take the whole report within " +
                                  std::to_string(kNodeWriteBound.count()) + " ms"
                            : std::strerror(errno);
    }
  }
  if (!own) ::close(fd);
  return why;
}

}  // namespace

RenderedReport render_snapshots(std::string_view reason, ReportFormat format,
                                const Snapshots& snapshots) {
  ReportHeader header;
  header.pid = static_cast<long>(::getpid());
  header.sequence = g_sequence.fetch_add(1, std::memory_order_relaxed) + 1;
  header.reason = std::string(reason);
  header.unix_time = static_cast<std::int64_t>(::time(nullptr));
  header.uptime_seconds = uptime_seconds();
  ReportDocument document = Registry::instance().document(header, snapshots.reports);
  if (!snapshots.skipped.empty()) {
    std::string devices;
    for (int device : snapshots.skipped) {
      devices += (devices.empty() ? "" : ", ") + std::to_string(device);
    }
    const std::string why = "device " + devices + ": its pools stayed locked for " +
                            std::to_string(snapshots.bound.count()) +
                            " ms (a thread holding them was probably interrupted by exit)";
    document.summary.add("skipped", "skipped", ReportValue::words(why));
    if (document.devices.empty()) document.empty_note = "skipped " + why;
  }
  RenderedReport out;
  out.sequence = header.sequence;
  out.text = render(document, format);
  if (!out.text.empty() && out.text.back() != '\n') out.text += '\n';
  return out;
}

Delivery deliver(const RenderedReport& report, std::optional<std::chrono::milliseconds> wait) {
  const Config& conf = config();
  std::unique_lock<std::mutex> hold(output_mutex(), std::defer_lock);
  if (!wait) {
    hold.lock();
  } else if (!lock_within(hold, *wait)) {
    log_format(LogLevel::basic, "report %llu not written: another report was still being "
               "written after %lld ms", static_cast<unsigned long long>(report.sequence),
               static_cast<long long>(wait->count()));
    return Delivery{false, "another report was still being written"};
  }
  if (g_closed.load()) return Delivery{false, "the process is exiting"};
  if (const int stream = report_keyword_descriptor(conf.report_path); stream >= 0) {
    // A reader that does not take it within the bound loses the rest (Note [Writes to
    // standard error] in log.cpp).
    const char* name = stream == STDOUT_FILENO ? "standard output" : "standard error";
    if (!write_descriptor(stream, report.text, kAskedForWait))
      return Delivery{false, std::string(name) + " was closed as the process started"};
    return Delivery{true, name};
  }
  const std::string path =
      expand_report_path(conf.report_path, static_cast<long>(::getpid()), report.sequence);
  std::string why;
  const ReportTarget target = report_target(path);
  // A link to this process's descriptor 1 or 2 (/dev/stderr) when that was closed as the process
  // started: the descriptor is now a file of the program's, as for report_path:stderr.
  if (target.names_descriptor >= 0 && !standard_stream_usable(target.names_descriptor)) {
    why = std::string(target.names_descriptor == STDOUT_FILENO ? "standard output"
                                                               : "standard error") +
          ", which it leads to, was closed as the process started";
  } else {
    switch (target.destination) {
      case ReportDestination::in_place:
        why = write_in_place(path, target, report.text);
        break;
      case ReportDestination::refused:
        why = target.refusal;
        break;
      case ReportDestination::replace:
        if (!replace_file(path, report.text)) why = std::strerror(errno);
        break;
    }
  }
  if (why.empty()) {
    log_format(LogLevel::basic, "report %llu written to %s",
               static_cast<unsigned long long>(report.sequence), path.c_str());
    return Delivery{true, path};
  }
  log_format(LogLevel::basic, "cannot write report %llu to %s: %s",
             static_cast<unsigned long long>(report.sequence), path.c_str(), why.c_str());
  return Delivery{false, "cannot write " + path + ": " + why};
}

void close_deliveries(std::chrono::milliseconds wait) {
  g_closed.store(true);
  std::unique_lock<std::mutex> hold(output_mutex(), std::defer_lock);
  (void)lock_within(hold, wait);
}

Delivery write_report(std::string_view reason) {
  return deliver(render_snapshots(reason, config().report_format, take_snapshots()));
}

}  // namespace poolcuda
