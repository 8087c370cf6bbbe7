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

// Note [Load order]
// The constructors of the program's own shared libraries run before those of a preloaded
// library, and any of them may already allocate device memory (a global buffer in a library).
// The first such call creates that device's manager for the rest of the process, so it must
// see the configuration the user gave, not the defaults. So the configuration is parsed once,
// on first use, by whichever comes first: a hook or the library's constructor. Parsing is pure
// string work (no CUDA call), and a malformed value still stops the process before main.
const Config& load_config() {
  static const Config* const conf = [] {
    const char* text = std::getenv("POOLCUDA_CONF");
    ParseResult parsed = parse_config(text != nullptr ? text : "");
    if (!parsed) {
      write_stderr("poolcuda: " + parsed.error.message() + "\n");
      ::_exit(2);
    }
    const auto* loaded = new Config(*parsed.config);  // never freed (Note [Exit])
    set_log_level(loaded->log);
    if (loaded->confirm) {
      write_stderr("poolcuda: effective configuration: " + describe_config(*loaded) + "\n");
    }
    return loaded;
  }();
  return *conf;
}

void on_fork_child() { detail::g_passthrough.store(true, std::memory_order_relaxed); }

void report_at_exit() {
  if (!passthrough()) write_report("exit");
}

// Runs when the library is loaded, before the program's main (DESIGN.md decision 9).
__attribute__((constructor)) void load_library() {
  const Config& conf = load_config();
  ::pthread_atfork(nullptr, nullptr, &on_fork_child);
  start_reporter(conf);
  if (conf.report_at_exit) std::atexit(&report_at_exit);
}

}  // namespace

const Config& config() { return load_config(); }

}  // namespace poolcuda
