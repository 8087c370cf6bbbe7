// Load, fork and exit (see lifecycle.h).
//
// Note [Exit]
// Nothing is freed when the process ends. Exit handlers and static destructors of the program
// and of other libraries may still call cudaFree after ours have run, and the device memory
// goes back to the driver with the process anyway. So the registry, the managers, the devices
// and the configuration are heap objects that are never deleted, and the exit report (if any)
// only reads them. The CUDA runtime may already be unloading when a late cudaFree arrives; a
// pooled pointer is then recognised and kept in the pool without any device call, and any other
// pointer gets whatever the real cudaFree answers.
//
// Note [Fork]
// A forked child inherits the pools exactly as the parent's threads left them, possibly with a
// manager's lock held by a thread that does not exist in the child, and (on a real GPU) a CUDA
// context it cannot use. So the child never touches them: the atfork child handler flips one
// flag, every hook then calls the real function, the report handler and the exit report do
// nothing. The parent is untouched.
//
// Depends on pools/config.h, the log and the reporter; names no CUDA symbol.
#include "interpose/lifecycle.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "interpose/log.h"
#include "interpose/reporter.h"

namespace poolcuda {

namespace detail {
std::atomic<bool> g_passthrough{false};
}

namespace {

std::atomic<const Config*> g_config{nullptr};

const Config& default_config() {
  static const auto* defaults = new Config;
  return *defaults;
}

void on_fork_child() { detail::g_passthrough.store(true, std::memory_order_relaxed); }

void report_at_exit() {
  if (!passthrough()) write_report("exit");
}

// Runs when the library is loaded, before the program's main (DESIGN.md decision 9).
__attribute__((constructor)) void load_library() {
  const char* text = std::getenv("POOLCUDA_CONF");
  ParseResult parsed = parse_config(text != nullptr ? text : "");
  if (!parsed) {
    write_stderr("poolcuda: " + parsed.error.message() + "\n");
    ::_exit(2);
  }
  const auto* conf = new Config(*parsed.config);
  g_config.store(conf, std::memory_order_release);
  set_log_level(conf->log);
  if (conf->confirm) {
    write_stderr("poolcuda: effective configuration: " + describe_config(*conf) + "\n");
  }
  ::pthread_atfork(nullptr, nullptr, &on_fork_child);
  start_reporter(*conf);
  if (conf->report_at_exit) std::atexit(&report_at_exit);
}

}  // namespace

const Config& config() {
  const Config* conf = g_config.load(std::memory_order_acquire);
  return conf != nullptr ? *conf : default_config();
}

}  // namespace poolcuda
