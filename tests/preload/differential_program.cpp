// One run of a differential case, in a child process: sets up the program (devices, their
// capacity, the host pattern), runs its phases (single-threaded ones and ones where every
// worker runs on its own thread, a device synchronization between them), frees everything,
// then checks the stand-in's race detector and writes or compares the record.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "differential_worker.h"

namespace differential {

namespace {

constexpr int kStepsPerPhase = 250;
constexpr std::size_t kPatternBytes = std::size_t{2} << 20;

std::vector<unsigned char> make_pattern(std::uint64_t seed) {
  std::vector<unsigned char> pattern(kPatternBytes);
  std::uint64_t state = seed;
  for (std::size_t i = 0; i < pattern.size(); i += 8) {
    // splitmix64
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(pattern.data() + i, &z, std::min<std::size_t>(8, pattern.size() - i));
  }
  return pattern;
}

bool library_loaded() {
  Dl_info info{};
  void* address = ::dlsym(RTLD_DEFAULT, "cudaMalloc");
  return address != nullptr && ::dladdr(address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "poolcuda") != nullptr;
}

}  // namespace

std::string turn_off(const std::string& names, Profile* profile) {
  struct Feature {
    const char* name;
    bool Profile::*flag;
  };
  static constexpr Feature kFeatures[] = {
      {"streams", &Profile::streams}, {"gates", &Profile::gates},
      {"big", &Profile::big},         {"async", &Profile::async},
      {"reset", &Profile::reset},     {"reported_free", &Profile::reported_free},
      {"leave_errors", &Profile::leave_errors}};
  std::size_t begin = 0;
  while (begin < names.size()) {
    std::size_t end = names.find(',', begin);
    if (end == std::string::npos) end = names.size();
    const std::string name = names.substr(begin, end - begin);
    bool known = name == "threads";
    if (known) profile->threads = 1;
    for (const Feature& feature : kFeatures) {
      if (name == feature.name) {
        profile->*feature.flag = false;
        known = true;
      }
    }
    if (!known) return name;
    begin = end + 1;
  }
  return "";
}

int run_program(const RunInfo& run, const Profile& profile, const std::string& trace_path,
                const std::string& reference_path) {
  const auto threads = static_cast<std::size_t>(profile.threads);
  if (run.library != library_loaded()) {
    stop_run(kExitPlainFailure, run.library ? "the run under the library does not have it loaded"
                                            : "the plain run has libpoolcuda.so loaded");
  }
  std::vector<std::vector<Entry>> reference;
  if (run.library && (!read_trace(reference_path, &reference) || reference.size() != threads)) {
    stop_run(kExitPlainFailure, "cannot read the plain run's record " + reference_path);
  }

  Program program;
  program.run = run;
  program.profile = profile;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    stop_run(kExitPlainFailure, "no CUDA device");
  }
  using MemGetInfo = cudaError_t (*)(std::size_t*, std::size_t*);
  program.device_memory = preload_test::real<MemGetInfo>("cudaMemGetInfo");
  for (int device = 0; device < std::min(devices, 2); ++device) {
    std::size_t free_bytes = 0;
    std::size_t total = 0;
    if (cudaSetDevice(device) != cudaSuccess ||
        program.device_memory(&free_bytes, &total) != cudaSuccess) {
      stop_run(kExitPlainFailure, "cannot read the size of device " + std::to_string(device));
    }
    program.capacity.push_back(total);
  }
  if (cudaSetDevice(0) != cudaSuccess) stop_run(kExitPlainFailure, "cannot select device 0");
  program.pattern = make_pattern(run.seed);

  std::vector<std::unique_ptr<Recorder>> recorders;
  std::vector<std::unique_ptr<Worker>> workers;
  for (std::size_t i = 0; i < threads; ++i) {
    recorders.push_back(std::make_unique<Recorder>(static_cast<int>(i), program.run,
                                                   run.library ? &reference[i] : nullptr,
                                                   !profile.leave_errors));
    workers.push_back(std::make_unique<Worker>(static_cast<int>(i), program, *recorders[i]));
    program.workers.push_back(workers.back().get());
  }

  {
    Watchdog watchdog(program.run, recorders);
    // Alone, together, alone...: a single-threaded program runs alone three times.
    const int phases = threads > 1 ? 5 : 3;
    for (int phase = 0; phase < phases; ++phase) {
      const bool alone = phase % 2 == 0 || threads == 1;
      for (auto& recorder : recorders) recorder->set_phase(phase + 1, alone);
      if (phase > 0) workers[0]->synchronize_devices();
      if (alone) {
        std::thread([&] { workers[0]->run(kStepsPerPhase, true); }).join();
        continue;
      }
      std::vector<std::thread> running;
      for (auto& worker : workers) {
        running.emplace_back([&worker] { worker->run(kStepsPerPhase, false); });
      }
      for (auto& thread : running) thread.join();
    }
    for (auto& recorder : recorders) recorder->set_phase(phases + 1, true);
    workers[0]->synchronize_devices();
    for (auto& worker : workers) worker->teardown();
    workers[0]->synchronize_devices();
  }

  std::uint64_t calls = 0;
  std::uint64_t out_of_memory = 0;
  std::uint64_t served_more = 0;
  std::uint64_t tight_refused = 0;
  for (std::size_t i = 0; i < threads; ++i) {
    calls += recorders[i]->entries().size();
    served_more += recorders[i]->served_more();
    tight_refused += recorders[i]->tight_refused();
    if (!run.library) out_of_memory += recorders[i]->plain_out_of_memory();
    if (run.library && recorders[i]->entries().size() != reference[i].size()) {
      stop_run(kExitDivergence, "thread " + std::to_string(i) + " made " +
                                    std::to_string(recorders[i]->entries().size()) +
                                    " calls, the plain run " + std::to_string(reference[i].size()));
    }
    if (run.library) {
      for (const Entry& entry : reference[i]) {
        out_of_memory += entry.code == cudaErrorMemoryAllocation ? 1 : 0;
      }
    }
  }
  if (preload_test::on_stand_in()) {
    if (std::uint64_t races = preload_test::counter("races")) {
      // A normal exit: the stand-in describes the races when the process ends.
      std::fprintf(stderr, "%s: the stand-in's race detector counted %llu race(s)\n",
                   run.library ? "divergence" : "the plain run failed its own check",
                   static_cast<unsigned long long>(races));
      return run.library ? kExitDivergence : kExitPlainFailure;
    }
  }
  if (!run.library && !write_trace(trace_path, recorders)) {
    stop_run(kExitPlainFailure, "cannot write the record " + trace_path);
  }
  std::printf("summary: %llu calls on %zu threads, %llu out-of-memory answers in the plain run "
              "(%llu of them served by the library), %llu tight fits refused by the library\n",
              static_cast<unsigned long long>(calls), threads,
              static_cast<unsigned long long>(out_of_memory),
              static_cast<unsigned long long>(served_more),
              static_cast<unsigned long long>(tight_refused));
  return 0;
}

}  // namespace differential
