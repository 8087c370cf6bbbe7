// Entry point of the poolcuda command-line tool: dispatches to run, report and check-conf, and
// writes the help text. The configuration keys in the help come from the parser's own option
// table (config_keys()), so the help can never disagree with what the library accepts.
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>

#include "cli.h"
#include "cli_paths.h"
#include "config/config.h"

namespace poolcuda::cli {

void print_error(const std::string& message) { std::cerr << "poolcuda: " << message << "\n"; }

namespace {

constexpr std::string_view kHelp = R"(usage: poolcuda COMMAND [ARGS]

Runs CUDA programs with libpoolcuda.so, the drop-in pooled allocator, and inspects them.

Commands:
  run [--conf STR] [--report-at-exit] [--] PROGRAM [ARGS...]
      Validates the configuration, sets POOLCUDA_CONF, puts libpoolcuda.so first in
      LD_PRELOAD and executes PROGRAM in place (same PID, its own exit status).
      --conf STR        the configuration to use; it REPLACES any POOLCUDA_CONF already in
                        the environment (the two are not merged). Without --conf an inherited
                        POOLCUDA_CONF is kept, after being checked.
      --report-at-exit  also write one report when the program exits (report_at_exit:1).
      The library is POOLCUDA_LIBRARY if that is set, else found next to this tool:
      <prefix>/)" POOLCUDA_CLI_LIBDIR R"(/libpoolcuda.so when installed as <prefix>/)"
    POOLCUDA_CLI_BINDIR R"(/poolcuda,
      or build/interpose/libpoolcuda.so when run from a build tree.

  report PID
      Asks a running process for a report of every pool. Reads the process's POOLCUDA_CONF
      from /proc/PID/environ, refuses if the process has not loaded libpoolcuda.so (the
      signal would kill it) or if report_signal is none, sends the signal and says where the
      report goes: the process's standard error, or report_path with %p replaced by PID
      (%n is the report's number in that process, 1 for its first). A program that had
      installed its own handler for that signal before the library loaded keeps it: the
      library then leaves reports to report_at_exit.

  check-conf STR
      Validates a POOLCUDA_CONF value and prints the effective configuration, every key
      spelled out (the output is itself a valid POOLCUDA_CONF).

  help, -h, --help    this text          --version    the version

Exit status: 0 success; 1 the command failed (report refused, process gone);
2 bad arguments or an invalid configuration; 127 `run` could not execute PROGRAM or find
the library. Otherwise `run` exits with PROGRAM's own status.

Configuration (POOLCUDA_CONF): comma-separated key:value entries; sizes are integers with an
optional K, M, G or T (binary multiples) and an optional iB or B, e.g. 64M, 64MiB, 512.
Example: POOLCUDA_CONF='pools:[sliced(page=64M,slice=16M,cap=1G);direct(reclaim=4G)],log:full'
Pool fields: sliced(page=SIZE required, slice=SIZE default page, cap=SIZE default none,
period=N), exclusive(max=SIZE required, period=N), direct(reclaim=SIZE required).

Keys (default first):
)";

void print_help() {
  std::cout << kHelp;
  for (const auto& key : config_keys()) {
    std::cout << "  " << key.key << ":" << key.default_value << "\n"
              << "      " << key.summary << "\n"
              << "      values: " << key.grammar << "\n";
  }
}

int check_conf_command(std::span<char* const> args) {
  if (args.size() != 1) {
    print_error("check-conf takes exactly one argument, the configuration string "
                "(quote it; \"\" means the defaults)");
    return kExitUsage;
  }
  const ParseResult result = parse_config(args[0]);
  if (!result) {
    std::cerr << result.error.message() << "\n";
    return kExitUsage;
  }
  std::cout << describe_config(*result.config) << "\n";
  // Valid, but the library would lose every report: status 1, not 2.
  const std::string path_problem = report_path_problem(result.config->report_path);
  if (!path_problem.empty()) {
    print_error("report_path '" + result.config->report_path + "': " + path_problem +
                "; reports would be lost");
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

}  // namespace poolcuda::cli

int main(int argc, char** argv) {
  using namespace poolcuda::cli;
  if (argc < 2) {
    print_error("missing command; try 'poolcuda --help'");
    return kExitUsage;
  }
  const std::string_view command = argv[1];
  const std::span<char* const> rest(argv + 2, static_cast<std::size_t>(argc - 2));
  if (command == "help" || command == "-h" || command == "--help") {
    print_help();
    return kExitOk;
  }
  if (command == "--version") {
    std::cout << "poolcuda " << POOLCUDA_CLI_VERSION << "\n";
    return kExitOk;
  }
  if (command == "run") return run_command(rest);
  if (command == "report") return report_command(rest);
  if (command == "check-conf") return check_conf_command(rest);
  print_error("unknown command '" + std::string(command) +
              "'; expected run, report, check-conf, help or --version");
  return kExitUsage;
}
