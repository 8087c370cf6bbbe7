// The exit work (see at_exit.h).
//
// Note [Calls that never arrive]
// A program can use CUDA without any call reaching the library: the library sees the runtime's
// and the driver's entry points through the dynamic linker, dlsym and the driver's resolver
// (docs/interception.md), but not a program that defines its own dlsym, looks functions up with
// dlvsym, or loads CUDA into a namespace of its own with dlmopen. It then runs unpooled, which
// is easy to mistake for "the pools did not help". So a process that has a CUDA runtime or
// driver loaded at exit, but made no call through the library, says so once under log:basic,
// naming the likely causes and where the documentation explains them.
//
// Depends on the snapshots, the registry, the report writer, the log and the configuration.
#include "interpose/at_exit.h"

#include <link.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "interpose/channel_protocol.h"
#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/registry.h"
#include "interpose/report_writer.h"
#include "interpose/snapshots.h"

namespace poolcuda {

namespace {

// How long the exit work waits for the pools' locks (Note [Bounded snapshots]).
constexpr std::chrono::milliseconds kExitBound{2000};

// The file name of a loaded CUDA runtime or driver, or empty.
std::string loaded_cuda_library() {
  std::string found;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        std::string_view name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (const auto slash = name.rfind('/'); slash != std::string_view::npos) {
          name.remove_prefix(slash + 1);
        }
        if (!name.starts_with("libcudart.so") && !name.starts_with("libcuda.so")) return 0;
        *static_cast<std::string*>(data) = std::string(name);
        return 1;
      },
      &found);
  return found;
}

bool summary_requested() {
  const char* value = std::getenv(std::string(channel::kSummaryVariable).c_str());
  return value != nullptr && std::to_string(::getpid()) == value;
}

// Peak memory, overhead, the allocation calls that never reached the driver, fence waits.
std::string summary_line(const ManagerReport& m) {
  // Requests a thread cache served count too; live slices are the program's (parked ones were
  // freed).
  std::uint64_t served = m.thread_cache_hits;
  const std::uint64_t live = m.slices;
  std::uint64_t driver = 0;
  auto add = [&](const PoolReport& pool) {
    served += pool.reservations;
    driver += pool.device_allocs + pool.device_releases;
  };
  for (const PoolReport& pool : m.dynamic) add(pool);
  add(m.persistent);
  std::uint64_t passed = 0;
  if (const PassthroughCounters* counters = Registry::instance().passthrough(m.device)) {
    passed = counters->mallocs.load(std::memory_order_relaxed) +
             counters->frees.load(std::memory_order_relaxed);
  }
  // Every reservation was one cudaMalloc, and every one no longer live one cudaFree.
  const std::uint64_t calls = served + (served > live ? served - live : 0) + passed;
  driver += passed;
  char ratio[32] = "-";
  if (m.bytes_in_use_peak != 0) {
    std::snprintf(ratio, sizeof ratio, "%.2fx",
                  static_cast<double>(m.bytes_reserved_peak) /
                      static_cast<double>(m.bytes_in_use_peak));
  }
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.3f s", m.fence_wait_seconds);
  return "poolcuda: device " + std::to_string(m.device) + ": peak in use " +
         human_bytes(m.bytes_in_use_peak) + ", peak reserved " +
         human_bytes(m.bytes_reserved_peak) + " (" + ratio + "); " +
         std::to_string(calls > driver ? calls - driver : 0) + " of " + std::to_string(calls) +
         " cudaMalloc/cudaFree calls saved; " + std::to_string(m.fence_waits) +
         " fence waits (" + waited + ")\n";
}

std::string summary(const Snapshots& snapshots) {
  std::string out;
  for (const ManagerReport& m : snapshots.reports) out += summary_line(m);
  for (int device : snapshots.skipped) {
    out += "poolcuda: device " + std::to_string(device) +
           ": no summary (its pools stayed locked at exit)\n";
  }
  if (out.empty()) out = "poolcuda: no device memory was pooled\n";
  return out;
}

}  // namespace

void run_exit_work() {
  if (!touched_cuda()) {
    // Note [Calls that never arrive].
    if (log_enabled(LogLevel::basic)) {
      const std::string cuda = loaded_cuda_library();
      if (!cuda.empty()) {
        log_format(LogLevel::basic,
                   "this process loaded %s but none of its CUDA calls reached the library, so "
                   "nothing was pooled: it may reach CUDA in a way the library cannot see (its "
                   "own dlsym, dlvsym, dlmopen) or make no allocation at all; see "
                   "docs/reports.md, \"Calls that never reach the library\"",
                   cuda.c_str());
      }
    }
    return;
  }
  const Config& conf = config();
  const bool with_summary = summary_requested();
  if (conf.report_at_exit || with_summary) {
    const Snapshots snapshots = take_snapshots_within(kExitBound);
    if (conf.report_at_exit)
      deliver(render_snapshots("exit", conf.report_format, snapshots), kExitBound);
    if (with_summary) write_stderr(summary(snapshots), kAskedForWait);
  }
  // After the exit's report: a signal's report the reporter thread was writing ends first, and
  // none starts (its temporary file outlived the process: 16 of 30 programs exiting amid a storm
  // of report signals left one). Not for long: a report stuck in a write must not hold the exit.
  close_deliveries(kExitBound);
}

}  // namespace poolcuda
