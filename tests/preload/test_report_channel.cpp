// Preload test: the library's side of the report channel (Note [Report channel] in
// interpose/report_channel.cpp), spoken directly, without the CLI: a request queued with the
// report signal gets its acknowledgement and reply on the asker's pipe (a text and a JSON
// report, a trim that returns freed memory); requests naming a descriptor that is not the pipe
// they claim (a regular file, another pipe), or coming from a process that is gone, are dropped
// without a byte written anywhere; and the reporter keeps answering afterwards. Trims while a
// freed buffer's fence waits behind a stream parked on a host function answer within their
// bound and leave no thread behind.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "check.h"
#include "interpose/channel_protocol.h"
#include "json_check.h"

namespace {

namespace channel = poolcuda::channel;

struct Pipe {
  int read_end = -1;
  int write_end = -1;
  Pipe() {
    int fds[2];
    CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~Pipe() {
    ::close(read_end);
    ::close(write_end);
  }
  std::uint64_t inode() const {
    struct stat info {};
    CHECK(::fstat(read_end, &info) == 0);
    return info.st_ino;
  }
};

// Queues SIGUSR1 to this process with `word`, claiming to come from `sender`.
void queue_request(std::uint64_t word, pid_t sender) {
  siginfo_t info{};
  info.si_signo = SIGUSR1;
  info.si_code = SI_QUEUE;
  info.si_pid = sender;
  info.si_uid = ::getuid();
  info.si_value.sival_ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(word));
  CHECK(::syscall(SYS_rt_sigqueueinfo, ::getpid(), SIGUSR1, &info) == 0);
}

// Everything `fd` yields within `wait`, stopping early once a whole reply arrived.
std::string collect(int fd, std::chrono::milliseconds wait) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd ready{fd, POLLIN, 0};
    ::poll(&ready, 1, 20);
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(fd, buffer, sizeof buffer)) > 0) out.append(buffer, n);
    if (out.starts_with(channel::kAck)) {
      const auto header = channel::parse_reply_header(out.substr(channel::kAck.size()));
      if (header && out.size() >= channel::kAck.size() + header->header_size + header->length) {
        break;
      }
    }
  }
  return out;
}

// Asks over a fresh pipe and returns the reply's payload (checking the framing and status).
std::string ask(channel::Request request) {
  Pipe pipe;
  queue_request(channel::encode(request, pipe.read_end, pipe.inode()), ::getpid());
  const std::string reply = collect(pipe.read_end, std::chrono::seconds(10));
  CHECK_MSG(reply.starts_with(channel::kAck), "no acknowledgement: '" + reply + "'");
  const auto header = channel::parse_reply_header(reply.substr(channel::kAck.size()));
  CHECK_MSG(header && header->header_size != 0 && header->ok, "bad reply: " + reply);
  const std::string payload = reply.substr(channel::kAck.size() + header->header_size);
  CHECK(payload.size() == header->length);
  return payload;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  void* kept = nullptr;
  void* freed = nullptr;
  CHECK_CUDA(cudaMalloc(&kept, 1 << 20));
  CHECK_CUDA(cudaMalloc(&freed, 64 << 20));
  CHECK_CUDA(cudaFree(freed));

  const std::string text = ask(channel::Request::report_text);
  CHECK_MSG(text.find("poolcuda report #1 (pid " + std::to_string(::getpid()) + ", request)") !=
                std::string::npos,
            text);
  const std::string json = ask(channel::Request::report_json);
  CHECK_MSG(preload_test::valid_json(json), json);
  const std::string trimmed = ask(channel::Request::trim);
  CHECK_MSG(trimmed.find("device 0: released 64.0 MiB") != std::string::npos, trimmed);

  // A fence behind a parked stream: each trim waits for it within its bound, and then says so.
  {
    cudaStream_t parked = nullptr;
    CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
    preload_test::Gate gate;
    CHECK_CUDA(cudaLaunchHostFunc(parked, &preload_test::wait_at_gate, &gate));
    void* behind = nullptr;
    CHECK_CUDA(cudaMalloc(&behind, 4 << 20));
    CHECK_CUDA(cudaFreeAsync(behind, parked));
    const auto threads = [] {
      std::size_t n = 0;
      for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
        (void)entry;
        ++n;
      }
      return n;
    };
    const std::size_t before = threads();
    for (int i = 0; i < 2; ++i) {
      const std::string waiting = ask(channel::Request::trim);
      CHECK_MSG(waiting.find("waiting for fences") != std::string::npos, waiting);
    }
    CHECK_MSG(threads() == before, "trims left threads behind: " + std::to_string(before) +
                                       " before, " + std::to_string(threads()) + " after");
    gate.open.store(true);
    CHECK_CUDA(cudaStreamSynchronize(parked));
    CHECK_CUDA(cudaStreamDestroy(parked));
  }

  // A regular file at the descriptor the request names (its inode given): not a pipe, dropped.
  char file_template[] = "/tmp/poolcuda-channel-test-XXXXXX";
  const int file = ::mkstemp(file_template);
  CHECK(file >= 0);
  ::unlink(file_template);
  struct stat file_info {};
  CHECK(::fstat(file, &file_info) == 0);
  queue_request(channel::encode(channel::Request::report_text, file, file_info.st_ino),
                ::getpid());
  // A pipe named with another pipe's inode: dropped, nothing written to it.
  Pipe other;
  Pipe named;
  queue_request(channel::encode(channel::Request::report_text, named.read_end, other.inode()),
                ::getpid());
  // A sender that is gone.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  CHECK(::waitpid(gone, nullptr, 0) == gone);
  Pipe orphan;
  queue_request(channel::encode(channel::Request::report_text, orphan.read_end, orphan.inode()),
                gone);
  const std::string stray = collect(named.read_end, std::chrono::milliseconds(1500));
  CHECK_MSG(stray.empty(), "a request naming another pipe was answered: " + stray);
  CHECK(collect(orphan.read_end, std::chrono::milliseconds(10)).empty());
  CHECK(::lseek(file, 0, SEEK_END) == 0);
  ::close(file);

  // Still answering.
  CHECK(ask(channel::Request::report_text).find("poolcuda report #") != std::string::npos);
  CHECK_CUDA(cudaFree(kept));
  std::printf("ok\n");
  return 0;
}
