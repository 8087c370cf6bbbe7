// Preload test: a fork while another thread's first driver lookup is under way. The library
// maps the driver's entry points to its hooks once per process, under a lock, the first time a
// program resolves a driver function (cuGetProcAddress, or dlsym of a cu* name). A child forked
// while another thread held that lock must not inherit it held: its own first lookup would wait
// forever where the plain program's child gets its answer. Each stand-in lookup takes 20 ms
// here (SIMCUDA_LOOKUP_DELAY_US), so the map takes about a second to build and the fork, 50 ms
// after the build began, lands inside it. The fork waits until the first thread's dlopen has
// returned: glibc's fork does not wait for a dlopen under way, and a child forked in the middle
// of one inherits the library half relocated (its first call jumped to a raw offset, with or
// without this library), which a loaded machine under ASan showed.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "check.h"

namespace {

using Resolver = decltype(&cuGetProcAddress_v2);

// The driver's resolver as a program finds it (the library's hook, through its dlsym, whose
// first driver name builds the library's map). `opened`, when given, is set between the two.
Resolver driver_resolver(std::atomic<bool>* opened = nullptr) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(driver != nullptr);
  if (opened != nullptr) opened->store(true);
  auto* resolver = reinterpret_cast<Resolver>(::dlsym(driver, "cuGetProcAddress_v2"));
  CHECK(resolver != nullptr);
  return resolver;
}

// Resolves cuMemAlloc through `resolver`; true when a function came back.
bool resolve_mem_alloc(Resolver resolver) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  const CUresult result = resolver("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  return result == CUDA_SUCCESS && fn != nullptr;
}

}  // namespace

int main() {
  bool first_resolved = false;
  std::atomic<bool> opened{false};
  std::thread first([&] { first_resolved = resolve_mem_alloc(driver_resolver(&opened)); });
  while (!opened.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const pid_t child = ::fork();
  CHECK(child >= 0);
  if (child == 0) {
    // A lock inherited held would hang here: SIGALRM ends the child instead, and fails the test.
    ::alarm(10);
    ::_exit(resolve_mem_alloc(driver_resolver()) ? 0 : 3);
  }
  first.join();
  CHECK(first_resolved);
  int status = 0;
  CHECK(::waitpid(child, &status, 0) == child);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child's first driver lookup did not finish (wait status " +
                std::to_string(status) + ")");
  // The parent's own map works afterwards too.
  CHECK(resolve_mem_alloc(driver_resolver()));
  std::puts("fork during lookup: ok");
  return 0;
}
