// The library's side of the report channel (see report_channel.h).
//
// Note [Report channel]
// `poolcuda report PID` wants the report back, not on the program's standard error, and a
// signal is the only way to reach a program that was not written to listen. A signal carries
// a sender and a word (si_pid and si_value of a signal queued with SI_QUEUE), so the asker
// creates a pipe, keeps its read end and queues the report signal with a word naming the
// request, the descriptor number of that read end and the low 32 bits of the pipe's inode
// (channel_protocol.h). The protocol:
//   1. The asker queues the signal to the reporter thread alone (rt_tgsigqueueinfo to the
//      thread named poolcuda-report: no thread of the program is interrupted, Note [Report
//      signal] in reporter.cpp), or to the process when it cannot find that thread.
//   2. The handler stores (si_pid, si_value) in a free slot of a fixed array (a compare-and-swap
//      per slot, async-signal-safe) and posts the reporter's semaphore. All slots taken: the
//      request is dropped.
//   3. The reporter thread opens /proc/<si_pid>/fd/<descriptor> for writing: opening a pipe's
//      end through /proc gives a new write end of the same pipe, and the kernel allows it only
//      to a process that may inspect the asker (same user, or privileged). Before and after the
//      open it checks that this is a pipe with the named inode: si_pid and si_value are chosen by
//      the sender, so a dead asker (no such descriptor), a reused pid (another file) or a sender
//      naming someone else's descriptor (another inode) is refused and the request dropped. The
//      open is non-blocking, so no device or FIFO can hold the thread.
//   4. It writes channel::kAck at once, does the work (render a report, write one where
//      report_path says, or trim the pools), writes "poolcuda-reply ok|error LENGTH\n" and the
//      payload, and closes. Writes are non-blocking with one deadline for the whole reply: an
//      asker that stops reading is abandoned, and one that exited makes the write fail with
//      EPIPE (the SIGPIPE this raises stays pending on the reporter thread, which blocks it).
// A standard signal that is already pending is not queued twice, and slots can run out, so a
// request may be lost: the asker sends it again until the acknowledgement arrives.
//
// Depends on channel_protocol.h, the registry, the report writer, the log and the
// configuration.
#include "interpose/report_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "interpose/channel_protocol.h"
#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "interpose/registry.h"
#include "interpose/report_writer.h"
#include "interpose/snapshots.h"
#include "pools/report_tree.h"

namespace poolcuda {

namespace {

using Clock = std::chrono::steady_clock;

// How long one reply may take to be read.
constexpr std::chrono::seconds kReplyBound{10};

// How long a trim waits for freed memory's fences, and then for the pages it released to reach
// the driver: each bound for every device together, so that the answer comes within the reply's
// bound however many devices there are.
constexpr std::chrono::milliseconds kTrimBound{2000};

// Writes everything before `deadline`, waiting for room in the pipe.
bool send(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd ready{fd, POLLOUT, 0};
    if (::poll(&ready, 1, static_cast<int>(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

bool names_the_pipe(const struct stat& info, std::uint32_t inode_tag) {
  return S_ISFIFO(info.st_mode) && static_cast<std::uint32_t>(info.st_ino) == inode_tag;
}

// Step 3 of Note [Report channel]: a write end of the asker's pipe, or -1 with `why` set.
int open_reply_pipe(const ChannelRequest& request, const channel::Decoded& decoded,
                    std::string* why) {
  const std::string path = "/proc/" + std::to_string(request.sender) + "/fd/" +
                           std::to_string(decoded.descriptor);
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) {
    *why = "cannot reach its reply pipe " + path + ": " + std::strerror(errno);
    return -1;
  }
  if (!names_the_pipe(before, decoded.inode_tag)) {
    *why = path + " is not the pipe the request names";
    return -1;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    *why = "cannot open its reply pipe " + path + ": " + std::strerror(errno);
    return -1;
  }
  struct stat after {};
  if (::fstat(fd, &after) != 0 || after.st_dev != before.st_dev || after.st_ino != before.st_ino) {
    ::close(fd);
    *why = path + " changed while it was opened";
    return -1;
  }
  return fd;
}

// Explicit cleanup of every device's idle pages; says what went back to the driver. Memory
// freed just before still waits for its free fence: the fences are drained first, within a
// bound (a stream parked for good would hold the reporter forever), and what still waits is
// said. (A helper thread that drained without a bound used to stay behind such a stream, one
// more for every trim.)
std::string trim_pools() {
  Registry& registry = Registry::instance();
  const std::vector<int> devices = registry.devices();
  if (devices.empty()) return "no device has pools yet; nothing to release\n";
  std::string out;
  WaitBound fences{kTrimBound};
  WaitBound arrivals{kTrimBound * 2};  // starts now: what the fences leave of it, and more
  for (int device : devices) {
    MemoryManager* manager = registry.manager(device);
    const std::uint64_t before = manager->memory_usage().bytes_reserved;
    manager->drain_fences_within(fences);
    manager->cleanup(true);
    // The pages reach the driver through the release worker; the answer waits for them.
    const bool flushed = manager->flush_releases(arrivals.left_micros());
    const ManagerReport after = manager->report();
    const std::uint64_t released =
        before > after.bytes_reserved ? before - after.bytes_reserved : 0;
    out += "device " + std::to_string(device) + ": released " + human_bytes(released) +
           ", still reserved " + human_bytes(after.bytes_reserved) + " (in use " +
           human_bytes(after.bytes_in_use) + ", waiting for fences " +
           human_bytes(after.pending_fence_bytes) + ")" +
           (flushed ? "" : "; some pages are still on their way to the driver") + "\n";
  }
  return out;
}

struct Answer {
  bool ok = true;
  std::string text;
};

Answer answer(channel::Request request) {
  switch (request) {
    case channel::Request::report_text:
      return {true, render_snapshots("request", ReportFormat::text, take_snapshots()).text};
    case channel::Request::report_json:
      return {true, render_snapshots("request", ReportFormat::json, take_snapshots()).text};
    case channel::Request::report_wide:
      return {true, render_snapshots("request", ReportFormat::wide, take_snapshots()).text};
    case channel::Request::report_configured: {
      const RenderedReport report =
          render_snapshots("request", config().report_format, take_snapshots());
      const Delivery delivery = deliver(report);
      if (!delivery.ok) return {false, delivery.where + "\n"};
      return {true, "report #" + std::to_string(report.sequence) + " written to " +
                        delivery.where + "\n"};
    }
    case channel::Request::trim:
      return {true, trim_pools()};
  }
  return {false, "unknown request\n"};
}

}  // namespace

bool RequestSlots::push(const ChannelRequest& request) {
  for (Slot& slot : slots_) {
    std::uint32_t expected = empty;
    if (!slot.state.compare_exchange_strong(expected, writing, std::memory_order_acquire)) {
      continue;
    }
    slot.request = request;
    slot.state.store(ready, std::memory_order_release);
    return true;
  }
  return false;
}

bool RequestSlots::pop(ChannelRequest* request) {
  for (Slot& slot : slots_) {
    if (slot.state.load(std::memory_order_acquire) != ready) continue;
    *request = slot.request;
    slot.state.store(empty, std::memory_order_release);
    return true;
  }
  return false;
}

void serve_request(const ChannelRequest& request) {
  const std::optional<channel::Decoded> decoded = channel::decode(request.word);
  if (!decoded) return;
  std::string why;
  const int fd = open_reply_pipe(request, *decoded, &why);
  if (fd < 0) {
    log_format(LogLevel::full, "report request from process %d dropped: %s", request.sender,
               why.c_str());
    return;
  }
  const Clock::time_point deadline = Clock::now() + kReplyBound;
  if (send(fd, channel::kAck, deadline)) {
    const Answer reply = answer(decoded->request);
    if (!send(fd, channel::reply_header(reply.ok, reply.text.size()) + reply.text, deadline)) {
      log_format(LogLevel::full, "the reply to process %d was not read; abandoned",
                 request.sender);
    }
  }
  ::close(fd);
}

}  // namespace poolcuda
