// Helpers shared by the pools unit tests: pool specs in one line, a manager over a
// HostDevice whose log lines are captured for assertions, and a thread that runs jobs on call.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "pools/forwarding_device.h"
#include "pools/host_device.h"
#include "pools/memory_manager.h"

namespace poolcuda::test {

inline PoolSpec sliced(std::uint64_t page, std::uint64_t slice = 0,
                       std::optional<std::uint64_t> cap = std::nullopt,
                       std::optional<std::uint64_t> period = std::nullopt) {
  PoolSpec spec;
  spec.kind = PoolKind::sliced;
  spec.page_size = page;
  spec.max_slice_size = slice;
  spec.cap = cap;
  spec.dealloc_period = period;
  return spec;
}

inline PoolSpec exclusive(std::uint64_t max, std::optional<std::uint64_t> period = std::nullopt) {
  PoolSpec spec;
  spec.kind = PoolKind::exclusive;
  spec.max_alloc_size = max;
  spec.dealloc_period = period;
  return spec;
}

inline PoolSpec split(std::uint64_t max, std::optional<std::uint64_t> period = std::nullopt) {
  PoolSpec spec = exclusive(max, period);
  spec.kind = PoolKind::split;
  return spec;
}

inline PoolSpec direct(std::uint64_t reclaim_at) {
  PoolSpec spec;
  spec.kind = PoolKind::direct;
  spec.reclaim_at = reclaim_at;
  return spec;
}

inline PoolLayout custom(std::vector<PoolSpec> specs) {
  PoolLayout layout;
  layout.preset = PoolPreset::custom;
  layout.custom = std::move(specs);
  return layout;
}

inline PoolLayout preset(PoolPreset which) {
  PoolLayout layout;
  layout.preset = which;
  return layout;
}

// A HostDevice whose released pages stay allocated until a flush lets them through, as pages
// on their way to the driver on the release thread do. Each flush asks arrive() whether they
// reach the driver now; the default says yes.
class HeldReleases : public ForwardingDevice<HostDevice> {
 public:
  using ForwardingDevice::ForwardingDevice;
  void release(DevicePtr ptr, std::uint64_t size) override {
    held_.push_back({ptr, size});
    held_bytes_ += size;
  }
  bool flush_releases(std::uint32_t max_microseconds) override {
    ++flushes;
    if (!arrive(max_microseconds)) return held_.empty();
    deliver();
    return true;
  }
  std::uint64_t releasing_bytes() override { return held_bytes_; }
  void deliver() {  // every held page reaches the driver
    while (!held_.empty()) deliver_oldest();
  }
  int flushes = 0;
  int delivered = 0;  // pages that reached the driver

 protected:
  virtual bool arrive(std::uint32_t /*max_microseconds*/) { return true; }
  void deliver_oldest() {
    const auto [ptr, size] = held_.front();
    held_.erase(held_.begin());
    inner_.release(ptr, size);
    held_bytes_ -= size;
    ++delivered;
  }

 private:
  std::vector<std::pair<DevicePtr, std::uint64_t>> held_;
  std::uint64_t held_bytes_ = 0;
};

struct LogLine {
  LogLevel level;
  std::string text;
};

// A HostDevice and a manager on it; `logs` collects every line the manager writes. Its epochs
// close by count, bytes and misses only: tests count fences, and a free must not record one
// because a slow run (a sanitizer build, a loaded machine) let a millisecond pass.
struct Rig {
  explicit Rig(const PoolLayout& layout, std::uint64_t alignment = 32,
               std::uint64_t capacity = 128 * MiB, FreeFence fence = FreeFence::events,
               PersistentMode persistent = PersistentMode::enabled, bool thread_cache = false)
      : device(capacity, alignment),
        manager(device, make_options(layout, fence, persistent, thread_cache)) {}

  ManagerOptions make_options(const PoolLayout& layout, FreeFence fence,
                              PersistentMode persistent, bool thread_cache) {
    ManagerOptions o;
    o.thread_cache = thread_cache;
    o.layout = layout;
    o.free_fence = fence;
    o.persistent = persistent;
    o.prompt_fence_nanos = std::uint64_t{1} << 63;
    o.log_sink = [this](LogLevel level, std::string_view text) {
      logs.push_back(LogLine{level, std::string(text)});
    };
    return o;
  }

  DevicePtr reserve(std::uint64_t size) {
    const Reservation r = manager.allocate(size);
    return r.ptr;
  }

  std::size_t count_logs(std::string_view needle) const {
    std::size_t n = 0;
    for (const LogLine& line : logs) n += line.text.find(needle) != std::string::npos;
    return n;
  }

  std::vector<LogLine> logs;
  HostDevice device;
  MemoryManager manager;
};

// A thread that runs the jobs it is given, one at a time, while the caller waits: the same
// thread each time, so that it keeps its shard (Note [Shards]).
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    run([this] { stop_ = true; });
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void run(std::function<void()> job) {
    std::unique_lock lock(mutex_);
    job_ = std::move(job);
    changed_.notify_all();
    changed_.wait(lock, [this] { return !job_; });
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      changed_.wait(lock, [this] { return static_cast<bool>(job_); });
      job_();
      job_ = nullptr;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool stop_ = false;
  std::thread thread_;
};

// A 6 MiB page allocated and freed: a pool that reuses frees at once keeps it idle, an 8 MiB
// device nearly full.
inline void leave_an_idle_page(MemoryManager& manager) {
  const DevicePtr big = manager.allocate(6 * MiB).ptr;
  REQUIRE(big != 0);
  REQUIRE(manager.free(big) == FreeOutcome::freed);
}

}  // namespace poolcuda::test
