// Preload test 4: eight threads, each making 100,000 operations (allocations and frees) of
// mixed sizes. Every buffer is tagged with its owner's byte when allocated and verified before
// it is freed; a shared interval map proves no two live buffers ever overlap. At the end every
// buffer is freed, and (on the stand-in) the driver saw only a small number of allocations.
// The operation count per thread can be lowered with the first argument for slow builds.
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "check.h"

namespace {

std::mutex g_live_mutex;
std::map<std::uintptr_t, std::uintptr_t> g_live;  // begin -> end of every live buffer

void claim(void* ptr, std::size_t size) {
  auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  auto end = begin + size;
  std::lock_guard<std::mutex> hold(g_live_mutex);
  auto next = g_live.lower_bound(begin);
  CHECK_MSG(next == g_live.end() || next->first >= end, "overlaps the next live buffer");
  if (next != g_live.begin()) CHECK_MSG(std::prev(next)->second <= begin, "overlaps the previous");
  g_live.emplace(begin, end);
}

void unclaim(void* ptr) {
  std::lock_guard<std::mutex> hold(g_live_mutex);
  CHECK(g_live.erase(reinterpret_cast<std::uintptr_t>(ptr)) == 1);
}

struct Buffer {
  void* ptr = nullptr;
  std::size_t size = 0;
};

// The tag covers a buffer's first bytes: filling and copying every byte would measure the
// stand-in's memset and memcpy, not the pools. Overlap anywhere in a buffer is caught by the
// interval map; the tag catches a pool handing out memory another thread still writes.
constexpr std::size_t kProbe = 64;

bool tagged(const Buffer& buffer, unsigned char tag) {
  return preload_test::device_bytes_equal(buffer.ptr, buffer.size < kProbe ? buffer.size : kProbe,
                                          tag);
}

void tag_buffer(const Buffer& buffer, unsigned char tag) {
  // Asynchronous on the legacy stream: later copies are ordered after it, and a free while it
  // is still queued is exactly what free fences are for.
  CHECK_CUDA(cudaMemsetAsync(buffer.ptr, tag, buffer.size < kProbe ? buffer.size : kProbe, 0));
}

std::atomic<std::uint64_t> g_operations{0};

void worker(int id, int operations) {
  std::mt19937_64 random(0x9e3779b97f4a7c15ull * static_cast<unsigned>(id + 1));
  const auto tag = static_cast<unsigned char>(0xa0 + id);
  std::vector<Buffer> live;
  for (int op = 0; op < operations; ++op) {
    bool allocate = live.empty() || (live.size() < 48 && random() % 2 == 0);
    if (allocate) {
      // Mostly small, sometimes up to a few MiB: several pools get traffic.
      std::size_t size = random() % 8 == 0 ? 1 + random() % (4 << 20) : 1 + random() % 65536;
      Buffer buffer;
      buffer.size = size;
      CHECK_CUDA(cudaMalloc(&buffer.ptr, size));
      CHECK(reinterpret_cast<std::uintptr_t>(buffer.ptr) % 256 == 0);
      claim(buffer.ptr, size);
      tag_buffer(buffer, tag);
      live.push_back(buffer);
    } else {
      std::size_t index = random() % live.size();
      Buffer buffer = live[index];
      live[index] = live.back();
      live.pop_back();
      if (op % 4 == 0) CHECK_MSG(tagged(buffer, tag), "buffer of thread " + std::to_string(id));
      unclaim(buffer.ptr);
      CHECK_CUDA(cudaFree(buffer.ptr));
    }
    g_operations.fetch_add(1, std::memory_order_relaxed);
  }
  for (const Buffer& buffer : live) {
    CHECK(tagged(buffer, tag));
    unclaim(buffer.ptr);
    CHECK_CUDA(cudaFree(buffer.ptr));
  }
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const int operations = argc > 1 ? std::atoi(argv[1]) : 100000;
  CHECK(operations > 0);
  CHECK_CUDA(cudaFree(nullptr));
  const bool counted = preload_test::on_stand_in();
  std::uint64_t mallocs_before = counted ? preload_test::counter("cudaMalloc") : 0;

  std::vector<std::thread> threads;
  for (int id = 0; id < 8; ++id) threads.emplace_back(worker, id, operations);
  for (auto& thread : threads) thread.join();

  CHECK(g_live.empty());
  CHECK(g_operations.load() == 8ull * static_cast<std::uint64_t>(operations));
  CHECK_CUDA(cudaGetLastError());
  if (counted) {
    std::uint64_t made = preload_test::counter("cudaMalloc") - mallocs_before;
    // Pooling: a few pages per pool, never one driver call per allocation.
    CHECK_MSG(made * 100 < g_operations.load(), std::to_string(made) + " driver allocations");
    // The pools hold their pages (no leak beyond what they reserved) and nothing else is live.
    std::printf("driver allocations: %llu, live after all frees: %llu\n",
                static_cast<unsigned long long>(made),
                static_cast<unsigned long long>(preload_test::counter("live_allocations")));
    CHECK(preload_test::counter("live_allocations") <= made);
  }
  std::printf("ok: %llu operations on 8 threads\n",
              static_cast<unsigned long long>(g_operations.load()));
  return 0;
}
