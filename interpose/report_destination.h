// Where report_path sends a report: standard error, or what is at the expanded name when the
// report is written, which decides whether it is replaced by a new file or written into in
// place (Note [Reports into devices and FIFOs] in report_writer.cpp says why).
//
// Header-only, POSIX and the standard library only: the library's report writer decides with it,
// and the CLI's check-conf (tools/cli/report_path.cpp) includes it without linking the library,
// so the two never disagree about a path.
#pragma once

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <string>
#include <string_view>

namespace poolcuda {

// The descriptor a keyword value of report_path names (`stderr`: 2, `stdout`: 1, in any case, as
// keyword values of POOLCUDA_CONF ignore case), or -1 for a file name.
inline int report_keyword_descriptor(std::string_view report_path) {
  const auto is = [report_path](std::string_view keyword) {
    if (report_path.size() != keyword.size()) return false;
    for (std::size_t i = 0; i < keyword.size(); ++i) {
      const char c = report_path[i];
      if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c) != keyword[i]) return false;
    }
    return true;
  };
  return is("stderr") ? STDERR_FILENO : is("stdout") ? STDOUT_FILENO : -1;
}

enum class ReportDestination {
  replace,   // a new file renamed over the name (Note [Report files])
  in_place,  // written into what the name leads to
  refused,   // nothing is written or replaced
};

struct ReportTarget {
  ReportDestination destination = ReportDestination::replace;
  struct stat info {};          // what the name leads to, links followed; set when in_place
  int descriptor = -1;          // a link to /proc/self/fd/N: the process's own descriptor N
  int names_descriptor = -1;    // the same, kept whatever N is (`descriptor` only for a file)
  const char* refusal = "";     // why, when refused
};

// What is at `path` now. Links are followed unless another user (not this one, not root) owns
// the link: such a link may have been planted, and is replaced, never followed. A link into
// /proc (as /dev/stdout and /dev/stderr are) is never replaced: renaming over it would replace
// the link itself (as root, /dev/stderr). It is written into whatever it leads to, and a link to
// /proc/self/fd/N through descriptor N itself, sharing its offset as a shell's 2>/dev/stderr
// does: a new open of a file the program writes at its own offset would be overwritten.
// A name in a directory of /proc, reached through links (/dev/fd/N is /proc/self/fd/N) is the
// same: /proc keeps it, no file can be made beside it, and in a descriptor directory of this
// process it is that descriptor.
inline ReportTarget report_target(const std::string& path) {
  ReportTarget target;
  struct stat name {};
  if (::lstat(path.c_str(), &name) != 0) return target;
  const bool link = S_ISLNK(name.st_mode);
  if (link && name.st_uid != ::geteuid() && name.st_uid != 0) return target;
  // Each name on the way, from `path` through its links (relative ones too): one whose
  // directory is in /proc leads there, and one in this process's descriptor directory (or a
  // thread's) is that descriptor. A chain of links (a link to /dev/stderr) is followed, up to
  // the kernel's own limit of 40.
  bool into_proc = false;
  std::string hop = path;
  const std::string own = "/proc/" + std::to_string(::getpid());
  for (int hops = 0; hops <= 40; ++hops) {
    const std::size_t slash = hop.rfind('/');
    char directory[PATH_MAX];
    if (slash != std::string::npos && slash != 0 &&
        ::realpath(hop.substr(0, slash).c_str(), directory) != nullptr) {
      const std::string_view in(directory);
      const bool descriptors =
          in == own + "/fd" ||
          (in.starts_with(own + "/task/") && in.ends_with("/fd") && in.size() > own.size() + 9);
      if (in.starts_with("/proc/")) into_proc = true;
      if (descriptors) {
        const std::string_view number = std::string_view(hop).substr(slash + 1);
        int descriptor = -1;
        const auto [end, error] =
            std::from_chars(number.data(), number.data() + number.size(), descriptor);
        if (error == std::errc() && end == number.data() + number.size() && descriptor >= 0)
          target.descriptor = target.names_descriptor = descriptor;
      }
    }
    if (into_proc) break;
    struct stat at {};
    if (::lstat(hop.c_str(), &at) != 0 || !S_ISLNK(at.st_mode)) break;
    char to[PATH_MAX];
    const ssize_t length = ::readlink(hop.c_str(), to, sizeof to - 1);
    if (length <= 0) break;
    const std::string next(to, static_cast<std::size_t>(length));
    const bool absolute = next.front() == '/' || slash == std::string::npos;
    hop = absolute ? next : hop.substr(0, slash + 1) + next;
  }
  const auto refuse = [&target](const char* why) {
    target.destination = ReportDestination::refused;
    target.refusal = why;
    return target;
  };
  if (::stat(path.c_str(), &target.info) != 0) {
    if (into_proc) return refuse("it is a link into /proc to nothing (a closed descriptor?)");
    return target;  // a link to nothing is replaced
  }
  const mode_t mode = target.info.st_mode;
  // Only a file shares an offset with the program's writes. A pipe or terminal is opened anew
  // (a pipe non-blocking, so that no reader cannot hold the writer); a socket cannot be.
  if (!S_ISREG(mode) && !S_ISSOCK(mode)) target.descriptor = -1;
  if (S_ISBLK(mode)) return refuse("it is a block device, which is never written");
  // A FIFO or socket another user made (in a shared directory such as /tmp) would receive the
  // reports: renaming over it failed before, and writing into it must not succeed now.
  if ((S_ISFIFO(mode) || S_ISSOCK(mode)) && !into_proc && target.info.st_uid != ::geteuid() &&
      target.info.st_uid != 0)
    return refuse("it is a FIFO or socket another user owns");
  if (S_ISDIR(mode) && into_proc) return refuse("it is a link into /proc to a directory");
  if (S_ISFIFO(mode) || S_ISCHR(mode) || S_ISSOCK(mode) || (S_ISREG(mode) && into_proc))
    target.destination = ReportDestination::in_place;
  return target;
}

}  // namespace poolcuda
