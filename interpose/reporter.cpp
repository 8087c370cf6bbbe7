// The report signal handler, the reporter thread and the readiness mark (see reporter.h).
//
// Note [Report signal]
// Rendering a report allocates, takes locks and writes files, none of which is allowed in a
// signal handler; worse, the signal may arrive on a thread that holds a manager's lock. So the
// handler only records the request (a flag for a plain signal, a slot for a channel request,
// Note [Report channel] in report_channel.cpp) and posts a semaphore in the library's memory:
// sem_post and atomics are async-signal-safe, and no file descriptor exists that the program
// could close or reuse. A burst of plain signals sets the flag many times and yields one report.
//
// The reporter thread is created with every signal blocked and unblocks the report signal alone,
// while it waits for work (Note [A handler of the program's]), so a signal sent to that thread (how
// `poolcuda report` asks) interrupts nothing of the program's. A signal sent to the process (kill
// -USR1) goes to any thread that does not block it, usually the main thread; the handler is
// installed with SA_RESTART, so the system calls the kernel restarts are restarted there, but those
// it never restarts (poll, select, epoll_wait, nanosleep and sleep, sigtimedwait, semop, and reads
// or writes on a socket with a timeout) fail with EINTR in that thread, exactly as for any handled
// signal (docs/reports.md).
//
// The readiness mark (channel_protocol.h) is a PROT_NONE mapping of an empty memfd, whose name
// /proc/PID/maps shows; its descriptor is closed at once. The library publishes it as it starts
// the reporter thread, which wakes at least once a second to check that the library's handler
// is still the signal's disposition: a program that installs its own handler later, or resets
// the signal, loses the mark within a second, and `poolcuda report` then refuses instead of
// triggering the program's own handler; the mark comes back if the handler does.
//
// Note [A signal the program waits for]
// A program that takes the report signal itself without a handler blocks it in every thread and
// waits for it (sigwait, sigtimedwait, a signalfd): a daemon reopening its logs. The reporter
// thread is then the only thread that accepts the signal, so the kernel hands it every `kill`,
// sigqueue and timer expiry, and without care the program would never see one (at first only a
// `kill` was passed on: a sigqueue's or a timer's signals all became reports). The kernel picks
// the thread for a signal sent to the process (anything but a tgkill's, SI_TKILL, and a channel
// request, which a queued signal's value tells apart) by trying the main thread first, so such a
// signal that reaches the handler on the reporter thread tells that the main thread most likely
// blocks it (not surely: the kernel also passes over a main thread that is not running and
// already has a signal pending, which a storm of signals makes common). The handler then passes
// it on: it adds the signal to the mask the reporter thread gets back when the handler returns,
// and sends it to the process again, where it stays pending until the program takes it, as
// without the library. From then on the reporter thread blocks the signal, so
// reports come only from a signal that reaches a thread of the program's that accepts it (a
// main thread that unblocks it again), or at exit; the readiness mark is withdrawn, since a
// request to the reporter thread alone would wait in vain, and the library says so once. No
// descriptor is opened (reading the main thread's mask from /proc would need one that the
// program may close under us). The signal is sent again as it came (rt_sigqueueinfo: its code,
// value and sender), except a `kill`'s: the kernel lets only the thread whose ID is the
// process's send itself that code, so it goes again by kill, with the process's own ID as its
// sender. When the signal then reaches the handler on a thread of the program's after all (the
// guess was wrong, or the program unblocked it), the reporter thread accepts it again and the
// mark comes back: a storm of signals never turns reports off for good.
//
// Note [A handler of the program's]
// A program that replaces the library's handler may also block the signal in its main thread
// and wait for it in another (pause, sigsuspend): plain, the kernel gives a signal sent to the
// process to that thread. The reporter thread accepted the signal too, and got it: the program's
// handler ran there, the waiting thread slept on, and the program hung. So the reporter thread
// accepts the signal only while it waits for work, and only while the handler is the library's
// (as it last looked, at least once a second) and the signal is not being passed on (Note [A
// signal the program waits for]); while it works, a signal goes to the program's threads or waits
// for its wait. One that reaches it after the program replaced the handler, before it looked,
// runs the program's handler there and interrupts the wait; the reporter thread then blocks the
// signal and sends it to the process again, so that a thread of the program's gets it as well:
// the program's handler runs twice for that one signal, once at most per replacement, where it
// would otherwise never reach the thread that waits for it. Not when that handler reset the
// signal to its default action (SA_RESETHAND): the signal sent again would end the process.
//
// Depends on the report channel, the report writer, the library's threads, the log and the
// configuration.
#include "interpose/reporter.h"

#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>

#include "interpose/channel_protocol.h"
#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/report_channel.h"
#include "interpose/report_writer.h"
#include "interpose/threads.h"
#include "pools/no_cancel.h"

namespace poolcuda {

namespace {

constexpr std::size_t kMarkBytes = 4096;

int g_signal = 0;
const char* g_signal_name = "";
struct sigaction g_previous;  // the disposition before ours, for a forked child
bool g_installed = false;
constinit RequestSlots g_slots;
std::atomic<bool> g_plain_request{false};
sem_t g_wake;
void* g_mark = nullptr;  // touched by the reporter thread, or by a forked child alone
pthread_t g_reporter_thread{};
std::atomic<bool> g_reporter_known{false};
std::atomic<bool> g_passed_on{false};  // Note [A signal the program waits for]
// A program thread took the signal while it was passed on: the reporter accepts it again.
std::atomic<bool> g_accepted_again{false};

// Whether a signal that reached the reporter thread was sent to the process (and so may be the
// program's own), not to that thread (a report request): anything but a channel request (a
// queued signal whose value is a channel word) or a signal aimed at one thread (tgkill).
bool sent_to_process(const siginfo_t& info) {
  if (info.si_code == SI_TKILL) return false;
  if (info.si_code != SI_QUEUE) return true;
  return !channel::decode(
      static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(info.si_value.sival_ptr)));
}

extern "C" void on_report_signal(int signal, siginfo_t* info, void* context) {
  const int saved = errno;
  const bool on_reporter = g_reporter_known.load(std::memory_order_acquire) &&
                           ::pthread_equal(::pthread_self(), g_reporter_thread);
  if (on_reporter && info != nullptr && context != nullptr && sent_to_process(*info)) {
    // Note [A signal the program waits for]: sent again as it came (its sender, code and value).
    ::sigaddset(&static_cast<ucontext_t*>(context)->uc_sigmask, signal);
    siginfo_t again = *info;
    if (::syscall(SYS_rt_sigqueueinfo, ::getpid(), signal, &again) != 0) ::kill(::getpid(), signal);
    if (!g_passed_on.exchange(true)) ::sem_post(&g_wake);
    errno = saved;
    return;
  }
  // Only a thread of the program's taking it proves the program does not wait for it.
  if (!on_reporter && g_passed_on.load(std::memory_order_relaxed) &&
      !g_accepted_again.exchange(true))
    ::sem_post(&g_wake);  // Note [A signal the program waits for]
  bool channel_request = false;
  if (info != nullptr && info->si_code == SI_QUEUE) {
    const auto word =
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(info->si_value.sival_ptr));
    if (channel::decode(word)) {
      channel_request = true;
      if (g_slots.push(ChannelRequest{info->si_pid, word})) ::sem_post(&g_wake);
    }
  }
  if (!channel_request && !g_plain_request.exchange(true)) ::sem_post(&g_wake);
  errno = saved;
}

// Whether a disposition is anything but the default action: a handler, or ignored.
bool has_handler(const struct sigaction& disposition) {
  return (disposition.sa_flags & SA_SIGINFO) != 0 ? disposition.sa_sigaction != nullptr
                                                  : disposition.sa_handler != SIG_DFL;
}

bool handler_is_ours() {
  struct sigaction current {};
  if (::sigaction(g_signal, nullptr, &current) != 0) return false;
  return (current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == &on_report_signal;
}

void publish_mark() {
  const std::string name = std::string(channel::kReadyMark) + std::to_string(g_signal);
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return;
  void* mark = ::mmap(nullptr, kMarkBytes, PROT_NONE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mark != MAP_FAILED) g_mark = mark;
}

// Whether the reporter thread accepts the signal (called on that thread only).
void accept_signal(bool accept) {
  sigset_t only;
  ::sigemptyset(&only);
  ::sigaddset(&only, g_signal);
  ::pthread_sigmask(accept ? SIG_UNBLOCK : SIG_BLOCK, &only, nullptr);
}

// Whether the signal's handler is a function of the program's (not the default action, which
// for SIGUSR1 ends the process, nor ignored).
bool handler_is_programs() {
  struct sigaction current {};
  if (::sigaction(g_signal, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) != 0)
    return current.sa_sigaction != nullptr && current.sa_sigaction != &on_report_signal;
  return current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN;
}

// Note [Report signal]: the mark follows the signal's disposition.
void check_handler() {
  static bool told = false;
  static bool told_passed_on = false;
  static bool told_accepted = false;
  if (g_accepted_again.exchange(false) && g_passed_on.load()) {
    // Note [A signal the program waits for]: a thread of the program's took it after all. The
    // reporter thread accepts the signal again from its next wait (reporter_main); a signal
    // pending then reaches it there, and its handler must see that it is not passed on, so that
    // it passes it on and says so.
    g_passed_on.store(false);
    if (!told_accepted) {
      told_accepted = true;
      log_when_touched(LogLevel::basic,
                       std::string("a thread of the program took ") + g_signal_name +
                           " after all: report requests are served again");
    }
  }
  if (g_passed_on.load()) {
    if (g_mark == nullptr) return;
    ::munmap(g_mark, kMarkBytes);
    g_mark = nullptr;
    if (!told_passed_on) {
      told_passed_on = true;
      log_when_touched(LogLevel::basic,
                       std::string("every thread of the program seems to block ") +
                           g_signal_name +
                           ": the program takes it itself, so the library passes it on and "
                           "refuses report requests until a thread of the program takes one "
                           "(report_signal:USR2 keeps them)");
    }
    return;
  }
  const bool ours = handler_is_ours();
  if (ours && g_mark == nullptr) {
    publish_mark();
  } else if (!ours && g_mark != nullptr) {
    ::munmap(g_mark, kMarkBytes);
    g_mark = nullptr;
    if (!told) {
      told = true;
      struct sigaction current {};
      const bool reset = ::sigaction(g_signal, nullptr, &current) == 0 &&
                         (current.sa_flags & SA_SIGINFO) == 0 &&
                         (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN);
      const std::string how = !reset ? "replaced the library's " + std::string(g_signal_name) +
                                           " handler"
                              : current.sa_handler == SIG_IGN
                                  ? "set " + std::string(g_signal_name) + " to be ignored"
                                  : "set " + std::string(g_signal_name) + " back to the default";
      log_when_touched(LogLevel::basic,
                       "the program " + how +
                           ": report requests are refused from now on "
                           "(report_at_exit:1 still writes a report at exit)");
    }
  }
}

void* reporter_main(void*) {
  ::pthread_setname_np(::pthread_self(), std::string(channel::kThreadName).c_str());
  sigset_t only;
  ::sigemptyset(&only);
  ::sigaddset(&only, g_signal);
  g_reporter_thread = ::pthread_self();
  g_reporter_known.store(true, std::memory_order_release);
  for (;;) {
    // Blocked while it works: the signal is accepted only during the wait below (Note [A handler
    // of the program's]).
    accept_signal(false);
    check_handler();
    if (g_plain_request.exchange(false)) write_report("signal");
    ChannelRequest request;
    while (g_slots.pop(&request)) serve_request(request);
    const bool passed_on = g_passed_on.load();
    const bool accepting = !passed_on && handler_is_ours();
    if (accepting) accept_signal(true);
    timespec deadline{};
    ::clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += 1;
    // Woken by a post, a timeout or the handler interrupting the wait: look again either way.
    if (::sem_clockwait(&g_wake, CLOCK_MONOTONIC, &deadline) != 0 && errno == EINTR &&
        accepting && g_passed_on.load() == passed_on && handler_is_programs()) {
      // Note [A handler of the program's]: it ran here; the program's threads get it again.
      accept_signal(false);
      ::kill(::getpid(), g_signal);
    }
  }
}

}  // namespace

void start_reporter(const Config& conf) {
  if (conf.report_signal == ReportSignal::none) return;
  // Inside the program's first CUDA call: a cancellation pending for the thread must not take
  // effect at the close below and leave the handler without its thread (Note [Cancellation]).
  NoCancel no_cancel;
  g_signal = conf.report_signal == ReportSignal::usr1 ? SIGUSR1 : SIGUSR2;
  g_signal_name = g_signal == SIGUSR1 ? "SIGUSR1" : "SIGUSR2";

  struct sigaction previous {};
  if (::sigaction(g_signal, nullptr, &previous) != 0) return;
  if ((previous.sa_flags & SA_SIGINFO) == 0 && previous.sa_handler == SIG_IGN) {
    log_when_touched(LogLevel::basic, std::string(g_signal_name) +
                                          " is ignored; leaving it alone (reports only with "
                                          "report_at_exit:1)");
    return;
  }
  if (has_handler(previous)) {
    log_when_touched(LogLevel::basic, std::string(g_signal_name) +
                                          " already has a handler; leaving it alone (reports "
                                          "only with report_at_exit:1)");
    return;
  }
  if (::sem_init(&g_wake, 0, 0) != 0) return;

  g_previous = previous;
  struct sigaction action {};
  action.sa_sigaction = &on_report_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  // Installed and read back in one call: a handler another thread of the program's installed
  // since the look above would otherwise be overwritten for good, with nothing said (2 of 1,000
  // programs installing theirs during the first CUDA call lost it). It goes back at once.
  struct sigaction displaced {};
  if (::sigaction(g_signal, &action, &displaced) != 0) return;
  g_previous = displaced;  // what a forked child, or a failed start, puts back
  if (has_handler(displaced)) {
    ::sigaction(g_signal, &displaced, nullptr);
    log_when_touched(LogLevel::basic, std::string(g_signal_name) +
                                          " got a handler of the program's meanwhile; leaving "
                                          "it alone (reports only with report_at_exit:1)");
    return;
  }
  g_installed = true;

  // The mark is published here, inside the program's first CUDA call (Note [Silent processes]
  // in lifecycle.cpp), not by the reporter thread: a program that closes every descriptor it
  // did not open and reuses the numbers (closefrom, then a pipe) could otherwise lose its new
  // descriptor to the close of the memfd, when the thread's memfd_create landed before the
  // program's close and the library's close after its reuse. Inside the call, the memfd lives
  // and goes as a descriptor the runtime opens and closes there would.
  publish_mark();
  // Note [Report signal]: the thread starts with every signal blocked.
  cpu_set_t cpus;  // Note [Library threads' CPUs] in threads.cpp
  const bool cpus_read = program_cpus(&cpus);
  if (!start_library_thread(&reporter_main, nullptr, nullptr, cpus_read ? &cpus : nullptr)) {
    if (g_mark != nullptr) ::munmap(g_mark, kMarkBytes);
    g_mark = nullptr;
    ::sigaction(g_signal, &g_previous, nullptr);
    g_installed = false;
    log_when_touched(LogLevel::basic, std::string("cannot start the reporter thread; ") +
                                          g_signal_name + " reports disabled");
  }
}

void restore_report_signal_after_fork() {
  // Not conditioned on g_installed: a fork between start_reporter()'s sigaction and its setting
  // of that flag must still restore (g_previous is set before the handler is installed).
  if (g_signal != 0 && handler_is_ours()) ::sigaction(g_signal, &g_previous, nullptr);
  g_installed = false;
  if (g_mark != nullptr) ::munmap(g_mark, kMarkBytes);
  g_mark = nullptr;
  // Requests the parent's reporter had not served yet were the parent's; a child that starts
  // its own reporter must not answer them.
  g_plain_request.store(false);
  g_reporter_known.store(false);  // a new thread of the child may reuse the old one's identity
  g_passed_on.store(false);
  g_accepted_again.store(false);
  ChannelRequest stale;
  while (g_slots.pop(&stale)) {
  }
}

}  // namespace poolcuda
