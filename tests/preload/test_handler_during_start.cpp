// Preload test: a SIGUSR1 handler the program installs while the library sets up its report
// signal (inside the program's first CUDA call, on another thread) stays the program's. The
// library looked at the disposition and installed its own in two calls, and a handler installed
// between them was overwritten for good, with nothing said. The window is made wide by a
// sem_init preloaded after the library (handler_during_start.cpp), which installs the handler
// there. Run with the path of that library as its argument.
#include <signal.h>

#include <cstdlib>
#include <string>

#include "check.h"

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "child") {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));  // the library starts its reporter here
    struct sigaction now {};
    CHECK(sigaction(SIGUSR1, nullptr, &now) == 0);
    CHECK_MSG((now.sa_flags & SA_SIGINFO) == 0 &&
                  reinterpret_cast<void*>(now.sa_handler) != nullptr &&
                  now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN,
              "the program's SIGUSR1 handler was replaced");
    CHECK_CUDA(cudaFree(ptr));
    std::printf("child ok\n");
    return 0;
  }
  CHECK_MSG(argc > 1, "usage: test_handler_during_start HANDLER_DURING_START_LIBRARY");
  const char* preloaded = std::getenv("LD_PRELOAD");
  const preload_test::ChildResult child = preload_test::run_self(
      "child",
      {std::string("LD_PRELOAD=") + (preloaded != nullptr ? preloaded : "") + ":" + argv[1],
       "HANDLER_DURING_START=1"},
      60);
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "child exited with " + std::to_string(child.status));
  CHECK_MSG(child.output.find("got a handler of the program's meanwhile") != std::string::npos,
            "the library did not say it left the signal alone");
  std::printf("ok\n");
  return 0;
}
