// Preload test: the library's release thread runs on the CPUs the program's threads may use,
// even when the program thread that starts it has pinned itself to one CPU (Note [Library
// threads' CPUs] in interpose/threads.cpp). A helper thread keeps every CPU main had at its
// start; then main pins itself and makes out-of-memory recovery give an idle page back, which
// starts the release thread. That thread's CPU mask must be the union, main's first mask.
// With argument `filtered`, sched_setaffinity is refused by a seccomp filter (as a sandbox may
// refuse it): the release thread must still start, with main's mask. Skipped where the process
// has one CPU, and on a GPU (the sizes below assume the stand-in's 1 GiB device).

#include <dirent.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

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

// Makes every later sched_setaffinity of this process fail with EPERM (no privilege needed).
bool refuse_setaffinity() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sched_setaffinity, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool filtered = argc > 1 && std::strcmp(argv[1], "filtered") == 0;
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's 1 GiB device");
  cpu_set_t at_start;
  CHECK_MSG(::sched_getaffinity(0, sizeof(at_start), &at_start) == 0, "sched_getaffinity");
  if (CPU_COUNT(&at_start) < 2) preload_test::skip("needs two CPUs");
  int first_cpu = 0;
  while (!CPU_ISSET(first_cpu, &at_start)) ++first_cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first_cpu, &one);
  // A program thread that keeps every CPU, alive until the end.
  std::atomic<bool> finished{false};
  std::thread helper([&] {
    while (!finished.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  CHECK_MSG(::sched_setaffinity(0, sizeof(one), &one) == 0, "could not pin the main thread");
  if (filtered) {
    CHECK_MSG(refuse_setaffinity(), "could not install the seccomp filter");
    CHECK_MSG(::sched_setaffinity(0, sizeof(one), &one) != 0, "the filter lets the call through");
  }

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
  CHECK_MSG(worker != 0, "no release thread started");
  cpu_set_t worker_cpus;
  CHECK_MSG(::sched_getaffinity(worker, sizeof(worker_cpus), &worker_cpus) == 0,
            "sched_getaffinity of the release thread");
  const cpu_set_t& expected = filtered ? one : at_start;
  CHECK_MSG(CPU_EQUAL(&worker_cpus, &expected),
            "the release thread runs on " + std::to_string(CPU_COUNT(&worker_cpus)) +
                " CPU(s), not on " + std::to_string(CPU_COUNT(&expected)));
  CHECK_CUDA(cudaFree(second));
  finished.store(true);
  helper.join();
  return 0;
}
