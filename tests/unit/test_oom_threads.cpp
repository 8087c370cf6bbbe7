// Out-of-memory recovery while another thread uses the same device (Note [Out of memory among
// threads] in pools/memory_manager.cpp). Recovery gives idle pages back and waits for them to
// reach the driver with the manager's lock released; these tests run the other thread exactly
// inside that wait, over a device whose releases reach the driver only when flushed (as the
// CUDA device's release thread does), so each interleaving is deterministic.
#include <doctest/doctest.h>

#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "pools/manager_shards.h"
#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

// A HostDevice whose releases wait in a queue until flush_releases(), which returns the pages
// queued before it began, then runs a hook once (the program's other thread, while the
// recovering thread has let go of the lock).
class QueuedReleaseDevice final : public ForwardingDevice<HostDevice> {
 public:
  explicit QueuedReleaseDevice(std::uint64_t capacity)
      : ForwardingDevice(host_), host_(capacity, 512) {}  // host_ is used only after this

  void release(DevicePtr ptr, std::uint64_t size) override {
    std::lock_guard lock(m_);
    queued_.emplace_back(ptr, size);
  }
  bool flush_releases(std::uint32_t) override {
    std::function<void()> hook;
    {
      std::lock_guard lock(m_);
      while (!queued_.empty()) {
        inner_.release(queued_.front().first, queued_.front().second);
        queued_.pop_front();
      }
      hook = std::exchange(on_flush_, nullptr);
    }
    if (hook) std::thread(hook).join();
    return true;
  }

  void on_next_flush(std::function<void()> hook) {
    std::lock_guard lock(m_);
    on_flush_ = std::move(hook);
  }
  std::uint64_t outstanding() const { return host_.outstanding_allocations(); }

 private:
  HostDevice host_;
  std::mutex m_;
  std::deque<std::pair<DevicePtr, std::uint64_t>> queued_;
  std::function<void()> on_flush_;
};

ManagerOptions exclusive_only() {
  ManagerOptions o;
  o.layout = custom({exclusive(128 * MiB)});
  o.free_fence = FreeFence::none;  // no fence to wait for: recovery rests on the pages alone
  o.log_sink = [](LogLevel, std::string_view) {};
  return o;
}

// Fills the 100 MiB device with two idle 40 MiB pages, which a 60 MiB request cannot take.
// CHECK, not REQUIRE: the hooks run it on a thread of their own.
void fill_with_idle_pages(MemoryManager& manager) {
  const DevicePtr a = manager.allocate(40 * MiB).ptr, b = manager.allocate(40 * MiB).ptr;
  CHECK(a != 0);
  CHECK(b != 0);
  manager.free(a);
  manager.free(b);
  CHECK(manager.memory_usage().bytes_reserved == 80 * MiB);
}

// Frees the one live slice, returns every page and checks that none is left on the device.
void free_everything(MemoryManager& manager, QueuedReleaseDevice& device, DevicePtr live) {
  manager.free(live);
  manager.cleanup(true);
  device.flush_releases(0);
  CHECK(device.outstanding() == 0);
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("oom_recovery_waits_for_pages_another_thread_gave_up_meanwhile") {
  QueuedReleaseDevice device(100 * MiB);
  MemoryManager manager(device, exclusive_only());
  fill_with_idle_pages(manager);
  // While this thread's trimmed pages reach the driver, the other thread takes 90 MiB, frees it
  // and trims: its page is on its way to the driver when this thread retries. Its growth first
  // waits for the recovery (Note [Growth during a recovery]); here the recovery waits for that
  // very thread, so the wait runs out and the growth goes on.
  CHECK(manager.report().oom_growth_waits == 0);
  device.on_next_flush([&] {
    const DevicePtr p = manager.allocate(90 * MiB).ptr;
    CHECK(p != 0);
    manager.free(p);
    manager.cleanup(true);
    CHECK(manager.memory_usage().bytes_reserved == 0);
  });
  const Reservation r = manager.allocate(60 * MiB);
  REQUIRE(r.ptr != 0);
  CHECK(manager.report().oom_recoveries == 1);
  CHECK(manager.report().oom_failures == 0);
  CHECK(manager.report().oom_growth_waits == 1);
  // With no recovery under way, a growth does not wait.
  const DevicePtr more = manager.allocate(20 * MiB).ptr;
  CHECK(more != 0);
  CHECK(manager.report().oom_growth_waits == 1);
  manager.free(more);
  free_everything(manager, device, r.ptr);
}

TEST_CASE("oom_recovery_returns_idle_pages_another_thread_left_meanwhile") {
  QueuedReleaseDevice device(100 * MiB);
  MemoryManager manager(device, exclusive_only());
  fill_with_idle_pages(manager);
  // While this thread's trimmed pages reach the driver, the other thread fills the device
  // again with idle pages this request cannot take.
  device.on_next_flush([&] { fill_with_idle_pages(manager); });
  const Reservation r = manager.allocate(60 * MiB);
  REQUIRE(r.ptr != 0);
  CHECK(manager.report().oom_recoveries == 1);
  CHECK(manager.memory_usage().bytes_reserved == 60 * MiB);
  free_everything(manager, device, r.ptr);
}

TEST_CASE("oom_recovery_returns_idle_pages_another_shard_left_meanwhile") {
  // Two threads in shards of their own (Note [Shards]): a's recovery asks b's shard for its idle
  // pages; while they reach the driver, b fills the device again with idle pages in its shard,
  // which a's later rounds ask for once more.
  QueuedReleaseDevice device(100 * MiB);
  ManagerOptions o = exclusive_only();
  o.shards = 2;
  MemoryManager manager(device, o);
  Worker a, b;
  for (std::uint32_t turn = 0; turn < kShardSettle + 8; ++turn) {  // taking turns, they part
    a.run([&] { manager.free(manager.allocate(KiB).ptr); });
    b.run([&] { manager.free(manager.allocate(KiB).ptr); });
  }
  REQUIRE(manager.report().shards == 2);
  manager.cleanup(true);
  device.flush_releases(0);
  b.run([&] { fill_with_idle_pages(manager); });
  device.on_next_flush([&] { b.run([&] { fill_with_idle_pages(manager); }); });
  Reservation r;
  a.run([&] { r = manager.allocate(60 * MiB); });
  REQUIRE(r.ptr != 0);
  CHECK(manager.report().oom_failures == 0);
  CHECK(manager.memory_usage().bytes_reserved == 60 * MiB);
  free_everything(manager, device, r.ptr);
}

TEST_CASE("oom_recovery_fails_when_the_memory_is_really_in_use") {
  // The extra rounds need another thread's progress: memory held live fails as before.
  QueuedReleaseDevice device(100 * MiB);
  MemoryManager manager(device, exclusive_only());
  const DevicePtr held = manager.allocate(80 * MiB).ptr;
  REQUIRE(held != 0);
  const Reservation r = manager.allocate(60 * MiB);
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::out_of_memory, 60 * MiB});
  CHECK(manager.report().oom_failures == 1);
  manager.free(held);
}

TEST_CASE("oom_recovery_does_not_spin_on_a_neighbour_that_always_has_pages_on_their_way") {
  // Another user of the device always has 2 MiB on its way to the driver: every flush returns
  // (what was queued before it arrived), yet the bytes on their way never reach 0. A request
  // the device cannot serve gives up after a bounded number of flushes, not at the time bound
  // after millions of them.
  class Neighbour final : public ForwardingDevice<HostDevice> {
   public:
    Neighbour() : ForwardingDevice(host_), host_(100 * MiB, 512) {}
    bool flush_releases(std::uint32_t) override {
      ++flushes;
      return true;
    }
    std::uint64_t releasing_bytes() override { return 2 * MiB; }
    int flushes = 0;

   private:
    HostDevice host_;
  } device;
  ManagerOptions options = exclusive_only();
  options.shards = 1;
  MemoryManager manager(device, options);
  const DevicePtr live = manager.allocate(90 * MiB).ptr;
  REQUIRE(live != 0);
  // 10 MiB free and 2 MiB on their way: within reach, so recovery runs, and then fails.
  const Reservation r = manager.allocate(11 * MiB);
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::out_of_memory, 11 * MiB});
  CHECK(device.flushes <= 40);  // a few dozen; the time bound allowed millions
  manager.free(live);
}

}  // TEST_SUITE
