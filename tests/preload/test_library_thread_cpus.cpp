// Preload test: the library's release thread runs on the CPUs the process had when the library
// was loaded, even when the program thread that starts it has pinned itself to one CPU (Note
// [Library threads' CPUs] in interpose/threads.cpp). The main thread pins itself, then makes
// out-of-memory recovery give an idle page back, which starts the release thread; that thread's
// CPU mask must be the one main had at its start. Skipped where the process has one CPU. Run on
// a 1 GiB device.

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The id of this process's thread named `name`, or 0.
pid_t thread_named(const std::string& name) {
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return 0;
  pid_t found = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name + "/comm");
    std::string line;
    if (std::getline(comm, line) && line == name) found = std::atoi(entry->d_name);
  }
  ::closedir(tasks);
  return found;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  cpu_set_t at_start;
  CHECK_MSG(::sched_getaffinity(0, sizeof(at_start), &at_start) == 0, "sched_getaffinity");
  if (CPU_COUNT(&at_start) < 2) preload_test::skip("needs two CPUs");
  int first_cpu = 0;
  while (!CPU_ISSET(first_cpu, &at_start)) ++first_cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first_cpu, &one);
  CHECK_MSG(::sched_setaffinity(0, sizeof(one), &one) == 0, "could not pin the main thread");

  CHECK_MSG(thread_named("poolcuda-free") == 0, "the release thread ran before any page went back");
  // 600 MiB freed, then 700 MiB asked for: both fit the device only once the idle page has gone
  // back to the driver, which the release thread does.
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, 600 * kMiB));
  CHECK_CUDA(cudaFree(first));
  CHECK_CUDA(cudaDeviceSynchronize());
  void* second = nullptr;
  CHECK_CUDA(cudaMalloc(&second, 700 * kMiB));

  const pid_t worker = thread_named("poolcuda-free");
  CHECK_MSG(worker != 0, "no release thread started: the test would prove nothing");
  cpu_set_t worker_cpus;
  CHECK_MSG(::sched_getaffinity(worker, sizeof(worker_cpus), &worker_cpus) == 0,
            "sched_getaffinity of the release thread");
  CHECK_MSG(CPU_EQUAL(&worker_cpus, &at_start),
            "the release thread runs on " + std::to_string(CPU_COUNT(&worker_cpus)) +
                " CPU(s), not on the process's " + std::to_string(CPU_COUNT(&at_start)));
  CHECK_CUDA(cudaFree(second));
  return 0;
}
