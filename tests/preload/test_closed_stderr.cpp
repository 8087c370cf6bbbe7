// Preload test: the library's lines never land in a file of the program's that took descriptor 2
// because the program started with it closed (`prog 2>&-`; Note [A standard error that is no
// longer one] in interpose/log.cpp). The child opens its file (descriptor 2), fills the 64 MiB
// device (meson.build) with 1 MiB buffers until one is refused, which the library says in a
// line, and writes one line of its own to the file. The file must hold exactly that line.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"

namespace {

int child(const char* path) {
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd != STDERR_FILENO) return 3;  // the case needs the file at descriptor 2
  std::vector<void*> held;
  void* p = nullptr;
  while (cudaMalloc(&p, std::size_t{1} << 20) == cudaSuccess) held.push_back(p);
  (void)cudaGetLastError();
  const std::string line = "the program's line\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 4;
  for (void* q : held) (void)cudaFree(q);
  return 0;
}

// Runs this program as a child with descriptor 2 closed at exec; returns its file's contents.
std::string run_closed_child() {
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK(length > 0);
  self[length] = '\0';
  char dir[] = "/tmp/poolcuda-closed-stderr-XXXXXX";
  CHECK(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/out.txt";
  const pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    ::close(STDERR_FILENO);
    char* argv[] = {self, const_cast<char*>(path.c_str()), nullptr};
    ::execv(self, argv);
    ::_exit(126);
  }
  int status = 0;
  CHECK(::waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "child status " + std::to_string(status));
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  ::unlink(path.c_str());
  ::rmdir(dir);
  return contents.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2) return child(argv[1]);
  preload_test::require_preloaded();
  const std::string contents = run_closed_child();
  CHECK_MSG(contents == "the program's line\n", "the file holds:\n" + contents);
  std::printf("ok\n");
  return 0;
}
