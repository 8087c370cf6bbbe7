// Preload test: thread caches through the library (docs/pools.md, "Thread caches"). Four
// threads allocate and free a few recurring sizes, small and large, on the legacy stream (so
// the device is ordered and the caches serve), hand every seventh buffer to the next thread to
// free, and free some pointers twice. Each buffer carries its owner's tag, checked before every
// free, and a shared interval map proves no two live buffers overlap; a second phase of new
// threads adopts the caches the first phase left. First, cudaMemGetInfo must count a parked
// buffer's page as free. The parent runs this twice as a child: with caches (the exit report
// must show requests they served) and with thread_cache:off (none).
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

// The last is an exclusive page of its own, at most a 64th of the 1 GiB device: cached too.
constexpr std::size_t kSizes[] = {4096, 65536, 200000, 12 << 20};
constexpr std::size_t kSizeCount = sizeof kSizes / sizeof kSizes[0];
constexpr std::size_t kProbe = 64;  // the tagged prefix of each buffer

struct Owned {
  void* ptr = nullptr;
  unsigned char tag = 0;
};

std::mutex g_mutex;
std::map<std::uintptr_t, std::uintptr_t> g_live;  // begin -> end of every live buffer
std::deque<Owned> g_handoff;                      // allocated by one thread, freed by another
// A double free is only a double free while no other thread can have been given the address
// again: allocations hold this shared, a free followed by its double free holds it exclusive.
std::shared_mutex g_allocating;

void claim(void* ptr, std::size_t size) {
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> hold(g_mutex);
  auto next = g_live.lower_bound(begin);
  CHECK_MSG(next == g_live.end() || next->first >= begin + size, "overlaps a live buffer");
  CHECK_MSG(next == g_live.begin() || std::prev(next)->second <= begin, "overlaps a live buffer");
  g_live.emplace(begin, begin + size);
}

void release(const Owned& owned) {
  CHECK_MSG(preload_test::device_bytes_equal(owned.ptr, kProbe, owned.tag),
            "a buffer lost its owner's bytes");
  {
    std::lock_guard<std::mutex> hold(g_mutex);
    CHECK(g_live.erase(reinterpret_cast<std::uintptr_t>(owned.ptr)) == 1);
  }
  CHECK_CUDA(cudaFree(owned.ptr));
}

void worker(int id, int rounds) {
  const auto tag = static_cast<unsigned char>(0x40 + id);
  for (int i = 0; i < rounds; ++i) {
    const std::size_t size = kSizes[static_cast<std::size_t>(i + id) % kSizeCount];
    Owned mine{nullptr, tag};
    {
      std::shared_lock<std::shared_mutex> allocating(g_allocating);
      CHECK_CUDA(cudaMalloc(&mine.ptr, size));
    }
    claim(mine.ptr, size);
    CHECK_CUDA(cudaMemsetAsync(mine.ptr, tag, kProbe, 0));
    if (i % 7 == 0) {
      std::lock_guard<std::mutex> hold(g_mutex);
      g_handoff.push_back(mine);
    } else if (i % 13 == 0) {  // a double free changes nothing, parked slice or not
      std::unique_lock<std::shared_mutex> alone(g_allocating);
      release(mine);
      CHECK_RESULT(cudaFree(mine.ptr), cudaErrorInvalidValue);
      CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidValue);
    } else {
      release(mine);
    }
    Owned theirs;
    {
      std::lock_guard<std::mutex> hold(g_mutex);
      if (i % 2 == 0 && !g_handoff.empty()) {
        theirs = g_handoff.front();
        g_handoff.pop_front();
      }
    }
    if (theirs.ptr != nullptr) release(theirs);
  }
}

void run_phase(int threads, int first_id, int rounds) {
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) running.emplace_back(worker, first_id + t, rounds);
  for (std::thread& thread : running) thread.join();
}

// The count on the report's "thread caches: caches N, parked B, reused N" line. (Not
// std::regex: GCC 12's regex does not build under -fsanitize=address with -Werror.)
std::uint64_t reused(const std::string& report) {
  const std::size_t line = report.find("thread caches: caches ");
  const std::size_t at = line == std::string::npos ? line : report.find(", reused ", line);
  CHECK_MSG(at != std::string::npos, "no thread caches line in:\n" + report);
  return std::stoull(report.substr(at + std::strlen(", reused ")));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") {
    preload_test::require_preloaded();
    CHECK_CUDA(cudaFree(nullptr));
    // A page that only a parked buffer keeps is free memory to cudaMemGetInfo, as the idle page
    // it would be without the cache.
    std::size_t free_before = 0;
    std::size_t total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
    for (int i = 0; i < 3; ++i) {
      void* big = nullptr;
      CHECK_CUDA(cudaMalloc(&big, kSizes[kSizeCount - 1]));
      CHECK_CUDA(cudaFree(big));
    }
    std::size_t free_parked = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_parked, &total));
    CHECK_MSG(free_parked == free_before, "cudaMemGetInfo: " + std::to_string(free_before) +
                                              " B free before, " + std::to_string(free_parked) +
                                              " B with the buffer freed");
    run_phase(4, 0, 3000);
    run_phase(2, 4, 1000);  // new threads adopt the caches the first four left
    for (const Owned& owned : g_handoff) release(owned);
    CHECK(g_live.empty());
    CHECK_CUDA(cudaGetLastError());
    std::printf("child ok\n");
    return 0;
  }
  const preload_test::ChildResult cached =
      preload_test::run_self("child", {"POOLCUDA_CONF=report_at_exit:1"}, 120);
  CHECK_MSG(cached.status == 0 && cached.output.find("child ok") != std::string::npos,
            "with thread caches:\n" + cached.output);
  CHECK_MSG(reused(cached.output) > 1000, "few requests came from thread caches:\n" +
                                              cached.output);
  const preload_test::ChildResult plain =
      preload_test::run_self("child", {"POOLCUDA_CONF=report_at_exit:1,thread_cache:off"}, 120);
  CHECK_MSG(plain.status == 0 && plain.output.find("child ok") != std::string::npos,
            "with thread_cache:off:\n" + plain.output);
  CHECK_MSG(reused(plain.output) == 0, "thread_cache:off still reused:\n" + plain.output);
  std::printf("ok: thread caches reused %llu requests\n",
              static_cast<unsigned long long>(reused(cached.output)));
  return 0;
}
