// The asking side of the report channel (see target.h and Note [Report channel] in
// interpose/report_channel.cpp): a private pipe, the request queued as a signal to the
// reporter thread, resent until the library acknowledges it, then the framed reply.
//
// Depends on interpose/channel_protocol.h.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "target.h"

namespace poolcuda::cli {

namespace {

using Clock = std::chrono::steady_clock;

// How long to wait for an acknowledgement before sending the request again: a standard signal
// already pending is not queued twice, and the library's request slots can be full.
constexpr std::chrono::milliseconds kResendInterval{500};

// Queues the signal to the reporter thread, or to the process when that thread is unknown or
// gone. False when the process cannot be signalled (errno set).
bool send_request(const Target& target, int signal_number, std::uint64_t word) {
  siginfo_t info{};
  info.si_signo = signal_number;
  info.si_code = SI_QUEUE;
  info.si_pid = ::getpid();
  info.si_uid = ::getuid();
  info.si_value.sival_ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(word));
  if (target.reporter_thread != 0 &&
      ::syscall(SYS_rt_tgsigqueueinfo, static_cast<pid_t>(target.pid),
                static_cast<pid_t>(target.reporter_thread), signal_number, &info) == 0) {
    return true;
  }
  return ::sigqueue(static_cast<pid_t>(target.pid), signal_number, info.si_value) == 0;
}

class Pipe {
 public:
  Pipe() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) fds_[0] = fds_[1] = -1;
  }
  ~Pipe() {
    close_write_end();
    if (fds_[0] >= 0) ::close(fds_[0]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  bool ok() const { return fds_[0] >= 0; }
  int read_end() const { return fds_[0]; }
  // Once the library holds its own write end, ours must go for its close to read as the end.
  void close_write_end() {
    if (fds_[1] >= 0) ::close(fds_[1]);
    fds_[1] = -1;
  }

 private:
  int fds_[2] = {-1, -1};
};

Answer failure(std::string text) { return Answer{false, false, std::move(text)}; }

}  // namespace

Answer ask(const Target& target, int signal_number, channel::Request request,
           std::chrono::milliseconds timeout) {
  const std::string process = "process " + std::to_string(target.pid);
  Pipe pipe;
  struct stat info {};
  if (!pipe.ok() || ::fstat(pipe.read_end(), &info) != 0) {
    return failure(std::string("cannot create the reply pipe: ") + std::strerror(errno));
  }
  if (pipe.read_end() > channel::kMaxDescriptor) {
    return failure("the reply pipe's descriptor number is too large to send");
  }
  const std::uint64_t word = channel::encode(request, pipe.read_end(), info.st_ino);

  const Clock::time_point deadline = Clock::now() + timeout;
  Clock::time_point next_send = Clock::now();
  bool acknowledged = false;
  std::string received;
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      return failure(acknowledged
                         ? process + " took the request but did not finish its answer within " +
                               std::to_string(timeout.count()) + " ms"
                         : process + " did not answer within " + std::to_string(timeout.count()) +
                               " ms (stopped, or its handler was replaced in the last second)");
    }
    if (!acknowledged && now >= next_send) {
      if (!send_request(target, signal_number, word)) {
        return failure("cannot signal " + process + ": " + std::strerror(errno));
      }
      next_send = now + kResendInterval;
    }
    const Clock::time_point wake = acknowledged ? deadline : std::min(deadline, next_send);
    pollfd ready{pipe.read_end(), POLLIN, 0};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    if (::poll(&ready, 1, static_cast<int>(wait) + 1) < 0 && errno != EINTR) {
      return failure(std::string("cannot wait for the answer: ") + std::strerror(errno));
    }
    char buffer[65536];
    ssize_t n;
    while ((n = ::read(pipe.read_end(), buffer, sizeof buffer)) > 0) {
      received.append(buffer, static_cast<std::size_t>(n));
    }
    const bool ended = n == 0 && acknowledged;
    if (!acknowledged && received.size() >= channel::kAck.size()) {
      if (!received.starts_with(channel::kAck)) return failure(process + " answered garbage");
      received.erase(0, channel::kAck.size());
      acknowledged = true;
      pipe.close_write_end();
    }
    if (acknowledged) {
      const std::optional<channel::ReplyHeader> header = channel::parse_reply_header(received);
      if (header && header->header_size == 0) return failure(process + " answered garbage");
      if (header && received.size() >= header->header_size + header->length) {
        return Answer{true, header->ok, received.substr(header->header_size, header->length)};
      }
      if (ended) return failure(process + " closed the channel before its answer was complete");
    }
    if (::kill(static_cast<pid_t>(target.pid), 0) != 0 && errno == ESRCH) {
      return failure(process + " exited before it answered");
    }
  }
}

}  // namespace poolcuda::cli
