// `poolcuda run`: checks the configuration, sets POOLCUDA_CONF, puts libpoolcuda.so first in
// LD_PRELOAD and replaces itself with the program (same PID, so `poolcuda report $!` works on a
// backgrounded run). Also owns find_library(): how the tool locates the library relative to its
// own executable. Depends on pools/config.h only.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "cli.h"
#include "cli_paths.h"
#include "config/config.h"

namespace poolcuda::cli {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kLibraryName = "libpoolcuda.so";

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The installed layout: this executable is <prefix>/<bindir>/poolcuda and the library is
// <prefix>/<libdir>/libpoolcuda.so (or <libdir>/libpoolcuda.so when libdir is absolute).
std::optional<fs::path> installed_candidate(const fs::path& exe_dir) {
  const fs::path bindir = POOLCUDA_CLI_BINDIR;
  const fs::path libdir = POOLCUDA_CLI_LIBDIR;
  if (libdir.is_absolute()) return libdir / kLibraryName;
  if (bindir.is_absolute()) return std::nullopt;
  // Strip bindir's components from the end of exe_dir, checking that they match.
  fs::path prefix = exe_dir;
  std::vector<fs::path> parts(bindir.begin(), bindir.end());
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (it->empty() || *it == ".") continue;
    if (prefix.filename() != *it) return std::nullopt;
    prefix = prefix.parent_path();
  }
  return prefix / libdir / kLibraryName;
}

void print_run_usage() {
  print_error("usage: poolcuda run [--conf STR] [--report-at-exit] [--] PROGRAM [ARGS...]");
}

}  // namespace

LibraryLookup find_library() {
  LibraryLookup lookup;
  if (const char* env = std::getenv("POOLCUDA_LIBRARY"); env != nullptr && *env != '\0') {
    std::error_code ec;
    const fs::path path = fs::absolute(env, ec);
    if (!ec && is_file(path)) {
      lookup.path = path.lexically_normal().string();
    } else {
      lookup.error = "POOLCUDA_LIBRARY is '" + std::string(env) + "', which is not a file";
    }
    return lookup;
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    lookup.error = "cannot read /proc/self/exe (" + ec.message() +
                   ") to find libpoolcuda.so; set POOLCUDA_LIBRARY";
    return lookup;
  }
  const fs::path exe_dir = exe.parent_path();
  std::vector<fs::path> candidates;
  if (auto installed = installed_candidate(exe_dir)) candidates.push_back(*installed);
  // The build tree: build/tools/cli/poolcuda next to build/interpose/libpoolcuda.so.
  candidates.push_back(exe_dir.parent_path().parent_path() / "interpose" / kLibraryName);
  std::string tried;
  for (const auto& candidate : candidates) {
    const fs::path normal = candidate.lexically_normal();
    if (is_file(normal)) {
      lookup.path = normal.string();
      return lookup;
    }
    tried += (tried.empty() ? "" : ", ") + normal.string();
  }
  lookup.error = "cannot find libpoolcuda.so (tried " + tried +
                 "); set POOLCUDA_LIBRARY to its path";
  return lookup;
}

int run_command(std::span<char* const> args) {
  std::optional<std::string> conf_text;
  bool report_at_exit = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--conf" || arg.starts_with("--conf=")) {
      if (arg == "--conf") {
        if (i + 1 == args.size()) {
          print_error("--conf needs a value");
          return kExitUsage;
        }
        conf_text = args[++i];
      } else {
        conf_text = std::string(arg.substr(std::string_view("--conf=").size()));
      }
    } else if (arg == "--report-at-exit") {
      report_at_exit = true;
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

  // --conf replaces an inherited POOLCUDA_CONF; without it the inherited one is checked, so a
  // typo is reported here rather than by the library before the program's main.
  std::string conf;
  if (conf_text) {
    conf = *conf_text;
  } else if (const char* inherited = std::getenv("POOLCUDA_CONF")) {
    conf = inherited;
  }
  const ParseResult parsed = parse_config(conf);
  if (!parsed) {
    std::cerr << parsed.error.message() << "\n";
    return kExitUsage;
  }
  if (report_at_exit) {
    // Written out in full so the flag cannot collide with a report_at_exit key in `conf`.
    Config config = *parsed.config;
    config.report_at_exit = true;
    conf = describe_config(config);
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
  std::string preload = library.path;
  if (const char* existing = std::getenv("LD_PRELOAD"); existing != nullptr && *existing) {
    // Keep the other entries after ours, dropping an earlier copy of the same library.
    std::string_view rest = existing;
    while (!rest.empty()) {
      const auto end = rest.find_first_of(": ");
      const std::string_view entry = rest.substr(0, end);
      if (!entry.empty() && entry != library.path) {
        preload += ':';
        preload.append(entry);
      }
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  }
  if (setenv("POOLCUDA_CONF", conf.c_str(), 1) != 0 ||
      setenv("LD_PRELOAD", preload.c_str(), 1) != 0) {
    print_error(std::string("cannot set the environment: ") + std::strerror(errno));
    return kExitCannotRun;
  }

  std::vector<char*> argv(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int error = errno;
  print_error("cannot execute '" + std::string(argv[0]) + "': " + std::strerror(error));
  return kExitCannotRun;
}

}  // namespace poolcuda::cli
