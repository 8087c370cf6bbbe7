// Inspecting a process through /proc before asking it anything (see target.h). The library
// reads POOLCUDA_CONF once, when it loads, from the environment the process started with;
// /proc/PID/environ holds exactly that environment. The readiness mark in /proc/PID/maps says
// the library's handler is installed and its reporter thread listens; the signal masks in
// /proc/PID/status say what the program does with the signal otherwise.
//
// Depends on config/config.h, interpose/channel_protocol.h and check_library (cli.h).
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "config/config.h"
#include "target.h"

namespace poolcuda::cli {

namespace {

// Reads a whole /proc file; nothing (with errno kept) when it cannot be opened or read. A read
// fails with ESRCH when the process exits after the open. Plain read(2), not a stream: a
// filebuf throws on a read error, and that would escape as an abort.
std::optional<std::string> read_proc_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) != 0) {
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
    } else if (errno != EINTR) {
      break;
    }
  }
  const int error = errno;
  ::close(fd);
  if (n < 0) {
    errno = error;
    return std::nullopt;
  }
  return text;
}

// Calls `line_fn` for each line of `text` separated by `separator`.
template <typename Fn>
void for_each_line(std::string_view text, char separator, Fn line_fn) {
  while (!text.empty()) {
    const auto end = text.find(separator);
    line_fn(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

std::string describe_errno(int error) {
  if (error == EACCES || error == EPERM) {
    return std::string(std::strerror(error)) + "; run as the process's user or as root";
  }
  return std::strerror(error);
}

// What to say when a /proc file of a process that did exist cannot be read: ENOENT or ESRCH
// mean it exited meanwhile, which `ask` reports in the same words.
std::string cannot_read(long pid, const std::string& what, int error) {
  if (error == ENOENT || error == ESRCH)
    return "process " + std::to_string(pid) + " exited before it answered";
  return what + ": " + describe_errno(error);
}

// The mapped file of one /proc/PID/maps line (everything after the fifth field).
std::string_view mapped_name(std::string_view line) {
  const auto slash = line.find('/');
  return slash == std::string_view::npos ? std::string_view() : line.substr(slash);
}

// Fills library_mapped from the names of the mapped files and ready_signal from the readiness
// mark; returns the other mapped shared objects.
std::vector<std::string> read_maps(std::string_view maps, Target* target) {
  std::vector<std::string> other_objects;
  for_each_line(maps, '\n', [&](std::string_view line) {
    const std::string_view name = mapped_name(line);
    const std::string_view base = name.substr(name.rfind('/') + 1);
    if (base.starts_with("libpoolcuda.so")) target->library_mapped = true;
    if (!name.empty() && (base.ends_with(".so") || base.find(".so.") != std::string_view::npos) &&
        std::find(other_objects.begin(), other_objects.end(), name) == other_objects.end())
      other_objects.emplace_back(name);
    // "/memfd:poolcuda-ready.10 (deleted)"
    const std::string prefix = "memfd:" + std::string(channel::kReadyMark);
    if (base.starts_with(prefix)) {
      const std::string_view number = base.substr(prefix.size());
      int signal_number = 0;
      std::from_chars(number.data(), number.data() + number.size(), signal_number);
      if (signal_number > 0 && signal_number < 65) target->ready_signal = signal_number;
    }
  });
  return other_objects;
}

// A copy of the library under another name (a deployment's own) is the library too, told by its
// marker symbol. Only what the process preloads is read (a framework maps hundreds of shared
// objects), each through the process's own root (it may live in another mount namespace).
bool preloads_renamed_copy(const std::string& proc, std::string_view preload,
                           const std::vector<std::string>& objects) {
  bool found = false;
  for_each_line(preload, ' ', [&](std::string_view entries) {
    for_each_line(entries, ':', [&](std::string_view entry) {
      if (found || entry.empty()) return;
      const std::string_view entry_base = entry.substr(entry.rfind('/') + 1);
      for (const std::string& object : objects) {
        const std::string_view base = std::string_view(object).substr(object.rfind('/') + 1);
        const bool named = entry.find('/') != std::string_view::npos ? object == entry
                                                                     : base == entry_base;
        if (named && check_library(proc + "/root" + object).empty()) {
          found = true;
          return;
        }
      }
    });
  });
  return found;
}

// The numbers after the label of a /proc/PID/status line, such as "Uid:\t0\t0\t0\t0".
std::vector<long> status_numbers(std::string_view line) {
  std::vector<long> numbers;
  line.remove_prefix(line.find(':') + 1);
  for (;;) {
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    long value = 0;
    const auto [end, error] = std::from_chars(line.data(), line.data() + line.size(), value);
    if (error != std::errc()) return numbers;
    numbers.push_back(value);
    line.remove_prefix(static_cast<std::size_t>(end - line.data()));
  }
}

void read_status(std::string_view status, Target* target) {
  for_each_line(status, '\n', [target](std::string_view line) {
    if (line.starts_with("Uid:")) {
      const std::vector<long> uids = status_numbers(line);  // real, effective, saved, fs
      if (uids.size() == 4) {
        target->effective_uid = uids[1];
        target->fs_uid = uids[3];
      }
      return;
    }
    if (line.starts_with("NSpid:")) {
      const std::vector<long> pids = status_numbers(line);
      target->pid_namespaces = static_cast<int>(pids.size());
      if (!pids.empty()) target->pid_inside = pids.back();
      return;
    }
    std::uint64_t* mask = line.starts_with("SigCgt:")   ? &target->caught
                          : line.starts_with("SigIgn:") ? &target->ignored
                                                        : nullptr;
    if (mask == nullptr) return;
    line.remove_prefix(7);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    std::from_chars(line.data(), line.data() + line.size(), *mask, 16);
  });
}

long find_reporter_thread(const std::string& proc) {
  DIR* tasks = ::opendir((proc + "/task").c_str());
  if (tasks == nullptr) return 0;
  long found = 0;
  while (dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    const auto comm = read_proc_file(proc + "/task/" + entry->d_name + "/comm");
    if (comm && std::string_view(*comm).substr(0, comm->find('\n')) == channel::kThreadName) {
      found = std::strtol(entry->d_name, nullptr, 10);
      break;
    }
  }
  ::closedir(tasks);
  return found;
}

std::string signal_name(int signal_number) {
  if (signal_number == SIGUSR1) return "SIGUSR1";
  if (signal_number == SIGUSR2) return "SIGUSR2";
  return "signal " + std::to_string(signal_number);
}

bool has(std::uint64_t mask, int signal_number) {
  return (mask >> (signal_number - 1) & 1) != 0;
}

}  // namespace

std::optional<Target> inspect(long pid, std::string* error) {
  const std::string proc = "/proc/" + std::to_string(pid);
  Target target;
  target.pid = pid;
  const auto status = read_proc_file(proc + "/status");
  if (!status) {
    // ENOENT at the open: there is no such process; ESRCH at the read: it just exited.
    *error = errno == ENOENT ? "no process with PID " + std::to_string(pid)
                             : cannot_read(pid, "cannot read " + proc + "/status", errno);
    return std::nullopt;
  }
  read_status(*status, &target);
  const auto maps = read_proc_file(proc + "/maps");
  const auto environ_block = maps ? read_proc_file(proc + "/environ") : std::nullopt;
  if (!maps || !environ_block) {
    *error = cannot_read(pid, "cannot inspect process " + std::to_string(pid), errno);
    return std::nullopt;
  }
  const std::vector<std::string> objects = read_maps(*maps, &target);
  std::string_view preload;
  for_each_line(*environ_block, '\0', [&](std::string_view entry) {
    if (entry.starts_with("POOLCUDA_CONF=")) target.conf = std::string(entry.substr(14));
    if (entry.starts_with("LD_PRELOAD=")) preload = entry.substr(11);
  });
  // Only a process without the readiness mark is judged by whether it mapped the library.
  if (!target.library_mapped && target.ready_signal == 0)
    target.library_mapped = preloads_renamed_copy(proc, preload, objects);
  target.reporter_thread = find_reporter_thread(proc);
  return target;
}

std::string refusal(const Target& target, int* signal_number) {
  const std::string process = "process " + std::to_string(target.pid);
  const std::string nothing = "; nothing was sent";
  if (target.ready_signal == 0 && !target.library_mapped) {
    return process + " has not loaded libpoolcuda.so, so it has no report (and the signal "
                     "could kill it)" + nothing + ". Start it with 'poolcuda run -- PROGRAM'";
  }
  int signal = target.ready_signal;
  if (signal == 0) {
    const ParseResult parsed = parse_config(target.conf.value_or(""));
    if (!parsed) {
      return process + " has an invalid POOLCUDA_CONF (" + parsed.error.message() + ")" +
             nothing;
    }
    if (parsed.config->report_signal == ReportSignal::none) {
      return process + " runs with report_signal:none, so it does not answer requests" +
             nothing + " (report_at_exit:1 writes a report when it exits)";
    }
    signal = parsed.config->report_signal == ReportSignal::usr1 ? SIGUSR1 : SIGUSR2;
  }
  const std::string name = signal_name(signal);
  if (has(target.ignored, signal)) {
    return process + " ignores " + name + ", so the library cannot answer on it" + nothing;
  }
  if (target.ready_signal == 0 && has(target.caught, signal)) {
    return process + " has its own " + name + " handler, which the library leaves alone, so "
                     "it cannot answer requests" + nothing +
           " (report_at_exit:1 writes a report when it exits)";
  }
  // Ready once (the mark, or the reporter thread that publishes it), and no handler now.
  if ((target.ready_signal != 0 || target.reporter_thread != 0) && !has(target.caught, signal)) {
    return process + " was ready, but " + name + " no longer has a handler (the program set it "
                     "back to the default, which the signal would kill it with), so the "
                     "library cannot answer" + nothing +
           " (report_at_exit:1 writes a report when it exits)";
  }
  if (target.ready_signal == 0) {
    return process + " has loaded libpoolcuda.so but is not ready to answer (it has made no "
                     "CUDA call the library intercepts yet, the library is still loading, or "
                     "this is a forked child or a second copy of the library)" +
           nothing + "; try again";
  }
  // The library answers through this command's pipe, which it opens as /proc/SENDER/fd/N (Note
  // [Report channel]): from a nested PID namespace the sender is not there to be named, and a
  // process of another user may not open another user's descriptors.
  int own_namespaces = 0;
  if (const auto own = read_proc_file("/proc/self/status")) {
    Target self;
    read_status(*own, &self);
    own_namespaces = self.pid_namespaces;
  }
  if (own_namespaces != 0 && target.pid_namespaces > own_namespaces) {
    return process + " runs in another PID namespace (a container's, where it is PID " +
           std::to_string(target.pid_inside) + "), from which the library cannot reach this "
           "command" + nothing + "; run poolcuda report inside that container";
  }
  const long uid = static_cast<long>(::geteuid());
  if (target.fs_uid >= 0 && target.fs_uid != uid && target.effective_uid != 0) {
    const passwd* user = ::getpwuid(static_cast<uid_t>(target.fs_uid));
    const std::string who = user != nullptr ? std::string(user->pw_name)
                                            : "uid " + std::to_string(target.fs_uid);
    return process + " runs as " + who + ", which may not open the reply pipe of this command "
           "(uid " + std::to_string(uid) + ")" + nothing + "; run poolcuda report as " + who +
           (user != nullptr ? " (sudo -u " + who + " poolcuda report " +
                                  std::to_string(target.pid) + ")"
                            : "");
  }
  *signal_number = signal;
  return {};
}

}  // namespace poolcuda::cli
