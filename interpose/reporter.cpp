// The report signal handler and the reporter thread (see reporter.h).
//
// Note [Report signal]
// Rendering a report allocates, takes locks and writes files, none of which is allowed in a
// signal handler; worse, the signal may arrive on a thread that holds a manager's lock. So the
// handler writes one byte to a non-blocking pipe (async-signal-safe, errno preserved) and
// returns. A burst of signals fills the pipe at worst; the extra bytes are dropped and the
// reporter, which drains everything it can read at once, writes one report per wake-up. The
// thread is created with every signal blocked, so the report signal can never interrupt it
// mid-report, and it never exits: the process ends around it. A report written to a file goes
// to a temporary name first and is renamed into place, so a reader never sees half a report.
//
// Depends on the registry, pools/report.h, the log and the configuration.
#include "interpose/reporter.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/registry.h"
#include "pools/report.h"

namespace poolcuda {

namespace {

int g_pipe[2] = {-1, -1};
std::atomic<std::uint64_t> g_sequence{0};

std::mutex& report_mutex() {
  static auto* mutex = new std::mutex;  // never destroyed: reports may run during exit
  return *mutex;
}

extern "C" void on_report_signal(int) {
  if (passthrough()) return;
  int saved = errno;
  char byte = 1;
  ssize_t ignored = ::write(g_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

void* reporter_main(void*) {
  char buffer[256];
  for (;;) {
    ssize_t n = ::read(g_pipe[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return nullptr;
    if (!passthrough()) write_report("signal");
  }
}

bool write_file(const std::string& path, const std::string& text) {
  std::string temporary = path + ".tmp" + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::string_view rest = text;
  while (!rest.empty()) {
    ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  bool ok = rest.empty() && ::close(fd) == 0;
  if (!ok || ::rename(temporary.c_str(), path.c_str()) != 0) {
    ::unlink(temporary.c_str());
    return false;
  }
  return true;
}

}  // namespace

void write_report(std::string_view reason) {
  const Config& conf = config();
  std::lock_guard<std::mutex> hold(report_mutex());
  ReportHeader header;
  header.pid = static_cast<long>(::getpid());
  header.sequence = g_sequence.fetch_add(1, std::memory_order_relaxed) + 1;
  header.reason = std::string(reason);
  // Snapshots are taken under each manager's lock, one at a time; rendering is outside them.
  std::string text = render(Registry::instance().document(header), conf.report_format);
  if (!text.empty() && text.back() != '\n') text += '\n';
  if (conf.report_path == "stderr") {
    write_stderr(text);
    return;
  }
  std::string path = expand_report_path(conf.report_path, header.pid, header.sequence);
  if (write_file(path, text)) {
    log_format(LogLevel::basic, "report %llu written to %s",
               static_cast<unsigned long long>(header.sequence), path.c_str());
  } else {
    log_format(LogLevel::basic, "cannot write report %llu to %s: %s",
               static_cast<unsigned long long>(header.sequence), path.c_str(),
               std::strerror(errno));
  }
}

void start_reporter(const Config& conf) {
  if (conf.report_signal == ReportSignal::none) return;
  const int signo = conf.report_signal == ReportSignal::usr1 ? SIGUSR1 : SIGUSR2;
  const char* name = signo == SIGUSR1 ? "SIGUSR1" : "SIGUSR2";

  struct sigaction previous = {};
  if (::sigaction(signo, nullptr, &previous) != 0) return;
  bool handled = (previous.sa_flags & SA_SIGINFO) != 0 ? previous.sa_sigaction != nullptr
                                                        : previous.sa_handler != SIG_DFL;
  if (handled) {
    log_format(LogLevel::basic,
               "%s already has a handler; leaving it alone (reports only with report_at_exit:1)",
               name);
    return;
  }

  if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;
  ::fcntl(g_pipe[1], F_SETFL, ::fcntl(g_pipe[1], F_GETFL) | O_NONBLOCK);

  // Note [Report signal]: the thread inherits a mask with every signal blocked.
  sigset_t all;
  sigset_t saved;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_attr_t attributes;
  ::pthread_attr_init(&attributes);
  ::pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int created = ::pthread_create(&thread, &attributes, &reporter_main, nullptr);
  ::pthread_attr_destroy(&attributes);
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (created != 0) {
    log_format(LogLevel::basic, "cannot start the reporter thread; %s reports disabled", name);
    return;
  }
  ::pthread_setname_np(thread, "poolcuda-report");

  struct sigaction action = {};
  action.sa_handler = &on_report_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(signo, &action, nullptr);
}

}  // namespace poolcuda
