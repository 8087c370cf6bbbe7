// Preload test: shards:auto counts the CPUs the process may run on, not those of the thread that
// happens to make the device's first allocation. A program whose first cudaMalloc comes from a
// thread pinned to one CPU must still let its other threads spread over shards (child), and so
// must one that pins every thread to a CPU of its own, the main thread included (child:all):
// the CPUs are those of all its threads, even one that never allocates; and so must one that
// makes its context (cudaFree(NULL), which builds the pools ahead) while its only thread is
// pinned to one CPU and widens its mask before its first allocation (child:early): the CPUs are
// counted at the first allocation. In each child two threads then take turns allocating,
// so that every allocation of each finds one of the other's before it: one of them must move to
// a shard of its own. The exit report shows both the shards made and the most the device may
// make. On a device smaller than 1 GiB shards:auto keeps one shard (small device): the same
// turns then make none.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "exit_report.h"

namespace {

constexpr std::size_t kSize = 4 << 20;  // above the sliced pools: a shard of its own serves it
constexpr int kTurns = 64;

int allowed_cpus(cpu_set_t* set) {
  CPU_ZERO(set);
  if (sched_getaffinity(0, sizeof *set, set) != 0) return 0;
  return CPU_COUNT(set);
}

// The `nth` CPU (from 0) the process may run on.
int nth_cpu(int nth) {
  cpu_set_t set;
  CHECK(allowed_cpus(&set) > nth);
  for (int cpu = 0;; ++cpu) {
    if (CPU_ISSET(cpu, &set) && nth-- == 0) return cpu;
  }
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  CHECK(pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0);
}

// The first allocation, on a thread pinned to `cpu`: the device's pools are made there. Then
// two threads take turns.
int child(int first_cpu) {
  std::thread pinned([first_cpu] {
    pin_to(first_cpu);
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, kSize));
    CHECK_CUDA(cudaFree(p));
  });
  pinned.join();

  std::atomic<int> turn{0};
  auto take_turns = [&](int me) {
    std::vector<void*> held;
    for (int i = 0; i < kTurns; ++i) {
      while (turn.load(std::memory_order_acquire) % 2 != me) std::this_thread::yield();
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, kSize));
      held.push_back(p);
      turn.fetch_add(1, std::memory_order_acq_rel);
    }
    for (void* p : held) CHECK_CUDA(cudaFree(p));
  };
  std::thread a(take_turns, 0), b(take_turns, 1);
  a.join();
  b.join();
  return 0;
}

// A figure of the device's "shards" object in a JSON report:
// {"shards":{"shards":MADE,"shard_limit":LIMIT}}.
std::uint64_t shards_figure(const std::string& json, const std::string& key) {
  const std::size_t object = json.find("\"shards\":{");
  CHECK_MSG(object != std::string::npos, "no shards object in the report:\n" + json);
  const std::string needle = "\"" + key + "\":";
  const std::size_t at = json.find(needle, object + 10);
  CHECK_MSG(at != std::string::npos, "no " + key + " in the report's shards:\n" + json);
  return std::stoull(json.substr(at + needle.size()));
}

void check_child(const char* argument) {
  const preload_test::ExitReport report = preload_test::run_with_exit_report(argument);
  const std::uint64_t made = shards_figure(report.json, "shards");
  const std::uint64_t limit = shards_figure(report.json, "shard_limit");
  std::printf("%s: shards made %llu, at most %llu\n", argument,
              static_cast<unsigned long long>(made), static_cast<unsigned long long>(limit));
  CHECK(limit >= 2);  // the CPUs the process may run on, not the pinned thread's one
  CHECK(made >= 2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") return child(nth_cpu(0));
  if (argc > 1 && std::string(argv[1]) == "child:all") {
    // Every thread on one CPU of its own: the main thread and the first allocation's on the
    // first, a thread that only waits on the second. Only the latter's mask shows a second CPU.
    const int first = nth_cpu(0), second = nth_cpu(1);
    std::atomic<bool> done{false};
    std::atomic<bool> pinned{false};
    std::thread bystander([&] {
      pin_to(second);
      pinned.store(true);
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    while (!pinned.load()) std::this_thread::yield();
    pin_to(first);  // the main thread (and the threads it starts)
    const int result = child(first);
    done.store(true);
    bystander.join();
    return result;
  }
  if (argc > 1 && std::string(argv[1]) == "child:early") {
    cpu_set_t all;
    CHECK(allowed_cpus(&all) >= 2);
    pin_to(nth_cpu(0));
    CHECK_CUDA(cudaFree(nullptr));
    CHECK(pthread_setaffinity_np(pthread_self(), sizeof all, &all) == 0);
    return child(nth_cpu(0));
  }
  preload_test::require_preloaded();
  cpu_set_t set;
  if (allowed_cpus(&set) < 2) {
    std::printf("skipped: the process may run on one CPU, where shards:auto makes one shard\n");
    return 77;
  }
  check_child("child");
  check_child("child:all");
  check_child("child:early");
  {
    const preload_test::ExitReport small =
        preload_test::run_with_exit_report("child", {"SIMCUDA_DEVICE_MEMORY=512M"});
    std::printf("small device: shards made %llu, at most %llu\n",
                static_cast<unsigned long long>(shards_figure(small.json, "shards")),
                static_cast<unsigned long long>(shards_figure(small.json, "shard_limit")));
    CHECK(shards_figure(small.json, "shard_limit") == 1);
    CHECK(shards_figure(small.json, "shards") == 1);
  }
  std::printf("ok\n");
  return 0;
}
