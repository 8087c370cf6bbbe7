// The differential test's call records, their comparison, the hang watchdog and the trace file
// (see differential_trace.h).
#include "differential_trace.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace differential {

namespace {

constexpr const char* kCallNames[] = {
    "cudaMalloc",         "cudaMallocAsync",      "cudaFree",          "cudaFreeAsync",
    "cudaMemset",         "cudaMemsetAsync",      "cudaMemcpy",        "cudaMemcpyAsync",
    "cudaMemGetInfo",     "cudaSetDevice",        "cudaStreamCreate",  "cudaStreamDestroy",
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaDeviceReset", "cudaEventCreate",
    "cudaEventRecord",    "cudaEventSynchronize", "cudaEventDestroy",  "cudaStreamWaitEvent",
    "cudaLaunchHostFunc", "cudaLaunchKernel", "cudaGetLastError",
};
static_assert(sizeof kCallNames / sizeof kCallNames[0] == static_cast<int>(Call::count_));

// Reports from several threads never interleave; the first one ends the run.
std::mutex& print_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::string code_text(int code) {
  return std::string(cudaGetErrorName(static_cast<cudaError_t>(code))) + " (" +
         std::to_string(code) + ")";
}

std::string case_text(const RunInfo& run) {
  return "seed " + std::to_string(run.seed) + " config " + run.config + " (" +
         (run.library ? "run under libpoolcuda.so" : "plain run") + ")";
}

}  // namespace

const char* call_name(Call call) { return kCallNames[static_cast<int>(call)]; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void stop_run(int status, const std::string& text) {
  std::lock_guard<std::mutex> hold(print_mutex());
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
  ::_exit(status);
}

Recorder::Recorder(int thread, const RunInfo& run, const std::vector<Entry>* reference,
                   bool clear_errors)
    : thread_(thread), run_(run), reference_(reference), clear_errors_(clear_errors) {}

void Recorder::begin(const char* format, ...) {
  char* line = history_[described_ % kHistory];
  int n = std::snprintf(line, kLine, "#%zu ", entries_.size());
  va_list args;
  va_start(args, format);
  std::vsnprintf(line + n, static_cast<std::size_t>(kLine - n), format, args);
  va_end(args);
  ++described_;
  in_flight_since_.store(now_ns(), std::memory_order_release);
}

void Recorder::settle(Call call, cudaError_t code) {
  in_flight_since_.store(0, std::memory_order_relaxed);
  if (described_ > 0) {
    char* line = history_[(described_ - 1) % kHistory];
    std::size_t used = std::strlen(line);
    std::snprintf(line + used, kLine - used, " -> %s", cudaGetErrorName(code));
  }
  entries_.push_back(Entry{call, static_cast<int>(code)});
  if (clear_errors_ && code != cudaSuccess) (void)cudaGetLastError();
}

bool Recorder::end(Call call, cudaError_t code) {
  const std::size_t index = entries_.size();
  settle(call, code);
  if (reference_ == nullptr) {
    if (code == cudaErrorMemoryAllocation) ++plain_oom_;
    return code == cudaSuccess;
  }
  if (index >= reference_->size()) {
    diverge(call, code, "the plain run made no such call (the runs are out of step)");
  }
  const Entry& plain = (*reference_)[index];
  if (plain.call != call) {
    diverge(call, code, std::string("the plain run's call here was ") + call_name(plain.call) +
                            " (the runs are out of step)");
  }
  if (plain.code == static_cast<int>(code)) return code == cudaSuccess;
  if (plain.code == cudaErrorMemoryAllocation && code == cudaSuccess) {
    ++served_more_;  // allowed: the caller undoes it to stay in step with the plain run
    return false;
  }
  diverge(call, code, "the plain run got " + code_text(plain.code));
}

bool Recorder::end_allocation(Call call, cudaError_t code, std::uint64_t free_after,
                              std::uint64_t tight_bytes, bool* tight) {
  const std::size_t index = entries_.size();
  if (reference_ == nullptr) {
    *tight = code == cudaSuccess && free_after < tight_bytes;
    const bool ok = end(call, code);
    entries_.back().free_after = free_after;
    return ok;
  }
  *tight = index < reference_->size() && (*reference_)[index].call == call &&
           (*reference_)[index].code == cudaSuccess &&
           (*reference_)[index].free_after < tight_bytes;
  if (*tight && code == cudaErrorMemoryAllocation) {
    settle(call, code);
    ++tight_refused_;
    return false;
  }
  return end(call, code);
}

void Recorder::check(bool ok, const char* format, ...) {
  if (ok) return;
  char what[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(what, sizeof what, format, args);
  va_end(args);
  std::lock_guard<std::mutex> hold(print_mutex());
  std::fflush(stdout);
  std::fprintf(stderr, "%s in %s, %s, before call #%zu: %s\n",
               run_.library ? "divergence" : "the plain run failed its own check",
               case_text(run_).c_str(), where().c_str(), entries_.size(), what);
  if (!run_.library) {
    std::fprintf(stderr, "(the plain run must pass every check: a bug in the test program)\n");
  }
  print_history(kHistory);
  std::fflush(stderr);
  ::_exit(run_.library ? kExitDivergence : kExitPlainFailure);
}

void Recorder::diverge(Call call, cudaError_t code, const std::string& why) {
  std::lock_guard<std::mutex> hold(print_mutex());
  std::fflush(stdout);
  std::fprintf(stderr, "divergence in %s, %s, call #%zu %s: returned %s; %s\n",
               case_text(run_).c_str(), where().c_str(), entries_.size() - 1, call_name(call),
               code_text(code).c_str(), why.c_str());
  print_history(kHistory);
  std::fflush(stderr);
  ::_exit(kExitDivergence);
}

std::string Recorder::where() const {
  return "thread " + std::to_string(thread_) + " in phase " + std::to_string(phase_) +
         (alone_ ? " (alone)" : " (with the other threads)");
}

bool Recorder::stuck(int seconds, std::int64_t now) const {
  std::int64_t since = in_flight_since_.load(std::memory_order_acquire);
  return since != 0 && now - since > std::int64_t{seconds} * 1'000'000'000;
}

void Recorder::print_history(int max_lines) const {
  std::fprintf(stderr, "recent calls of thread %d (oldest first):\n", thread_);
  const auto lines = static_cast<std::uint64_t>(max_lines < kHistory ? max_lines : kHistory);
  const std::uint64_t first = described_ > lines ? described_ - lines : 0;
  for (std::uint64_t i = first; i < described_; ++i) {
    std::fprintf(stderr, "  %s\n", history_[i % kHistory]);
  }
}

Watchdog::Watchdog(const RunInfo& run, const std::vector<std::unique_ptr<Recorder>>& recorders)
    : run_(run), recorders_(recorders), thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  stop_.store(true);
  thread_.join();
}

void Watchdog::watch() {
  while (!stop_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::int64_t now = now_ns();
    for (const auto& recorder : recorders_) {
      if (!recorder->stuck(run_.hang_seconds, now)) continue;
      std::lock_guard<std::mutex> hold(print_mutex());
      std::fflush(stdout);
      std::fprintf(stderr, "hang in %s: %s, has been in one call for over %d s%s\n",
                   case_text(run_).c_str(), recorder->where().c_str(), run_.hang_seconds,
                   run_.library ? " (the plain run finished it)" : "");
      recorder->print_history(24);
      for (const auto& other : recorders_) {
        if (other != recorder) other->print_history(4);
      }
      std::fflush(stderr);
      ::_exit(kExitHang);
    }
  }
}

bool write_trace(const std::string& path, const std::vector<std::unique_ptr<Recorder>>& threads) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return false;
  std::fprintf(file, "differential-trace %zu\n", threads.size());
  for (const auto& thread : threads) {
    std::fprintf(file, "thread %zu\n", thread->entries().size());
    for (const Entry& entry : thread->entries()) {
      std::fprintf(file, "%d %d %llu\n", static_cast<int>(entry.call), entry.code,
                   static_cast<unsigned long long>(entry.free_after));
    }
  }
  return std::fclose(file) == 0;
}

bool read_trace(const std::string& path, std::vector<std::vector<Entry>>* threads) {
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return false;
  std::size_t count = 0;
  bool ok = std::fscanf(file, "differential-trace %zu", &count) == 1;
  threads->assign(ok ? count : 0, {});
  for (auto& entries : *threads) {
    std::size_t calls = 0;
    ok = ok && std::fscanf(file, " thread %zu", &calls) == 1;
    for (std::size_t i = 0; ok && i < calls; ++i) {
      int call = 0;
      int code = 0;
      unsigned long long free_after = 0;
      ok = std::fscanf(file, "%d %d %llu", &call, &code, &free_after) == 3 && call >= 0 &&
           call < static_cast<int>(Call::count_);
      if (ok) entries.push_back(Entry{static_cast<Call>(call), code, free_after});
    }
  }
  std::fclose(file);
  return ok;
}

}  // namespace differential
