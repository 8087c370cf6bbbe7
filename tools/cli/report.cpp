// `poolcuda report PID`: asks a running process for a report. The library reads POOLCUDA_CONF
// once, when it loads, from the environment the process started with; /proc/PID/environ holds
// exactly that environment, so the tool knows the signal, format and path the library uses.
// The signal is sent only to a process that has libpoolcuda.so mapped: SIGUSR1's default action
// terminates a process that has no handler for it. Depends on pools/config.h only.
#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "cli.h"
#include "config/config.h"

namespace poolcuda::cli {

namespace {

// Reads a whole /proc file; empty optional (with errno kept) when it cannot be opened.
std::optional<std::string> read_proc_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The value of `name` in a NUL-separated environment block, if present.
std::optional<std::string> find_variable(std::string_view environ_block, std::string_view name) {
  while (!environ_block.empty()) {
    const auto end = environ_block.find('\0');
    const std::string_view entry = environ_block.substr(0, end);
    if (entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=') {
      return std::string(entry.substr(name.size() + 1));
    }
    if (end == std::string_view::npos) break;
    environ_block.remove_prefix(end + 1);
  }
  return std::nullopt;
}

// Whether any mapping in a /proc/PID/maps text is a file named libpoolcuda.so*.
bool maps_library(std::string_view maps) {
  while (!maps.empty()) {
    const auto end = maps.find('\n');
    const std::string_view line = maps.substr(0, end);
    const auto slash = line.rfind('/');
    if (slash != std::string_view::npos && line.substr(slash + 1).starts_with("libpoolcuda.so")) {
      return true;
    }
    if (end == std::string_view::npos) break;
    maps.remove_prefix(end + 1);
  }
  return false;
}

std::string describe_errno(int error) {
  if (error == EACCES || error == EPERM) {
    return std::string(std::strerror(error)) +
           "; run as the process's user or as root";
  }
  return std::strerror(error);
}

}  // namespace

int report_command(std::span<char* const> args) {
  if (args.size() != 1) {
    print_error("usage: poolcuda report PID");
    return kExitUsage;
  }
  const std::string_view pid_text = args[0];
  long pid = 0;
  const auto [next, ec] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
  if (ec != std::errc() || next != pid_text.data() + pid_text.size() || pid <= 0) {
    print_error("'" + std::string(pid_text) + "' is not a process ID (a positive integer)");
    return kExitUsage;
  }
  const std::string proc = "/proc/" + std::to_string(pid);

  const auto environ_block = read_proc_file(proc + "/environ");
  if (!environ_block) {
    const int error = errno;
    if (error == ENOENT) {
      print_error("no process with PID " + std::to_string(pid));
    } else {
      print_error("cannot read " + proc + "/environ: " + describe_errno(error));
    }
    return kExitFailure;
  }
  const auto maps = read_proc_file(proc + "/maps");
  if (!maps) {
    print_error("cannot read " + proc + "/maps: " + describe_errno(errno));
    return kExitFailure;
  }
  if (!maps_library(*maps)) {
    print_error("process " + std::to_string(pid) +
                " has not loaded libpoolcuda.so, so it has no report (and the signal could kill "
                "it); nothing was sent. Start it with 'poolcuda run -- PROGRAM'");
    return kExitFailure;
  }

  const std::string conf = find_variable(*environ_block, "POOLCUDA_CONF").value_or("");
  const ParseResult parsed = parse_config(conf);
  if (!parsed) {
    print_error("process " + std::to_string(pid) + " has an invalid POOLCUDA_CONF (" +
                parsed.error.message() + "); nothing was sent");
    return kExitFailure;
  }
  const Config& config = *parsed.config;
  int signal_number = 0;
  std::string signal_name;
  switch (config.report_signal) {
    case ReportSignal::usr1:
      signal_number = SIGUSR1;
      signal_name = "SIGUSR1";
      break;
    case ReportSignal::usr2:
      signal_number = SIGUSR2;
      signal_name = "SIGUSR2";
      break;
    case ReportSignal::none:
      print_error("process " + std::to_string(pid) +
                  " runs with report_signal:none, so it does not answer report requests; "
                  "nothing was sent (report_at_exit:1 writes a report when it exits)");
      return kExitFailure;
  }

  if (kill(static_cast<pid_t>(pid), signal_number) != 0) {
    print_error("cannot signal process " + std::to_string(pid) + ": " + describe_errno(errno));
    return kExitFailure;
  }

  const std::string format = config.report_format == ReportFormat::json ? "JSON" : "text";
  std::cout << "sent " << signal_name << " to process " << pid << "; its " << format
            << " report goes to ";
  if (config.report_path == "stderr") {
    std::cout << "that process's standard error\n";
  } else {
    // Expand %p only: %n is the process's own count of reports, unknown from here.
    std::string shown;
    for (std::size_t i = 0; i < config.report_path.size(); ++i) {
      if (config.report_path[i] == '%' && i + 1 < config.report_path.size() &&
          config.report_path[i + 1] == 'p') {
        shown += std::to_string(pid);
        ++i;
      } else {
        shown += config.report_path[i];
      }
    }
    if (!shown.starts_with("/")) {
      // A relative path is opened by that process, from its working directory.
      std::error_code ec;
      const auto cwd = std::filesystem::read_symlink(proc + "/cwd", ec);
      shown = ec ? shown + " (relative to that process's working directory)"
                 : (cwd / shown).lexically_normal().string();
    }
    std::cout << shown;
    if (config.report_path.find("%n") != std::string::npos) {
      std::cout << " (%n is the report's number in that process, 1 for its first)";
    }
    std::cout << "\n";
  }
  return kExitOk;
}

}  // namespace poolcuda::cli
