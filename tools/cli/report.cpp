// `poolcuda report PID` and `poolcuda trim PID`: option parsing, the checks of target.h, one
// request over the report channel, and what to print. The report comes back to the caller; the
// process's own standard error sees nothing unless --keep-stderr asks for exactly that.
//
// Depends on target.h and interpose/channel_protocol.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "cli.h"
#include "help.h"
#include "target.h"

namespace poolcuda::cli {

namespace {

struct AskOptions {
  bool json = false;
  bool wide = false;
  bool keep_stderr = false;
  std::optional<std::string> to;
  std::chrono::milliseconds timeout{10000};
  long pid = 0;
};

std::optional<long> parse_positive(std::string_view text) {
  long value = 0;
  const auto [next, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || next != text.data() + text.size() || value <= 0) return std::nullopt;
  return value;
}

// Parses the options of `command` ("report" accepts all of them, "trim" only --timeout);
// returns an exit status when the command is done (help or a bad argument).
std::optional<int> parse_options(std::string_view command, std::span<char* const> args,
                                 AskOptions* options) {
  const std::string usage = command_usage(command);
  std::optional<std::string_view> pid_text;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (wants_help(command, arg)) return kExitOk;
    // "--timeout=5" as well as "--timeout 5".
    std::optional<std::string_view> attached;
    if (const auto equals = arg.find('='); arg.starts_with("--") && equals != arg.npos) {
      attached = arg.substr(equals + 1);
      arg = arg.substr(0, equals);
    }
    const bool report = command == "report";
    const bool takes_value = (report && arg == "--to") || arg == "--timeout";
    if (attached && !takes_value) {
      print_error("unexpected argument '" + std::string(args[i]) + "'; " + usage);
      return kExitUsage;
    }
    if (report && arg == "--json") {
      options->json = true;
    } else if (report && arg == "--wide") {
      options->wide = true;
    } else if (report && arg == "--keep-stderr") {
      options->keep_stderr = true;
    } else if (takes_value) {
      if (attached ? attached->empty() : i + 1 == args.size()) {
        print_error(std::string(arg) + " needs a value");
        return kExitUsage;
      }
      const std::string_view value = attached ? *attached : std::string_view(args[++i]);
      if (arg == "--to") {
        options->to = std::string(value);
      } else if (const auto seconds = parse_positive(value); seconds && *seconds <= 3600) {
        options->timeout = std::chrono::seconds(*seconds);
      } else {
        print_error("--timeout takes a whole number of seconds from 1 to 3600, not '" +
                    std::string(value) + "'");
        return kExitUsage;
      }
    } else if (arg.starts_with("-") || pid_text) {
      print_error("unexpected argument '" + std::string(arg) + "'; " + usage);
      return kExitUsage;
    } else {
      pid_text = arg;
    }
  }
  if (!pid_text) {
    print_error(usage);
    return kExitUsage;
  }
  const std::optional<long> pid = parse_positive(*pid_text);
  if (!pid) {
    print_error(std::string("'").append(*pid_text).append(
        "' is not a process ID (a positive integer)"));
    return kExitUsage;
  }
  if (options->keep_stderr && (options->json || options->wide || options->to)) {
    print_error("--keep-stderr lets the process write the report as configured; it cannot be "
                "combined with --json, --wide or --to");
    return kExitUsage;
  }
  if (options->json && options->wide) {
    print_error("--json and --wide are two formats; choose one");
    return kExitUsage;
  }
  options->pid = *pid;
  return std::nullopt;
}

// The file --to names, opened before the process is asked, so that a file that cannot be
// written costs the process no report (and no report number). One this call created is removed
// again when no report comes.
struct ReportFile {
  int fd = -1;
  bool created = false;
};

std::optional<ReportFile> open_report_file(const std::string& path) {
  ReportFile file;
  file.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (file.fd < 0 && errno == ENOENT) {
    file.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    file.created = file.fd >= 0;
    // A link to a missing file, or a file made meanwhile: opened as it would have been before.
    if (file.fd < 0 && errno == EEXIST)
      file.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  }
  if (file.fd < 0) return std::nullopt;
  return file;
}

// Closes a file that got no report, removing it if this call made it and the name still leads
// to it.
void abandon_report_file(const ReportFile& file, const std::string& path) {
  struct stat opened {};
  struct stat named {};
  const bool ours = file.created && ::fstat(file.fd, &opened) == 0 &&
                    ::lstat(path.c_str(), &named) == 0 && opened.st_dev == named.st_dev &&
                    opened.st_ino == named.st_ino;
  ::close(file.fd);
  if (ours) ::unlink(path.c_str());
}

// Replaces the file's contents with `text` (a pipe or a device just gets it) and closes it.
bool write_report_file(const ReportFile& file, std::string_view text) {
  struct stat info {};
  bool ok = ::fstat(file.fd, &info) == 0 &&
            (!S_ISREG(info.st_mode) || ::ftruncate(file.fd, 0) == 0);
  while (ok && !text.empty()) {
    const ssize_t n = ::write(file.fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) text.remove_prefix(static_cast<std::size_t>(n));
  }
  const int error = errno;
  if (::close(file.fd) != 0 && ok) return false;
  errno = error;
  return ok;
}

// The checks, the request and the answer; prints errors itself.
std::optional<Answer> ask_process(const AskOptions& options, channel::Request request) {
  std::string error;
  const std::optional<Target> target = inspect(options.pid, &error);
  if (!target) {
    print_error(error);
    return std::nullopt;
  }
  int signal_number = 0;
  if (const std::string why = refusal(*target, &signal_number); !why.empty()) {
    print_error(why);
    return std::nullopt;
  }
  Answer answer = ask(*target, signal_number, request, options.timeout);
  if (!answer.answered || !answer.ok) {
    std::string text = answer.text;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    print_error(answer.answered ? "process " + std::to_string(options.pid) + ": " + text : text);
    return std::nullopt;
  }
  return answer;
}

}  // namespace

int report_command(std::span<char* const> args) {
  AskOptions options;
  if (const std::optional<int> done = parse_options("report", args, &options)) return *done;
  const channel::Request request = options.keep_stderr ? channel::Request::report_configured
                                   : options.json      ? channel::Request::report_json
                                   : options.wide      ? channel::Request::report_wide
                                                       : channel::Request::report_text;
  std::optional<ReportFile> file;
  if (options.to) {  // never with --keep-stderr
    file = open_report_file(*options.to);
    if (!file) {
      print_error("cannot write " + *options.to + ": " + std::strerror(errno));
      return kExitFailure;
    }
  }
  const std::optional<Answer> answer = ask_process(options, request);
  if (!answer) {
    if (file) abandon_report_file(*file, *options.to);
    return kExitFailure;
  }
  if (options.keep_stderr) {
    std::cout << "process " << options.pid << ": " << answer->text;
  } else if (file) {
    if (!write_report_file(*file, answer->text)) {
      print_error("cannot write " + *options.to + ": " + std::strerror(errno));
      return kExitFailure;
    }
  } else {
    std::cout << answer->text;
  }
  return kExitOk;
}

int trim_command(std::span<char* const> args) {
  AskOptions options;
  if (const std::optional<int> done = parse_options("trim", args, &options)) return *done;
  const std::optional<Answer> answer = ask_process(options, channel::Request::trim);
  if (!answer) return kExitFailure;
  std::cout << answer->text;
  return kExitOk;
}

}  // namespace poolcuda::cli
