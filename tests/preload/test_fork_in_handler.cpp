// Preload test: a signal handler that forks while its thread is inside the library's first CUDA
// call (Note [Fork] in interpose/lifecycle.cpp). The program inherits SIGUSR1 ignored, so the
// library keeps a note for that first call, and its stderr is a full pipe that its reader
// drains only after three seconds, so writing the note blocks. A second in, SIGALRM's handler
// forks. Before, the note was written under the mutex the fork handlers take, and the fork
// waited for it forever; now the process ends as the plain one does.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "check.h"

namespace {

extern "C" void fork_now(int) {
  const int saved = errno;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  if (child > 0) ::waitpid(child, nullptr, 0);
  errno = saved;
}

int child() {
  struct sigaction action {};
  action.sa_handler = fork_now;
  action.sa_flags = SA_RESTART;
  if (::sigaction(SIGALRM, &action, nullptr) != 0) return 10;
  // Fill the stderr pipe.
  const int flags = ::fcntl(2, F_GETFL);
  ::fcntl(2, F_SETFL, flags | O_NONBLOCK);
  char block[4096];
  std::memset(block, '.', sizeof block);
  while (::write(2, block, sizeof block) > 0) {
  }
  while (::write(2, block, 1) > 0) {
  }
  ::fcntl(2, F_SETFL, flags);
  ::alarm(1);
  void* ptr = nullptr;
  const cudaError_t result = cudaMalloc(&ptr, 4096);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the alarm fires in any case
  return result == cudaSuccess ? 0 : 11;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc == 2 && std::string(argv[1]) == "child") return child();
  int fds[2];
  CHECK(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::signal(SIGUSR1, SIG_IGN);  // inherited through exec: the library keeps a note about it
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) ::_exit(125);
    self[n] = '\0';
    char* args[] = {self, const_cast<char*>("child"), nullptr};
    ::execv(self, args);
    ::_exit(126);
  }
  ::close(fds[1]);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the slow reader
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd readable{fds[0], POLLIN, 0};
    if (::poll(&readable, 1, 100) == 1 && ::read(fds[0], buffer, sizeof buffer) <= 0) break;
  }
  ::close(fds[0]);
  // The pipe closes a moment before the process can be waited for.
  int status = 0;
  pid_t waited = 0;
  while ((waited = ::waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (waited != pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    CHECK_MSG(false, "the program hung in its first CUDA call");
  }
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status " + std::to_string(status));
  std::printf("ok\n");
  return 0;
}
