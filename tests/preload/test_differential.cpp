// Preload test: the differential test. A randomized CUDA program, generated from a seed, runs
// twice as a child process: once plainly (libpoolcuda.so removed from LD_PRELOAD) and once
// under the library. Every call the plain run succeeds must succeed under the library, with the
// same data read back; an out-of-memory in the plain run may succeed under the library, never
// the reverse; other errors must be the same. No run may hang (each child has a watchdog) and
// the stand-in's race detector must count nothing. The program: allocations of many sizes
// (zero, huge, most of the device), frees (double, interior, from another device), memsets and
// copies checked by reading back, cudaMemGetInfo (and allocating all it reports free), streams
// created and destroyed with work queued, streams parked on host functions (for a while, or
// until the program opens a gate), events, device synchronizations and resets, two devices,
// several threads (differential_worker.h).
//
//   test_differential CONFIG            seeds 1 and 2 (as in the test suite)
//   test_differential SEED CONFIG       one case (what a failure prints to rerun it)
//   test_differential FIRST-LAST CONFIG  a range of seeds, to look for new divergences
//   test_differential --list            the configurations
// DIFFTEST_OFF=big,reported_free,... turns features of the program off (see differential::Profile)
// to look past a known divergence; DIFFTEST_HANG_SECONDS (default 5) is how long a call may take.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "differential_worker.h"

namespace {

using differential::Profile;

struct Configuration {
  const char* name;
  std::vector<std::string> env;  // besides LD_PRELOAD
  Profile profile;
  const char* about;
};

Profile single_stream() {
  Profile profile;
  profile.streams = false;  // the legacy stream only: what free_fence:none is safe for
  return profile;
}

Profile stream_ordered() {
  Profile profile;
  profile.async = true;
  profile.big = false;  // cudaFreeAsync returns memory later: out-of-memory would be a race
  return profile;
}

const std::vector<Configuration>& configurations() {
  static const std::vector<Configuration> all = {
      {"defaults", {}, Profile{}, "the default configuration on a 16 GiB device"},
      {"small_device", {"SIMCUDA_DEVICE_MEMORY=96M"}, Profile{},
       "a 96 MiB device: out-of-memory is common"},
      {"two_devices", {"SIMCUDA_DEVICES=2", "SIMCUDA_DEVICE_MEMORY=512M"}, Profile{},
       "two 512 MiB devices"},
      {"caps",
       {"SIMCUDA_DEVICE_MEMORY=1G",
        "POOLCUDA_CONF=pools:[sliced(page=1M,slice=64K,cap=8M);sliced(page=8M,slice=2M,cap=32M);"
        "sliced(page=64M,cap=256M);direct(reclaim=64M)]"},
       Profile{}, "capped pools that spill into the next one"},
      {"short_periods",
       {"SIMCUDA_DEVICE_MEMORY=1G",
        "POOLCUDA_CONF=pools:[sliced(page=1M,slice=64K,period=20);exclusive(max=32M,period=20);"
        "direct(reclaim=16M)]"},
       Profile{}, "pools that return idle pages after a few reservations"},
      {"exclusive_layout", {"SIMCUDA_DEVICE_MEMORY=1G", "POOLCUDA_CONF=pools:exclusive"},
       Profile{}, "the exclusive preset"},
      {"split_layout",
       {"SIMCUDA_DEVICE_MEMORY=256M",
        "POOLCUDA_CONF=pools:[sliced(page=2M,slice=512K);split(max=256M,period=20)]"},
       Profile{}, "a split pool that returns idle pages after a few reservations, 256 MiB"},
      {"fence_sync", {"SIMCUDA_DEVICE_MEMORY=1G", "POOLCUDA_CONF=free_fence:sync"}, Profile{},
       "free_fence:sync"},
      {"fence_none", {"SIMCUDA_DEVICE_MEMORY=1G", "POOLCUDA_CONF=free_fence:none"},
       single_stream(), "free_fence:none with a program that uses the legacy stream only"},
      {"fence_slack_0", {"SIMCUDA_DEVICE_MEMORY=256M", "POOLCUDA_CONF=fence_slack:0"}, Profile{},
       "fence_slack:0 on a 256 MiB device"},
      {"unfenced_streams", {"SIMCUDA_DEVICE_MEMORY=1G", "POOLCUDA_CONF=free_fence:none"},
       Profile{}, "free_fence:none with streams: unsafe by design, the test must see it"},
      {"stream_ordered", {"SIMCUDA_DEVICE_MEMORY=1G"}, stream_ordered(),
       "cudaMallocAsync and cudaFreeAsync besides cudaMalloc and cudaFree"},
  };
  return all;
}

const Configuration* find_configuration(const std::string& name) {
  for (const Configuration& configuration : configurations()) {
    if (name == configuration.name) return &configuration;
  }
  return nullptr;
}

// Every variable a configuration may set: a child gets exactly its configuration's values.
constexpr const char* kConfigurationVariables[] = {"POOLCUDA_CONF", "SIMCUDA_DEVICE_MEMORY",
                                                   "SIMCUDA_DEVICES", "SIMCUDA_OP_DELAY_US",
                                                   "SIMCUDA_STRICT"};

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// LD_PRELOAD without libpoolcuda.so (a sanitizer runtime stays first).
std::string preload_without_library() {
  const std::string preload = env_or("LD_PRELOAD", "");
  std::string kept;
  std::size_t begin = 0;
  while (begin <= preload.size()) {
    std::size_t end = preload.find_first_of(": ", begin);
    if (end == std::string::npos) end = preload.size();
    std::string entry = preload.substr(begin, end - begin);
    if (!entry.empty() && entry.find("libpoolcuda") == std::string::npos) {
      kept += (kept.empty() ? "" : ":") + entry;
    }
    begin = end + 1;
  }
  return kept;
}

// On a GPU at least a minute: a cudaMalloc of most of an H200 took over 5 s in a plain run.
int hang_seconds() {
  const int configured = std::atoi(env_or("DIFFTEST_HANG_SECONDS", "5").c_str());
  return preload_test::on_stand_in() ? configured : std::max(configured, 60);
}

std::string self_path() {
  char path[4096];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<std::size_t>(n)) : "test_differential";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string summary_of(const std::string& output) {
  std::size_t at = output.rfind("summary: ");
  if (at == std::string::npos) return "";
  return output.substr(at + 9, output.find('\n', at) - at - 9);
}

enum class Outcome { passed, failed, skipped };

// Runs one case; prints one line, or the failure and how to rerun it.
Outcome run_case(std::uint64_t seed, const Configuration& configuration) {
  char trace[4096];
  std::snprintf(trace, sizeof trace, "%s/poolcuda-differential-XXXXXX",
                env_or("TMPDIR", "/tmp").c_str());
  int fd = ::mkstemp(trace);
  CHECK_MSG(fd >= 0, std::string("cannot create ") + trace);
  ::close(fd);

  std::vector<std::string> env(std::begin(kConfigurationVariables),
                               std::end(kConfigurationVariables));
  env.insert(env.end(), configuration.env.begin(), configuration.env.end());
  env.push_back("DIFFTEST_SEED=" + std::to_string(seed));
  env.push_back(std::string("DIFFTEST_CONFIG=") + configuration.name);
  env.push_back(std::string("DIFFTEST_TRACE=") + trace);
  const int limit = 8 * hang_seconds() + 60;  // the children's own watchdogs report far sooner

  std::vector<std::string> plain_env = env;
  const std::string kept = preload_without_library();
  plain_env.push_back(kept.empty() ? std::string("LD_PRELOAD") : "LD_PRELOAD=" + kept);
  plain_env.push_back("DIFFTEST_MODE=plain");
  auto start = std::chrono::steady_clock::now();
  preload_test::ChildResult plain = preload_test::run_self("--child", plain_env, limit);
  const double plain_seconds = seconds_since(start);

  preload_test::ChildResult library;
  double library_seconds = 0;
  if (plain.status == 0) {
    std::vector<std::string> library_env = env;
    library_env.push_back("DIFFTEST_MODE=library");
    start = std::chrono::steady_clock::now();
    library = preload_test::run_self("--child", library_env, limit);
    library_seconds = seconds_since(start);
  }
  ::unlink(trace);

  const std::string off = env_or("DIFFTEST_OFF", "");
  const std::string rerun = "rerun: " + (off.empty() ? "" : "DIFFTEST_OFF=" + off + " ") +
                            "LD_PRELOAD=" + env_or("LD_PRELOAD", "") +
                            " LD_LIBRARY_PATH=" + env_or("LD_LIBRARY_PATH", "") + " " +
                            self_path() + " " + std::to_string(seed) + " " + configuration.name;
  if (plain.status != 0 && !preload_test::on_stand_in() &&
      (plain.timed_out || plain.status == differential::kExitHang)) {
    // CUDA itself stuck in one call (an H200 once spent over a minute in a cudaMalloc of nearly
    // all its free memory): there is nothing to compare with. On the stand-in every call is
    // quick, and a plain hang is the test program's fault, below.
    std::printf("seed %llu config %s: skipped: the plain run hung in CUDA itself, so nothing "
                "was compared:\n%s",
                static_cast<unsigned long long>(seed), configuration.name, plain.output.c_str());
    return Outcome::skipped;
  }
  if (plain.status != 0) {
    const std::string how = plain.timed_out ? "killed after " + std::to_string(limit) + " s"
                                            : "status " + std::to_string(plain.status);
    std::printf("seed %llu config %s: the plain run failed (%s), so nothing was compared; the "
                "test program is at fault:\n%s%s\n",
                static_cast<unsigned long long>(seed), configuration.name, how.c_str(),
                plain.output.c_str(), rerun.c_str());
    return Outcome::failed;
  }
  if (library.status == 0) {
    std::printf("seed %llu config %s: same results (%s; plain %.2f s, library %.2f s)\n",
                static_cast<unsigned long long>(seed), configuration.name,
                summary_of(library.output).c_str(), plain_seconds, library_seconds);
    return Outcome::passed;
  }
  std::string what;
  if (library.timed_out) {
    what = "a hang: the run under the library was killed after " + std::to_string(limit) +
           " s (the plain run took " + std::to_string(plain_seconds) + " s)";
  } else if (library.status == differential::kExitDivergence) {
    what = "a divergence";
  } else if (library.status == differential::kExitHang) {
    what = "a hang";
  } else if (library.status > 128) {
    what = "a crash: the run under the library died of signal " +
           std::to_string(library.status - 128);
  } else {
    what = "a failure: the run under the library exited with status " +
           std::to_string(library.status);
  }
  std::printf("seed %llu config %s: %s\n%s%s\n", static_cast<unsigned long long>(seed),
              configuration.name, what.c_str(), library.output.c_str(), rerun.c_str());
  return Outcome::failed;
}

int child_main() {
  const Configuration* configuration = find_configuration(env_or("DIFFTEST_CONFIG", ""));
  CHECK_MSG(configuration != nullptr, "DIFFTEST_CONFIG names no configuration");
  differential::RunInfo run;
  run.seed = std::strtoull(env_or("DIFFTEST_SEED", "0").c_str(), nullptr, 10);
  run.config = configuration->name;
  run.library = env_or("DIFFTEST_MODE", "") == "library";
  run.hang_seconds = hang_seconds();
  Profile profile = configuration->profile;
  const std::string unknown = differential::turn_off(env_or("DIFFTEST_OFF", ""), &profile);
  CHECK_MSG(unknown.empty(), "DIFFTEST_OFF: no feature named " + unknown);
  const std::string trace = env_or("DIFFTEST_TRACE", "");
  return differential::run_program(run, profile, trace, trace);
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: test_differential [SEED | FIRST-LAST] CONFIG   (or --list)\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--child") == 0) return child_main();
  if (argc > 1 && std::strcmp(argv[1], "--list") == 0) {
    for (const Configuration& c : configurations()) std::printf("%-18s %s\n", c.name, c.about);
    return 0;
  }
  const Configuration* configuration = nullptr;
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  for (int i = 1; i < argc; ++i) {
    unsigned long long a = 0;
    unsigned long long b = 0;
    char extra = 0;
    if (std::sscanf(argv[i], "%llu-%llu%c", &a, &b, &extra) == 2 && a <= b) {
      first = a;
      last = b;
    } else if (std::sscanf(argv[i], "%llu%c", &a, &extra) == 1) {
      first = last = a;
    } else if ((configuration = find_configuration(argv[i])) == nullptr) {
      usage((std::string("no configuration named ") + argv[i]).c_str());
    }
  }
  if (configuration == nullptr) usage("which configuration?");
  if (first == 0) {
    first = 1;
    last = 2;
  }
  preload_test::require_preloaded();
  int failed = 0;
  int skipped = 0;
  for (std::uint64_t seed = first; seed <= last; ++seed) {
    const Outcome outcome = run_case(seed, *configuration);
    failed += outcome == Outcome::failed ? 1 : 0;
    skipped += outcome == Outcome::skipped ? 1 : 0;
    std::fflush(stdout);
  }
  const auto cases = static_cast<int>(last - first + 1);
  std::printf("%s: %d case(s), %d failed, %d skipped\n", configuration->name, cases, failed,
              skipped);
  if (failed > 0) return 1;
  if (skipped == cases) preload_test::skip("the plain run hung in CUDA itself: nothing compared");
  return 0;
}
