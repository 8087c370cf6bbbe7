// poolcuda_trace_gen: writes the benchmark's traces as text files (docs/benchmarks.md).
//
//   poolcuda_trace_gen --list
//   poolcuda_trace_gen [--seed N] [--scale X] --out-dir DIR [NAME...]
//
// --list prints every trace of the suite, one "NAME<TAB>SUMMARY" line each. Otherwise writes
// DIR/NAME.trace for each NAME (all of the suite when none is given) and prints, per file, one
// line of JSON: name, file, threads, pairs, peak live bytes, description.
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tools/bench/json.h"
#include "tools/bench/trace_gen.h"

namespace {

using namespace poolcuda::bench;

[[noreturn]] void usage(const std::string& message) {
  if (!message.empty()) std::fprintf(stderr, "poolcuda_trace_gen: %s\n", message.c_str());
  std::fprintf(stderr,
               "usage: poolcuda_trace_gen --list\n"
               "       poolcuda_trace_gen [--seed N] [--scale X] --out-dir DIR [NAME...]\n"
               "  --seed N     generator seed (default 1)\n"
               "  --scale X    multiply operation counts by X, 0 < X <= 1 (default 1)\n"
               "  --out-dir D  folder for NAME.trace files (created if missing)\n");
  std::exit(message.empty() ? 0 : 64);
}

}  // namespace

int main(int argc, char** argv) {
  GenOptions options;
  std::string out_dir;
  std::vector<std::string> names;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage("");
    if (arg == "--list") {
      list = true;
    } else if (arg == "--seed" || arg == "--scale" || arg == "--out-dir") {
      if (i + 1 >= argc) usage("missing value after " + arg);
      const std::string value = argv[++i];
      if (arg == "--out-dir") {
        out_dir = value;
      } else if (arg == "--seed") {
        auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), options.seed);
        if (ec != std::errc() || end != value.data() + value.size()) usage("--seed wants a number");
      } else {
        char* end = nullptr;
        options.scale = std::strtod(value.c_str(), &end);
        if (end == value.c_str() || *end != '\0' || !(options.scale > 0 && options.scale <= 1)) {
          usage("--scale wants a number in (0, 1]");
        }
      }
    } else if (arg.rfind("--", 0) == 0) {
      usage("unknown option " + arg);
    } else {
      names.push_back(arg);
    }
  }
  const std::vector<TraceEntry> suite = suite_traces();
  if (list) {
    for (const TraceEntry& e : suite) std::printf("%s\t%s\n", e.name.c_str(), e.summary.c_str());
    return 0;
  }
  if (out_dir.empty()) usage("--out-dir is required");
  if (names.empty()) {
    for (const TraceEntry& e : suite) names.push_back(e.name);
  }
  for (const std::string& name : names) {  // every name is checked before anything is written
    bool known = false;
    for (const TraceEntry& e : suite) known = known || e.name == name;
    if (!known) usage("no trace named '" + name + "' (see --list)");
  }
  if (mkdir(out_dir.c_str(), 0777) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "poolcuda_trace_gen: cannot create %s: %s\n", out_dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  for (const std::string& name : names) {
    const Trace trace = *generate(name, options);
    const std::string path = out_dir + "/" + name + ".trace";
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    write_trace(trace, out);
    out.close();
    if (!out) {
      std::fprintf(stderr, "poolcuda_trace_gen: cannot write %s\n", path.c_str());
      return 1;
    }
    const TraceFigures f = figures(trace);
    std::printf("{\"name\":%s,\"file\":%s,\"threads\":%zu,\"pairs\":%llu,\"peak_live_bytes\":%llu,"
                "\"description\":%s}\n",
                json_string(name).c_str(), json_string(path).c_str(), trace.threads.size(),
                static_cast<unsigned long long>(f.pairs),
                static_cast<unsigned long long>(f.peak_live),
                json_string(trace.description).c_str());
  }
  return 0;
}
