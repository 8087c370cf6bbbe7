// Preload test: the library's log lines never block or kill a program whose standard error is a
// pipe (Note [Writes to standard error] in interpose/log.cpp). Plain CUDA writes nothing there.
//   - A pipe whose reader is gone: a refused free's log line used to kill the program with
//     SIGPIPE; now the program goes on, and no SIGPIPE is left pending for it.
//   - A pipe nobody reads: 4,000 refused frees, each with its log line, used to block in
//     write(2) once the pipe was full; now they all return at once, and the lines written
//     before the pipe filled are whole lines.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>

#include "check.h"

namespace {

// A refused free: one log line from the library, cudaErrorInvalidValue.
void refused_free(void* freed) {
  CHECK_MSG(cudaFree(freed) == cudaErrorInvalidValue, "a double free was not refused");
  cudaGetLastError();
}

// Points standard error at `fd` and returns the old one's duplicate.
int redirect_stderr(int fd) {
  const int saved = ::dup(STDERR_FILENO);
  CHECK(saved >= 0 && ::dup2(fd, STDERR_FILENO) == STDERR_FILENO);
  return saved;
}

void restore_stderr(int saved) {
  CHECK(::dup2(saved, STDERR_FILENO) == STDERR_FILENO);
  ::close(saved);
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  void* freed = nullptr;
  CHECK_CUDA(cudaMalloc(&freed, 1000));
  CHECK_CUDA(cudaFree(freed));

  // Reader gone. SIGPIPE keeps its default action: it would end the process.
  int ends[2];
  CHECK(::pipe(ends) == 0);
  ::close(ends[0]);
  int saved = redirect_stderr(ends[1]);
  ::close(ends[1]);
  refused_free(freed);
  restore_stderr(saved);
  sigset_t pending;
  CHECK(::sigpending(&pending) == 0 && ::sigismember(&pending, SIGPIPE) == 0);
  std::printf("closed pipe: the program goes on\n");

  // Nobody reads.
  CHECK(::pipe(ends) == 0);
  saved = redirect_stderr(ends[1]);
  ::close(ends[1]);
  for (int i = 0; i < 4000; ++i) refused_free(freed);
  restore_stderr(saved);
  CHECK(::fcntl(ends[0], F_SETFL, O_NONBLOCK) == 0);
  std::string written;
  char buffer[4096];
  for (ssize_t n; (n = ::read(ends[0], buffer, sizeof buffer)) > 0;) written.append(buffer, n);
  ::close(ends[0]);
  CHECK_MSG(!written.empty() && written.back() == '\n' && written.rfind("poolcuda: ", 0) == 0,
            "the full pipe holds no whole lines: " + written.substr(0, 200));
  std::printf("full pipe: 4000 refused frees returned, %zu bytes of lines written\n",
              written.size());
  std::printf("ok\n");
  return 0;
}
