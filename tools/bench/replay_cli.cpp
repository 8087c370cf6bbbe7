// The replayers' shared command line (replay_cli.h).
#include "tools/bench/replay_cli.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace poolcuda::bench {
namespace {

[[noreturn]] void usage(const char* program, const std::vector<std::string>& allocators,
                        const std::string& message) {
  if (!message.empty()) std::fprintf(stderr, "%s: %s\n", program, message.c_str());
  std::string names;
  for (const std::string& a : allocators) names += (names.empty() ? "" : "|") + a;
  std::fprintf(stderr,
               "usage: %s [--allocator %s] [--label TEXT] [--device-memory SIZE] TRACE_FILE\n"
               "  --allocator A       the allocator to replay against (default %s)\n"
               "  --label TEXT        copied into the JSON output\n"
               "  --device-memory S   capacity of a modelled device (default 16GiB)\n",
               program, names.c_str(), allocators.front().c_str());
  std::exit(message.empty() ? 0 : 64);
}

}  // namespace

bool parse_size(const std::string& text, std::uint64_t& out) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end == text.data()) return false;
  std::string unit(end, text.data() + text.size());
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KiB") {
    shift = 10;
  } else if (unit == "M" || unit == "MiB") {
    shift = 20;
  } else if (unit == "G" || unit == "GiB") {
    shift = 30;
  } else if (unit == "T" || unit == "TiB") {
    shift = 40;
  } else {
    return false;
  }
  if (shift != 0 && n > (~std::uint64_t{0} >> shift)) return false;
  out = n << shift;
  return true;
}

int replay_main(int argc, char** argv, const char* program,
                const std::vector<std::string>& allocators, const AllocatorFactory& make) {
  ReplayArgs args;
  args.allocator = allocators.front();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(program, allocators, "");
    if (arg.rfind("--", 0) != 0) {
      if (!args.trace_path.empty()) usage(program, allocators, "more than one trace file");
      args.trace_path = arg;
      continue;
    }
    if (i + 1 >= argc) usage(program, allocators, "missing value after " + arg);
    const std::string value = argv[++i];
    if (arg == "--allocator") {
      if (std::find(allocators.begin(), allocators.end(), value) == allocators.end()) {
        usage(program, allocators, "unknown allocator '" + value + "'");
      }
      args.allocator = value;
    } else if (arg == "--label") {
      args.label = value;
    } else if (arg == "--device-memory") {
      if (!parse_size(value, args.device_memory) || args.device_memory == 0) {
        usage(program, allocators, "--device-memory wants a size such as 16G");
      }
    } else {
      usage(program, allocators, "unknown option " + arg);
    }
  }
  if (args.trace_path.empty()) usage(program, allocators, "no trace file");

  ParseOutcome parsed = read_trace_file(args.trace_path);
  if (!parsed.trace) {
    std::fprintf(stderr, "%s: %s\n", program, parsed.error.c_str());
    return 65;
  }
  const Trace& trace = *parsed.trace;
  std::string error;
  std::unique_ptr<ReplayAllocator> allocator = make(args, error);
  if (!allocator) {
    std::printf("%s\n", setup_failure_json(trace.name, args.allocator, args.label, error).c_str());
    return 2;
  }
  const ReplayResult result = replay(trace, *allocator);
  std::printf("%s\n", result_json(trace, args.allocator, args.label, result).c_str());
  std::fflush(stdout);
  return result.ok ? 0 : 1;
}

}  // namespace poolcuda::bench
