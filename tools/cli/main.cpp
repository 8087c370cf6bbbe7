// Entry point of the poolcuda command-line tool: dispatches to the commands and the help
// texts (help.h). check-conf lives here too, being one call into the configuration parser.
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>

#include "cli.h"
#include "cli_paths.h"
#include "config/config.h"
#include "help.h"

namespace poolcuda::cli {

void print_error(const std::string& message) { std::cerr << "poolcuda: " << message << "\n"; }

bool wants_help(std::string_view command, std::string_view arg) {
  if (arg != "-h" && arg != "--help") return false;
  std::cout << command_help(command);
  return true;
}

namespace {

int check_conf_command(std::span<char* const> args) {
  if (args.size() == 1 && wants_help("check-conf", args[0])) return kExitOk;
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

// `poolcuda help [TOPIC]`; `--man` prints the manual page (the build installs its output).
int help_command(std::span<char* const> args) {
  if (args.empty()) {
    std::cout << main_help();
    return kExitOk;
  }
  const std::string_view topic = args[0];
  if (args.size() == 1 && topic == "conf") {
    std::cout << conf_help();
    return kExitOk;
  }
  if (args.size() == 1 && topic == "--man") {
    std::cout << man_page();
    return kExitOk;
  }
  if (args.size() == 1 && !command_help(topic).empty()) {
    std::cout << command_help(topic);
    return kExitOk;
  }
  print_error("no help on '" + std::string(topic) +
              "'; try 'poolcuda help', 'poolcuda help conf' or 'poolcuda help COMMAND'");
  return kExitUsage;
}

}  // namespace

}  // namespace poolcuda::cli

namespace {

int dispatch(std::string_view command, std::span<char* const> rest) {
  using namespace poolcuda::cli;
  if (command == "help") return help_command(rest);
  if (command == "-h" || command == "--help") return help_command({});
  if (command == "--version") {
    std::cout << "poolcuda " << POOLCUDA_CLI_VERSION << "\n";
    return kExitOk;
  }
  if (command == "run") return run_command(rest);
  if (command == "report") return report_command(rest);
  if (command == "trim") return trim_command(rest);
  if (command == "check-conf") return check_conf_command(rest);
  print_error("unknown command '" + std::string(command) +
              "'; expected run, report, trim, check-conf, help or --version");
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace poolcuda::cli;
  if (argc < 2) {
    print_error("missing command; try 'poolcuda --help'");
    return kExitUsage;
  }
  const std::span<char* const> rest(argv + 2, static_cast<std::size_t>(argc - 2));
  const int status = dispatch(argv[1], rest);
  // An answer that never reached standard output (a full disk, a closed descriptor) is a
  // failure, not a success with nothing printed.
  errno = 0;
  std::cout.flush();
  if (!std::cout) {
    print_error(std::string("cannot write standard output") +
                (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
    return status == kExitOk ? kExitFailure : status;
  }
  return status;
}
