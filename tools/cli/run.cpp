// `poolcuda run`: checks the configuration and the library, sets POOLCUDA_CONF, LD_PRELOAD (the
// library first, after any sanitizer runtime), LD_LIBRARY_PATH (the CUDA stand-in, when no GPU
// is found) and the summary variable, prints the start line and replaces itself with the
// program (same PID, so `poolcuda report $!` works on a backgrounded run).
//
// Depends on config/config.h, interpose/channel_protocol.h and library.cpp.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "help.h"
#include "interpose/channel_protocol.h"
#include "config/config.h"

namespace poolcuda::cli {

namespace {

void print_run_usage() { print_error(command_usage("run") + " ('poolcuda run --help' for more)"); }

struct RunOptions {
  std::optional<std::string> conf;
  bool report_at_exit = false;
  bool quiet = false;
  bool stand_in = true;
  std::size_t program = 0;  // index of PROGRAM in the arguments
};

// Parses the options; returns an exit status when the command is done (help or a bad option).
std::optional<int> parse_options(std::span<char* const> args, RunOptions* options) {
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (wants_help("run", arg)) return kExitOk;
    if (arg == "--conf") {
      if (i + 1 == args.size()) {
        print_error("--conf needs a value");
        return kExitUsage;
      }
      options->conf = args[++i];
    } else if (arg.starts_with("--conf=")) {
      options->conf = std::string(arg.substr(std::string_view("--conf=").size()));
    } else if (arg == "--report-at-exit") {
      options->report_at_exit = true;
    } else if (arg == "--quiet" || arg == "-q") {
      options->quiet = true;
    } else if (arg == "--no-stand-in") {
      options->stand_in = false;
    } else if (arg.starts_with("-")) {
      print_error("unknown option '" + std::string(arg) + "' for run");
      print_run_usage();
      return kExitUsage;
    } else {
      break;  // the program
    }
  }
  if (i == args.size()) {
    print_error("run needs a program to execute");
    print_run_usage();
    return kExitUsage;
  }
  options->program = i;
  return std::nullopt;
}

// A sanitizer's runtime refuses to start unless it comes first in the initial library list.
bool sanitizer_runtime(std::string_view entry) {
  const auto slash = entry.rfind('/');
  const std::string_view name = slash == std::string_view::npos ? entry : entry.substr(slash + 1);
  for (std::string_view runtime : {"libasan.so", "libtsan.so", "libubsan.so", "liblsan.so",
                                   "libhwasan.so", "libclang_rt."}) {
    if (name.starts_with(runtime)) return true;
  }
  return false;
}

// LD_PRELOAD with the library first (after sanitizer runtimes), the other entries after it and
// an earlier copy of the same library dropped.
std::string preload_list(const std::string& library) {
  std::string front;
  std::string back;
  if (const char* existing = std::getenv("LD_PRELOAD"); existing != nullptr) {
    std::string_view rest = existing;
    while (!rest.empty()) {
      const auto end = rest.find_first_of(": ");
      const std::string_view entry = rest.substr(0, end);
      if (!entry.empty() && entry != library) {
        std::string& list = sanitizer_runtime(entry) ? front : back;
        if (!list.empty()) list += ':';
        list += entry;
      }
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  }
  return (front.empty() ? "" : front + ":") + library + (back.empty() ? "" : ":" + back);
}

bool set(const char* name, const std::string& value) {
  if (::setenv(name, value.c_str(), 1) == 0) return true;
  print_error(std::string("cannot set the environment: ") + std::strerror(errno));
  return false;
}

}  // namespace

int run_command(std::span<char* const> args) {
  RunOptions options;
  if (const std::optional<int> done = parse_options(args, &options)) return *done;

  // --conf replaces an inherited POOLCUDA_CONF; without it the inherited one is checked, so a
  // typo is reported here rather than by the library before the program's main.
  std::string conf;
  if (options.conf) {
    conf = *options.conf;
  } else if (const char* inherited = std::getenv("POOLCUDA_CONF")) {
    conf = inherited;
  }
  const ParseResult parsed = parse_config(conf);
  if (!parsed) {
    std::cerr << parsed.error.message() << "\n";
    return kExitUsage;
  }
  std::string shown = conf.empty() ? "defaults" : conf;
  if (options.report_at_exit) {
    // Written out in full so the flag cannot collide with a report_at_exit key in `conf`.
    Config config = *parsed.config;
    config.report_at_exit = true;
    conf = describe_config(config);
    shown += " + report at exit";
  }

  const LibraryLookup library = find_library();
  if (library.path.empty()) {
    print_error(library.error);
    return kExitCannotRun;
  }
  // LD_PRELOAD separates entries with ':' or spaces; such a path cannot be preloaded.
  if (library.path.find_first_of(": \t") != std::string::npos) {
    print_error("the library path '" + library.path +
                "' contains ':' or a space, which LD_PRELOAD cannot carry");
    return kExitCannotRun;
  }
  const CudaSource cuda = find_cuda(library.path, options.stand_in);
  if (!set("POOLCUDA_CONF", conf) || !set("LD_PRELOAD", preload_list(library.path))) {
    return kExitCannotRun;
  }
  if (!cuda.stand_in_dir.empty()) {
    const char* path = std::getenv("LD_LIBRARY_PATH");
    const std::string rest = path != nullptr && *path != '\0' ? std::string(":") + path : "";
    if (!set("LD_LIBRARY_PATH", cuda.stand_in_dir + rest)) return kExitCannotRun;
  }
  const std::string summary_variable(channel::kSummaryVariable);
  if (options.quiet) {
    ::unsetenv(summary_variable.c_str());
  } else {
    // The program keeps this process's pid: the summary comes from it, not from its children.
    if (!set(summary_variable.c_str(), std::to_string(::getpid()))) return kExitCannotRun;
    std::cerr << "poolcuda: run: library " << library.path << "; configuration: " << shown
              << "; CUDA: " << cuda.description << std::endl;
  }

  std::vector<char*> argv(args.begin() + static_cast<std::ptrdiff_t>(options.program),
                          args.end());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int error = errno;
  print_error("cannot execute '" + std::string(argv[0]) + "': " + std::strerror(error));
  return kExitCannotRun;
}

}  // namespace poolcuda::cli
