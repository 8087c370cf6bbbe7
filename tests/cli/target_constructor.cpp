// A library the CLI tests' target program links: its constructor runs before the preloaded
// libpoolcuda.so's (the program's own libraries are initialised first), so it can act before
// the library is ready. CLI_TARGET_CONSTRUCTOR says what it does:
//   "handler"   installs a SIGUSR1 handler of the program's own (the library then leaves the
//               signal alone);
//   "sleep:MS"  writes "constructor" to the file CLI_TARGET_MARKER names, then sleeps MS ms (a
//               window in which the library is mapped but its constructor has not run);
//   "cuda"      makes the process's first CUDA call (cudaFree(nullptr)) before the library's
//               constructor has run.
// Unset, it does nothing. The program calls target_constructor_action() (what was done), which
// also keeps the linker from dropping this library.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

const char* g_action = "nothing";

void own_handler(int) {}

__attribute__((constructor)) void constructor() {
  const char* what = std::getenv("CLI_TARGET_CONSTRUCTOR");
  if (what == nullptr) return;
  g_action = what;
  if (std::strcmp(what, "handler") == 0) {
    struct sigaction action {};
    action.sa_handler = own_handler;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, nullptr);
  } else if (std::strcmp(what, "cuda") == 0) {
    cudaFree(nullptr);
  } else if (std::strncmp(what, "sleep:", 6) == 0) {
    if (const char* marker = std::getenv("CLI_TARGET_MARKER")) {
      const int fd = open(marker, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        [[maybe_unused]] const auto written = write(fd, "constructor\n", 12);
        close(fd);
      }
    }
    const long ms = std::strtol(what + 6, nullptr, 10);
    timespec pause{ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&pause, &pause) != 0) {
    }
  }
}

}  // namespace

extern "C" const char* target_constructor_action() { return g_action; }
