// check-conf's look at report_path: whether the library could write a report where the
// configuration says. The parser checks only the grammar (config/ does no I/O); this looks at
// the directory as the user running check-conf sees it, from its working directory. The library
// itself never refuses to start over a report path: a report it cannot write is logged and lost.
// Which paths the library writes into in place, and which it replaces, is decided by
// interpose/report_destination.h for both (Note [Reports into devices and FIFOs]).
// Depends on config/ (expand_report_path), interpose/report_destination.h and POSIX only.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cli.h"
#include "config/config.h"
#include "interpose/report_destination.h"

namespace poolcuda::cli {

namespace {

// Whether a new file can be made in `directory` as the library makes its temporary file
// (O_CREAT | O_EXCL | O_NOFOLLOW), by making one and removing it at once. access() is not
// enough: it answers yes for root everywhere, and for directories of /proc and /sys that take
// no new file from anyone. Empty when it can; otherwise the reason.
std::string create_probe_file(const std::string& directory) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string probe = directory + "/.poolcuda-check-conf-" +
                              std::to_string(::getpid()) + "-" + std::to_string(attempt);
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                          0600);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
      return {};
    }
    if (errno != EEXIST)
      return "directory '" + directory + "' does not take new files: " + std::strerror(errno);
  }
  return {};  // sixteen names taken: the directory takes files, someone else's
}

}  // namespace

std::string report_path_problem(const std::string& pattern) {
  if (report_keyword_descriptor(pattern) >= 0) return {};
  const std::string path = expand_report_path(pattern, static_cast<long>(::getpid()), 1);
  // What the library does with what is there now (report_destination.h): what it writes into
  // in place must be writable, and a socket cannot be opened.
  const ReportTarget target = report_target(path);
  if (target.destination == ReportDestination::refused) return target.refusal;
  if (target.destination == ReportDestination::in_place) {
    if (target.descriptor >= 0) return {};  // the program's own descriptor, open already
    if (S_ISSOCK(target.info.st_mode)) return "'" + path + "' is a socket, which cannot be opened";
    if (::access(path.c_str(), W_OK) != 0)
      return "'" + path + "' cannot be written: " + std::strerror(errno);
    return {};
  }
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))  // a link to one is replaced
    return "'" + path + "' is a directory, not a file";
  // Otherwise the library writes a temporary file beside the report and renames it: the
  // directory must exist and take new files. It creates no directory, so a directory named with
  // %p or %n does not exist before the run.
  const auto slash = path.rfind('/');
  const std::string directory =
      slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const auto pattern_slash = pattern.rfind('/');
  const bool expands = pattern_slash != std::string::npos && pattern.find('%') < pattern_slash;
  if (::stat(directory.c_str(), &info) != 0) {
    return "directory '" + directory + "': " + std::strerror(errno) +
           (expands ? " (%p and %n change per process and report, and the library creates no "
                      "directory: keep them in the file name)"
                    : " (the library creates no directory)");
  }
  if (!S_ISDIR(info.st_mode)) return "'" + directory + "' is not a directory";
  // The kernel refuses a longer name (ENAMETOOLONG); %p and %n make it a few bytes longer or
  // shorter in the program than here.
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const long longest = ::pathconf(directory.c_str(), _PC_NAME_MAX);
  if (longest > 0 && name.size() > static_cast<std::size_t>(longest))
    return "the file name is " + std::to_string(name.size()) + " bytes, longer than the " +
           std::to_string(longest) + " a name in '" + directory + "' may have";
  return create_probe_file(directory);
}

}  // namespace poolcuda::cli
