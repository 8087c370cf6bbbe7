// The CLI's help texts and the manual page built from them (see help.h).
#include "help.h"

#include <array>

#include "cli_paths.h"
#include "config/config.h"

namespace poolcuda::cli {

namespace {

constexpr std::string_view kMainHelp = R"(usage: poolcuda COMMAND [OPTIONS] [ARGS]

Runs CUDA programs with libpoolcuda.so, the drop-in pooled CUDA allocator, and
talks to them while they run.

Commands:
  run [OPTIONS] [--] PROGRAM [ARGS...]  run PROGRAM with the library preloaded
  report [OPTIONS] PID                   print a running program's pool report
  trim [OPTIONS] PID                     make a running program free idle memory
  check-conf STR                         check and print a POOLCUDA_CONF value
  help [COMMAND | conf]                  this text, a command's help, or the
                                         configuration reference
  --version                              the version

'poolcuda COMMAND --help' describes a command; 'poolcuda help conf' lists every
POOLCUDA_CONF key with its default and values.

Exit status: 0 success; 1 the command failed (the process cannot report, is
gone, or did not answer); 2 bad arguments or an invalid configuration; 127 'run'
could not execute PROGRAM or use the library. Otherwise 'run' exits with
PROGRAM's own status.
)";

constexpr std::string_view kRunHelp = R"(usage: poolcuda run [--conf STR] [--report-at-exit] [--quiet] [--no-stand-in]
                    [--] PROGRAM [ARGS...]

Runs PROGRAM with libpoolcuda.so first in LD_PRELOAD and POOLCUDA_CONF set.
PROGRAM replaces the tool (same PID, so 'poolcuda report $!' works on a
backgrounded run), and its exit status is the tool's.

Options:
  --conf STR        the configuration ('poolcuda help conf'); it REPLACES any
                    POOLCUDA_CONF already in the environment (the two are not
                    merged). Without --conf an inherited POOLCUDA_CONF is kept,
                    after being checked.
  --report-at-exit  write one report when the program exits (report_at_exit:1).
                    Children inherit it, but only processes that made CUDA
                    calls write a report.
  -q, --quiet       no start line, no summary at exit.
  --no-stand-in     never use the CUDA stand-in, even when no GPU is found.
  -h, --help        this text.

Unless --quiet, one line on standard error names the library, the
configuration and where CUDA comes from; at exit the program itself writes one
line per device: peak bytes in use and reserved, their ratio, the cudaMalloc
and cudaFree calls the pools saved, and the fence waits. Only the process that
run replaces writes this summary, and only if it made CUDA calls.

Without a GPU (neither /dev/nvidiactl nor /proc/driver/nvidia/version), run
uses the CUDA stand-in when one lies beside the library (a build tree's
tests/simcuda/): it goes first in LD_LIBRARY_PATH, and the start line says so.

The library is POOLCUDA_LIBRARY if set, else
  PREFIX/)" POOLCUDA_CLI_LIBDIR R"(/libpoolcuda.so when this tool is PREFIX/)" POOLCUDA_CLI_BINDIR R"(/poolcuda,
  else build/interpose/libpoolcuda.so beside build/tools/cli/poolcuda.
It must be a 64-bit ELF shared object for this machine that exports
poolcuda_library_marker. Sanitizer runtimes already in LD_PRELOAD stay first.
)";

constexpr std::string_view kReportHelp = R"(usage: poolcuda report [--json | --wide] [--to FILE | --keep-stderr]
                       [--timeout SECONDS] PID

Asks the running process PID for a report of every device's pools and prints
it on standard output. The request is a signal sent to the library's reporter
thread alone, carrying a private pipe for the answer: no thread of the program
is interrupted.

Options:
  --json             the report as one JSON object instead of text.
  --wide             text with every detail (lines may exceed 100 columns).
  --to FILE          write the report to FILE instead of standard output.
  --keep-stderr      let the process write the report where its configuration
                     sends reports (its standard error, or report_path), and
                     print where it went.
  --timeout SECONDS  how long to wait for the answer (default 10).
  -h, --help         this text.

Nothing is sent, and the status is 1 with a message saying why, when the
process has not loaded libpoolcuda.so, runs with report_signal:none, has its
own handler for the report signal or ignores it, or has not finished loading
the library. The status is also 1 when no answer comes within the timeout.
)";

constexpr std::string_view kTrimHelp = R"(usage: poolcuda trim [--timeout SECONDS] PID

Asks the running process PID to return every idle page of its pools to the
driver (the pools' explicit cleanup, run by the library's reporter thread) and
prints what each device released and still holds. Memory in use, and memory
still waiting for its free fence, stays.

Options:
  --timeout SECONDS  how long to wait for the answer (default 10).
  -h, --help         this text.

Refused (status 1, nothing sent) in the same cases as 'poolcuda report'.
)";

constexpr std::string_view kCheckConfHelp = R"(usage: poolcuda check-conf STR

Checks a POOLCUDA_CONF value and prints the effective configuration with every
key spelled out; the output is itself a valid POOLCUDA_CONF. "" means the
defaults. Status 2 and a message naming the key, the text and what was expected
when the value is invalid; status 1 and a message when it is valid but the
library could not write reports to its report_path (seen from the current
directory).
)";

constexpr std::string_view kConfIntro = R"(Configuration (POOLCUDA_CONF): comma-separated key:value entries, read once
when the library loads. Sizes are integers with an optional K, M, G or T
(binary multiples) and an optional iB or B, e.g. 64M, 64MiB, 512.
Example:
  POOLCUDA_CONF='pools:[sliced(page=64M,slice=16M,cap=1G);direct(reclaim=4G)]'
Pools are separated by ';'. Pool fields: sliced(page=SIZE required,
slice=SIZE default page, cap=SIZE default none, period=N), exclusive(max=SIZE
required, period=N), split(max=SIZE required, period=N), direct(reclaim=SIZE
required).

Keys (default first):
)";

struct CommandHelp {
  std::string_view name;
  std::string_view text;
};

constexpr std::array<CommandHelp, 4> kCommands = {{
    {"run", kRunHelp},
    {"report", kReportHelp},
    {"trim", kTrimHelp},
    {"check-conf", kCheckConfHelp},
}};

// Plain text as a roff block that keeps its layout: no filling, backslashes and leading
// control characters escaped.
std::string roff_block(std::string_view text) {
  std::string out = ".nf\n";
  bool line_start = true;
  for (const char c : text) {
    if (line_start && (c == '.' || c == '\'')) out += "\\&";
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
    line_start = c == '\n';
  }
  if (!out.ends_with('\n')) out += '\n';
  return out + ".fi\n";
}

}  // namespace

std::string_view main_help() { return kMainHelp; }

std::string_view command_help(std::string_view command) {
  for (const CommandHelp& help : kCommands) {
    if (help.name == command) return help.text;
  }
  return {};
}

std::string command_usage(std::string_view command) {
  const std::string_view help = command_help(command);
  std::string out;
  for (const char c : help.substr(0, help.find("\n\n"))) {
    if (c != '\n' && (c != ' ' || !out.ends_with(' '))) out += c;
  }
  return out;
}

std::string conf_help() {
  std::string out(kConfIntro);
  for (const auto& key : config_keys()) {
    out += "  " + std::string(key.key) + ":" + key.default_value + "\n      " +
           std::string(key.summary) + "\n      values: " + key.grammar + "\n";
  }
  return out;
}

std::string man_page() {
  std::string out = ".TH POOLCUDA 1 \"\" \"poolcuda " POOLCUDA_CLI_VERSION "\" \"User Commands\"\n";
  out += ".SH NAME\npoolcuda \\- run CUDA programs with the libpoolcuda.so pooled allocator\n";
  out += ".SH SYNOPSIS\n" + roff_block(main_help());
  out += ".SH COMMANDS\n";
  for (const CommandHelp& help : kCommands) {
    out += ".SS " + std::string(help.name) + "\n" + roff_block(help.text);
  }
  out += ".SH CONFIGURATION\n" + roff_block(conf_help());
  return out;
}

}  // namespace poolcuda::cli
