// The differential test's record of one run: every CUDA call each program thread makes, in
// order, with the error code it returned. The plain run (no library) writes its record to a
// file; the run under libpoolcuda.so reads it and compares each call as it returns, so the
// first divergence is reported where it happens, with the thread's recent calls around it. A
// watchdog thread reports a call that does not return (a hang) the same way.
//
// Depends on the CUDA runtime header only; knows nothing of what the program does.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace differential {

// Every kind of call the program makes; the two runs must make the same calls in the same order.
enum class Call : std::uint8_t {
  malloc,
  malloc_async,
  free,
  free_async,
  memset,
  memset_async,
  memcpy,
  memcpy_async,
  mem_get_info,
  set_device,
  stream_create,
  stream_destroy,
  stream_synchronize,
  device_synchronize,
  device_reset,
  event_create,
  event_record,
  event_synchronize,
  event_destroy,
  stream_wait_event,
  launch_host_func,
  launch_kernel,
  get_last_error,
  count_,
};

const char* call_name(Call call);

struct Entry {
  Call call;
  int code;
  std::uint64_t free_after = 0;  // allocations in the plain run: the device's free bytes after
};

// What a run is: the case being run, and whether this is the run under the library.
struct RunInfo {
  std::uint64_t seed = 0;
  std::string config;
  bool library = false;
  int hang_seconds = 5;  // a call that takes longer than this is reported as a hang
};

// Failure exits of a run (the parent tells them apart).
constexpr int kExitDivergence = 1;
constexpr int kExitPlainFailure = 2;
constexpr int kExitHang = 3;

// One program thread's calls. begin() describes the call about to be made (for reports) and
// marks it in flight; end() records the result, compares it with the plain run's and says
// whether the program goes on as if the call succeeded.
class Recorder {
 public:
  // `clear_errors`: after a failed call, the last-error slot is cleared (unrecorded).
  Recorder(int thread, const RunInfo& run, const std::vector<Entry>* reference,
           bool clear_errors);

  void begin(const char* format, ...) __attribute__((format(printf, 2, 3)));
  // The plain run's result rules. Under the library the result must be the plain run's, except
  // that an out-of-memory there may be a success here (the library may succeed more often): then
  // end() returns false and the program undoes the call (frees the memory) to stay in step.
  bool end(Call call, cudaError_t code);
  // For an allocation the program keeps: like end(), and says whether it was a tight fit, one
  // that left the plain run's device less than `tight_bytes` free (`free_after`, measured by
  // the plain run only). Pages the library must keep for its live slices may leave it without
  // such an allocation: a tight fit may fail under the library; the program gives it back at
  // once in both runs (unrecorded), so both go on with the same buffers.
  bool end_allocation(Call call, cudaError_t code, std::uint64_t free_after,
                      std::uint64_t tight_bytes, bool* tight);
  // A check of this run's own (data read back, no overlap, alignment): a failure ends the run.
  void check(bool ok, const char* format, ...) __attribute__((format(printf, 3, 4)));

  // The program's phase, for reports: its number and whether this thread runs alone in it.
  void set_phase(int phase, bool alone) {
    phase_ = phase;
    alone_ = alone;
  }

  const std::vector<Entry>& entries() const { return entries_; }
  std::uint64_t plain_out_of_memory() const { return plain_oom_; }
  std::uint64_t served_more() const { return served_more_; }
  std::uint64_t tight_refused() const { return tight_refused_; }

  // The watchdog's view: the call in flight for longer than `seconds`, if any.
  bool stuck(int seconds, std::int64_t now_ns) const;
  // Prints the thread's recent calls, oldest first (the last one is the call in flight).
  void print_history(int max_lines) const;
  std::string where() const;  // "thread T, phase P (alone|with the other threads)"
  int thread() const { return thread_; }

 private:
  void settle(Call call, cudaError_t code);  // the call returned: history and record
  [[noreturn]] void diverge(Call call, cudaError_t code, const std::string& why);

  static constexpr int kHistory = 24;
  static constexpr int kLine = 200;

  int thread_;
  const RunInfo& run_;
  const std::vector<Entry>* reference_;
  const bool clear_errors_;
  std::vector<Entry> entries_;
  char history_[kHistory][kLine] = {};
  std::uint64_t described_ = 0;  // calls described so far
  int phase_ = 0;
  bool alone_ = true;
  std::atomic<std::int64_t> in_flight_since_{0};
  std::uint64_t plain_oom_ = 0;
  std::uint64_t served_more_ = 0;
  std::uint64_t tight_refused_ = 0;
};

std::int64_t now_ns();

// Prints a report line on stderr under the run's print lock, then exits with `status`.
[[noreturn]] void stop_run(int status, const std::string& text);

// Reports any recorder stuck in a call and ends the run (kExitHang). Stops when destroyed.
class Watchdog {
 public:
  Watchdog(const RunInfo& run, const std::vector<std::unique_ptr<Recorder>>& recorders);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch();

  const RunInfo& run_;
  const std::vector<std::unique_ptr<Recorder>>& recorders_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The plain run's record: one list of entries per program thread.
bool write_trace(const std::string& path, const std::vector<std::unique_ptr<Recorder>>& threads);
bool read_trace(const std::string& path, std::vector<std::vector<Entry>>* threads);

}  // namespace differential
