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
// A parent that has made no CUDA call through the library (Note [Silent processes]) has no
// pools, no release thread and no lock of the pools a hook could hold, so its child is a fresh
// process for the library: pools come on its first allocation as anywhere else. This is the
// prefork server, or a process pool whose workers use the GPU while their parent never does.
// The prepare handler makes sure of it. It holds the notes mutex, under which a process is first
// marked touched, so no call of another thread can be half-way into the pools at the fork:
// every hook marks the process (guarded() in exports_common.h) before it takes any of their
// locks. Such a parent has no reporter thread either (it comes with the first CUDA call: Note
// [Silent processes]). The handler gives the pools up (the child passes through, as below) rather
// than wait where waiting could hang: when the forking thread itself holds the notes mutex (a
// signal handler that forks). What it took is recorded per thread, since forks of several threads
// may run their handlers at once. The child starts a reporter of its own at its first CUDA call;
// until then it is silent, even at exit; its uptime counts from the fork. Before all of this it
// waits for the driver's symbol map, which the first lookup of a driver function builds once under
// a lock (Note [Variants] in driver_variants.cpp): a child forked in the middle of that build would
// inherit the lock taken, and hang at its own first lookup, where the plain program's child gets an
// answer.
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
// Nor does such a process get the library's report signal handler and reporter thread: both come
// at the first CUDA call, as a process's CUDA threads do. A thread of the library's in a process
// that never used CUDA broke what a single-threaded program may do: privilege-dropping tools
// that set their capabilities back on their own thread between setresuid and setresgid (setpriv,
// the library preloaded through `poolcuda run -- setpriv ... ./app`) were aborted by the C
// library, whose set-ID call on every thread failed on ours; unshare(CLONE_NEWUSER) and a setns
// into a mount namespace failed; and the report signal, which ends a plain program, made a
// report instead.
//
// Depends on config/config.h, the C library's dlsym (dl_real.h), the driver map's fork handlers
// (driver_variants.h), the log, the reporter and the exit work; names no CUDA symbol.
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
#include "interpose/driver_variants.h"
#include "interpose/hook_guard.h"
#include "interpose/log.h"
#include "interpose/reporter.h"
#include "interpose/threads.h"

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
// Its allocations may be CUDA calls all the same: a program whose operator new serves objects
// from cudaMallocManaged (unified-memory codes do) gets the library's strings too, and the hook
// of that call asked for the configuration still being made (libstdc++ threw
// recursive_init_error, and the process ended before main). So the parse runs under the
// re-entry guard: what it allocates goes straight to the real runtime, as in the plain run.
const Config& load_config() {
  static const Config* const conf = [] {
    InsideHook parsing;
    const char* text = std::getenv("POOLCUDA_CONF");
    ParseResult parsed = parse_config(text != nullptr ? text : "");
    if (!parsed) {
      write_stderr("poolcuda: " + parsed.error.message() + "\n", kAskedForWait);
      ::_exit(2);
    }
    const auto* loaded = new Config(*parsed.config);  // never freed (Note [Exit])
    set_log_level(loaded->log);
    if (loaded->confirm) {
      write_stderr("poolcuda: effective configuration: " + describe_config(*loaded) + "\n",
                   kAskedForWait);
    }
    return loaded;
  }();
  return *conf;
}

// Note [Fork]: what the prepare handler took, for the other two handlers of the same fork (each
// fork runs its three on the thread that forks, and forks of several threads may overlap).
enum ForkHold : int { hold_nothing, hold_notes };
thread_local ForkHold t_fork_hold = hold_nothing;
thread_local bool t_fork_from_untouched = false;
// Set while this thread holds the notes mutex: a fork from a signal handler that interrupted
// it must not wait for that mutex (Note [Fork]).
thread_local bool t_holding_notes = false;
// A child forked from an untouched process, until its first CUDA call: the exit work leaves it
// silent (what it would say about calls that never arrived is its parent's to say).
bool g_fresh_child = false;
// The reporter starts at the process's first call (Note [Silent processes]), and at a fresh
// child's.
std::atomic<bool> g_reporter_due{false};

// The notes mutex, with t_holding_notes set from before the lock to after the unlock.
class HoldNotes {
 public:
  explicit HoldNotes(PendingNotes& pending) : mutex_(pending.mutex) {
    t_holding_notes = true;
    mutex_.lock();
  }
  ~HoldNotes() {
    mutex_.unlock();
    t_holding_notes = false;
  }
  HoldNotes(const HoldNotes&) = delete;
  HoldNotes& operator=(const HoldNotes&) = delete;

 private:
  std::mutex& mutex_;
};

void before_fork() {
  t_fork_hold = hold_nothing;
  t_fork_from_untouched = false;
  if (t_holding_notes) return;  // a signal handler forks inside a note: the child passes through
  // First: the map's build takes none of the holds below, so this wait never waits on them.
  driver::before_fork();
  pending_notes().mutex.lock();
  t_fork_hold = hold_notes;
  // Read under the mutex that a first call marks the process under.
  t_fork_from_untouched = !detail::g_touched.load(std::memory_order_acquire);
}

void release_fork_holds() {
  if (t_fork_hold != hold_nothing) pending_notes().mutex.unlock();
  t_fork_hold = hold_nothing;
  driver::after_fork();
}

void after_fork_in_parent() { release_fork_holds(); }

void after_fork_in_child() {
  // None of the parent's threads came along: a pthread_exit from the child's main thread must not
  // take them for the library's, alive, and end the child under its own threads.
  forget_library_threads_in_child();
  forget_exit_watch_in_child();
  if (t_fork_from_untouched) {
    // The parent's notes are the parent's to say.
    pending_notes().notes.clear();
    g_loaded_ns.store(monotonic_ns(), std::memory_order_relaxed);
    g_fresh_child = true;
    g_reporter_due.store(true, std::memory_order_relaxed);
  } else {
    detail::g_state.store(detail::forked_unannounced, std::memory_order_relaxed);
  }
  restore_report_signal_after_fork();
  release_fork_holds();
}

void exit_work() {
  if (detail::g_state.load(std::memory_order_acquire) != detail::active) return;
  if (g_fresh_child && !touched_cuda()) return;  // Note [Silent processes]
  run_exit_work();
}

// Runs when the library is loaded, before the program's main (DESIGN.md decision 9).
__attribute__((constructor)) void load_library() {
  g_loaded_ns.store(monotonic_ns(), std::memory_order_relaxed);
  note_standard_streams();  // Note [A standard error that is no longer one] in log.cpp
  if (decide_state() != detail::active) return;  // announced at the first call (passthrough)
  const Config& conf = load_config();  // a malformed one stops the process now (decision 9)
  ::pthread_atfork(&before_fork, &after_fork_in_parent, &after_fork_in_child);
  g_reporter_due.store(true, std::memory_order_relaxed);  // Note [Silent processes]
  // A constructor of the program's own libraries, which run before this one, may have made the
  // process's first CUDA call already: the reporter it did not start starts now.
  if (touched_cuda() && g_reporter_due.exchange(false, std::memory_order_relaxed))
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
  std::vector<std::pair<LogLevel, std::string>> notes;
  {
    HoldNotes hold(pending_notes());
    if (g_touched.exchange(true, std::memory_order_release)) return;
    notes.swap(pending_notes().notes);
  }
  // Written without the mutex: a write may block (a full pipe), and a fork waits for the mutex.
  for (const auto& [level, message] : notes) log_line(level, message);
  // Note [Fork]: outside the notes mutex, which the reporter's own notes take.
  if (g_reporter_due.exchange(false, std::memory_order_relaxed)) start_reporter(load_config());
}

}  // namespace detail

bool touched_cuda() { return detail::g_touched.load(std::memory_order_relaxed); }

void log_when_touched(LogLevel level, std::string message) {
  {
    HoldNotes hold(pending_notes());
    if (!touched_cuda()) {
      pending_notes().notes.emplace_back(level, std::move(message));
      return;
    }
  }
  log_line(level, message);  // without the mutex, as in first_cuda_call
}

double uptime_seconds() {
  return static_cast<double>(monotonic_ns() - g_loaded_ns.load(std::memory_order_relaxed)) / 1e9;
}

const Config& config() { return load_config(); }

}  // namespace poolcuda
