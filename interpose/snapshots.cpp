// Unbounded and bounded snapshots of the pools, and bounded work in general (see snapshots.h).
//
// Note [Bounded snapshots]
// A manager's lock is held only briefly by a running thread, but not by a thread that will
// never run again: a program may call exit() from a signal handler that interrupted one of its
// threads inside cudaMalloc, and exit handlers then run on that very thread, with the lock
// held below them. Waiting for that lock deadlocks the exit, where the plain program would have
// ended. The managers' locks have no timed form, so the snapshots are taken by a helper thread
// while the exiting thread waits on a condition variable with a deadline; whatever was not
// taken by then is reported as skipped. A helper still waiting then is left behind (the process
// is ending around it); what it shares with the caller is reference-counted, so neither ever
// touches freed memory.
//
// Depends on the registry, the library's threads and pools/report.h.
#include "interpose/snapshots.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "interpose/registry.h"
#include "interpose/threads.h"
#include "pools/no_cancel.h"

namespace poolcuda {

namespace {

struct Job {
  std::function<void()> work;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;  // guarded by mutex
};

void* run_job(void* argument) {
  std::shared_ptr<Job> job = std::move(*static_cast<std::shared_ptr<Job>*>(argument));
  delete static_cast<std::shared_ptr<Job>*>(argument);
  job->work();
  std::lock_guard<std::mutex> hold(job->mutex);
  job->done = true;
  job->finished.notify_all();
  return nullptr;
}

// Snapshots a helper fills in, one device at a time.
struct Results {
  std::mutex mutex;
  std::vector<std::optional<ManagerReport>> reports;  // guarded by mutex
};

}  // namespace

bool run_within(std::chrono::milliseconds bound, std::function<void()> work) {
  auto job = std::make_shared<Job>();
  job->work = std::move(work);
  auto* argument = new std::shared_ptr<Job>(job);
  if (!start_library_thread(&run_job, argument, nullptr)) {
    delete argument;
    return false;
  }
  NoCancel no_cancel;  // perhaps inside a call of the program's (Note [Cancellation])
  std::unique_lock<std::mutex> hold(job->mutex);
  return job->finished.wait_until(hold, std::chrono::steady_clock::now() + bound,
                                  [&] { return job->done; });
}

Snapshots take_snapshots() {
  Snapshots out;
  for (int device : Registry::instance().devices()) {
    out.reports.push_back(Registry::instance().report(device));
  }
  return out;
}

Snapshots take_snapshots_within(std::chrono::milliseconds bound) {
  const std::vector<int> devices = Registry::instance().devices();
  auto results = std::make_shared<Results>();
  results->reports.resize(devices.size());
  run_within(bound, [devices, results] {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      ManagerReport report = Registry::instance().report(devices[i]);
      std::lock_guard<std::mutex> hold(results->mutex);
      results->reports[i] = std::move(report);
    }
  });
  Snapshots out;
  out.bound = bound;
  std::lock_guard<std::mutex> hold(results->mutex);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (results->reports[i]) {
      out.reports.push_back(*results->reports[i]);
    } else {
      out.skipped.push_back(devices[i]);
    }
  }
  return out;
}

}  // namespace poolcuda
