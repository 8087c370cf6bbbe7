// Preload test: shards:auto counts the CPUs the process may run on, not those of the thread that
// happens to make the device's first allocation. A program whose first cudaMalloc comes from a
// thread pinned to one CPU (a pinned data-loading thread) must still let its other threads
// spread over shards. A child allocates first on a pinned thread, then two
// threads take turns allocating, so that every allocation of each finds one of the other's
// before it: one of them must move to a shard of its own. The exit report shows both the shards
// made and the most the device may make.
#include <pthread.h>
#include <sched.h>

#include <atomic>
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

int child() {
  std::thread pinned([] {
    cpu_set_t set;
    CHECK(allowed_cpus(&set) >= 1);
    int first = 0;
    while (!CPU_ISSET(first, &set)) ++first;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    CHECK(pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0);
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, kSize));  // the device's pools are made on this thread
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

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  preload_test::require_preloaded();
  cpu_set_t set;
  if (allowed_cpus(&set) < 2) {
    std::printf("skipped: the process may run on one CPU, where shards:auto makes one shard\n");
    return 77;
  }
  const preload_test::ExitReport report = preload_test::run_with_exit_report("child");
  const std::uint64_t made = shards_figure(report.json, "shards");
  const std::uint64_t limit = shards_figure(report.json, "shard_limit");
  std::printf("shards made: %llu, at most %llu\n", static_cast<unsigned long long>(made),
              static_cast<unsigned long long>(limit));
  CHECK(limit >= 2);  // the CPUs the process may run on, not the pinned thread's one
  CHECK(made >= 2);
  std::printf("ok\n");
  return 0;
}
