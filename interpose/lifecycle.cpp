// Load, fork and exit (see lifecycle.h).
//
// Note [Exit]
// Nothing is freed when the process ends. Exit handlers and static destructors of the program
// and of other libraries may still call cudaFree after ours have run, and the device memory
// goes back to the driver with the process anyway. So the registry, the managers, the devices
// and the configuration are heap objects that are never deleted, and the exit report (if any)
// only reads them. The CUDA runtime may already be unloading when a late cudaFree arrives; a
// pooled pointer is then recognised and kept in the pool without any device call, and any other
// pointer gets whatever the real cudaFree answers. What runs at exit is in at_exit.cpp.
//
// Note [Fork]
// What a child made by fork() may do with the pools depends on its parent's past.
//
// A parent that has made no CUDA call through the library (the prepare handler finds the
// process untouched: Note [Silent processes]) has no pools, no release thread and no library
// lock a hook could hold, so its child is a fresh process for the library: pools come on its
// first allocation as anywhere else. This is the prefork server, or a process pool whose
// workers use the GPU while their parent never does. Three things make that airtight. The
// prepare handler holds the notes mutex, under which a process is first marked touched, so no
// call of another thread can be half-way into the library at the fork: every hook marks the
// process (guarded() in exports_common.h) before it takes any lock of the library's. It also
// holds the reporter thread between two pieces of work, so no report is half-written. And the
// child, which has no reporter thread, gets back the report signal's disposition the program
// had, loses the readiness mark, and starts a reporter of its own at its first CUDA call (a
// child that never makes one never hears from the library); its uptime counts from the fork.
//
// A parent that has touched CUDA leaves its child pools exactly as its threads left them,
// possibly with a lock held by a thread that does not exist in the child, and (on a real GPU) a
// CUDA context it cannot use. So that child never touches them: its state becomes `forked`,
// every hook calls the real function, the exit work does nothing, and the first CUDA call says
// so once. It gets back the report signal's disposition and loses the mark, as above. The
// parent is untouched either way.
//
// Note [Active copy]
// Two copies of the library at different paths can be loaded into one process (a preload
// inherited from a parent plus another one, a framework that dlopens its own). The program's
// calls bind to the copy first in the global scope, whose real functions, found with
// RTLD_NEXT, are then the second copy's: two layers of pools would stack. So each copy asks the
// dynamic linker which definition of the marker symbol comes first in the global scope: if it
// is another copy's, this copy passes every call through, starts no reporter and writes no
// report, and says so once, at the first CUDA call it sees. The answer is decided once, by the
// constructor or by an earlier hook (Note [Load order]).
//
// Note [Silent processes]
// A preloaded library is inherited by every child of the program: shells, compilers, helper
// tools. A process that never makes a CUDA call through the library must not hear from it: no
// exit report, no run summary, no note about signal handlers or a second copy. So hooks mark
// the process as touched on their first call (one relaxed load afterwards), notes about the
// library's own state wait for that mark (log_when_touched), and the exit work looks at it.
// Errors the user must see at once (a malformed configuration, confirm:1) are exempt.
//
// Depends on config/config.h, the C library's dlsym (dl_real.h), the log, the reporter and the
// exit work; names no CUDA symbol.
#include "interpose/lifecycle.h"

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "interpose/at_exit.h"
#include "interpose/dl_real.h"
#include "interpose/log.h"
#include "interpose/reporter.h"

// Note [Active copy]: exported (exports.map); the first definition in the global scope
// identifies the active copy.
extern "C" __attribute__((visibility("default"))) const char poolcuda_library_marker[];
extern "C" const char poolcuda_library_marker[] = "libpoolcuda.so";

namespace poolcuda {

namespace detail {
std::atomic<int> g_state{undecided};
std::atomic<bool> g_touched{false};
}  // namespace detail

namespace {

std::atomic<std::int64_t> g_loaded_ns{0};

std::int64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

struct PendingNotes {
  std::mutex mutex;
  std::vector<std::pair<LogLevel, std::string>> notes;
};

PendingNotes& pending_notes() {
  static auto* notes = new PendingNotes;  // never destroyed (Note [Exit])
  return *notes;
}

// The object `address` lies in (dladdr's base address and file name).
Dl_info object_of(const void* address) {
  Dl_info info{};
  if (::dladdr(address, &info) == 0 || info.dli_fname == nullptr) info.dli_fname = "?";
  return info;
}

// This copy's object. Its own marker's address cannot tell: a reference to an exported symbol
// resolves to the first definition in the process, another copy's (symbol interposition).
Dl_info own_object() { return object_of(reinterpret_cast<const void*>(&object_of)); }

// Note [Active copy]. Returns the state, deciding it on first use.
int decide_state() {
  int state = detail::g_state.load(std::memory_order_acquire);
  if (state != detail::undecided) return state;
  const void* first = dl::real_dlsym(RTLD_DEFAULT, "poolcuda_library_marker");
  const int decided = first == nullptr || object_of(first).dli_fbase == own_object().dli_fbase
                          ? detail::active
                          : detail::duplicate_unannounced;
  detail::g_state.compare_exchange_strong(state, decided, std::memory_order_acq_rel);
  return detail::g_state.load(std::memory_order_acquire);
}

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

// Note [Fork]. Set by the prepare handler, read by the other two, all on the forking thread.
bool g_fork_from_untouched = false;
std::atomic<bool> g_reporter_due{false};  // a fresh child starts its reporter at its first call

void before_fork() {
  // The reporter before the notes mutex: its thread takes them in that order.
  const bool untouched = !detail::g_touched.load(std::memory_order_acquire);
  if (untouched) hold_reporter_at_rest();
  pending_notes().mutex.lock();
  g_fork_from_untouched = untouched;
  if (untouched && detail::g_touched.load(std::memory_order_acquire)) {
    g_fork_from_untouched = false;  // a first call finished before the lock: keep it safe
  }
  if (untouched != g_fork_from_untouched) release_reporter();
}

void after_fork_in_parent() {
  pending_notes().mutex.unlock();
  if (g_fork_from_untouched) release_reporter();
}

void after_fork_in_child() {
  PendingNotes& pending = pending_notes();
  if (g_fork_from_untouched) {
    pending.notes.clear();  // the parent's notes are about its reporter; the child's says its own
    g_loaded_ns.store(monotonic_ns(), std::memory_order_relaxed);
    g_reporter_due.store(true, std::memory_order_relaxed);
  } else {
    detail::g_state.store(detail::forked_unannounced, std::memory_order_relaxed);
  }
  pending.mutex.unlock();
  restore_report_signal_after_fork();
  if (g_fork_from_untouched) release_reporter();
}

void exit_work() {
  if (detail::g_state.load(std::memory_order_acquire) == detail::active) run_exit_work();
}

// Runs when the library is loaded, before the program's main (DESIGN.md decision 9).
__attribute__((constructor)) void load_library() {
  g_loaded_ns.store(monotonic_ns(), std::memory_order_relaxed);
  if (decide_state() != detail::active) return;  // announced at the first call (passthrough)
  const Config& conf = load_config();
  ::pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);
  start_reporter(conf);
  std::atexit(&exit_work);
}

}  // namespace

namespace detail {

bool passthrough_slow(int state) {
  if (state == undecided) state = decide_state();
  if (state == duplicate_unannounced &&
      g_state.compare_exchange_strong(state, duplicate, std::memory_order_acq_rel)) {
    const void* first = dl::real_dlsym(RTLD_DEFAULT, "poolcuda_library_marker");
    log_format(LogLevel::basic,
               "%s is loaded before this copy (%s): this copy passes every call through",
               object_of(first).dli_fname, own_object().dli_fname);
    state = duplicate;
  }
  if (state == forked_unannounced &&
      g_state.compare_exchange_strong(state, forked, std::memory_order_acq_rel)) {
    log_line(LogLevel::basic,
             "this process was forked after its parent used CUDA through the library: its "
             "calls pass through unpooled (a child forked before any CUDA call keeps the pools)");
    state = forked;
  }
  return state != active;
}

void first_cuda_call() {
  {
    PendingNotes& pending = pending_notes();
    std::lock_guard<std::mutex> hold(pending.mutex);
    if (g_touched.exchange(true, std::memory_order_release)) return;
    for (const auto& [level, message] : pending.notes) log_line(level, message);
    pending.notes.clear();
  }
  // Note [Fork]: outside the notes mutex, which the reporter's own notes take.
  if (g_reporter_due.exchange(false, std::memory_order_relaxed)) start_reporter(load_config());
}

}  // namespace detail

bool touched_cuda() { return detail::g_touched.load(std::memory_order_relaxed); }

void log_when_touched(LogLevel level, std::string message) {
  PendingNotes& pending = pending_notes();
  std::lock_guard<std::mutex> hold(pending.mutex);
  if (touched_cuda()) {
    log_line(level, message);
  } else {
    pending.notes.emplace_back(level, std::move(message));
  }
}

double uptime_seconds() {
  return static_cast<double>(monotonic_ns() - g_loaded_ns.load(std::memory_order_relaxed)) / 1e9;
}

const Config& config() { return load_config(); }

}  // namespace poolcuda
