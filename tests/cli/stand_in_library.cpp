// A stand-in for libpoolcuda.so used only by the CLI tests: loaded through LD_PRELOAD by
// `poolcuda run`, it writes "loaded" and then one line per SIGUSR1/SIGUSR2 it receives to the
// file named by POOLCUDA_CLI_TEST_MARKER. Without that variable it does nothing, so programs it
// is preloaded into behave as usual. It exports the library's marker symbol, which `poolcuda
// run` requires, but publishes no readiness mark: `poolcuda report` must never signal it.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" __attribute__((visibility("default"))) const char poolcuda_library_marker[];
extern "C" const char poolcuda_library_marker[] = "stand-in";

namespace {

char marker_path[4096];

void append(const char* text) {
  const int fd = open(marker_path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  [[maybe_unused]] const auto written = write(fd, text, std::strlen(text));
  close(fd);
}

// Only async-signal-safe calls: open, write, close.
void on_signal(int signal_number) { append(signal_number == SIGUSR1 ? "SIGUSR1\n" : "SIGUSR2\n"); }

__attribute__((constructor)) void load() {
  const char* path = std::getenv("POOLCUDA_CLI_TEST_MARKER");
  if (path == nullptr || std::strlen(path) >= sizeof(marker_path)) return;
  std::strcpy(marker_path, path);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGUSR2, &action, nullptr);
  append("loaded\n");
}

}  // namespace
