// Wider pages (Note [Wider pages] in pools/sliced_pool.cpp): a sliced pool that holds many pages
// grows by pages of several configured pages at once, within the held bound, the budget, a 64th
// of the device and a quarter of it held; a small program keeps one page; a cap or fence-pending
// memory keeps the configured page; and a driver that refuses a wide page (asked for as one the
// pool can do without) is asked for one configured page.
#include <doctest/doctest.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "pools/forwarding_device.h"
#include "pools/host_device.h"
#include "pools/memory_manager.h"
#include "tests/unit/pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

// A device whose budget leaves `room` bytes for the next growth.
class RoomDevice final : public ForwardingDevice<HostDevice> {
 public:
  using ForwardingDevice::ForwardingDevice;
  std::uint64_t growth_room() override { return room; }
  std::uint64_t room = kNoGrowthLimit;
};

ManagerOptions wide_options(const PoolLayout& layout, std::uint32_t hold_percent = 0,
                            FreeFence fence = FreeFence::none) {
  ManagerOptions o;
  o.layout = layout;
  o.free_fence = fence;
  o.hold_percent = hold_percent;
  o.prompt_fence_nanos = std::uint64_t{1} << 63;
  o.log = LogLevel::off;
  return o;
}

// The sizes of the pages that hold `firsts`, in that order: the pages in the order the growths
// made them, when `firsts` are the allocations that grew (HostDevice's addresses need not
// ascend).
std::vector<std::uint64_t> page_sizes_in_order(const MemoryManager& manager,
                                               const std::vector<DevicePtr>& firsts) {
  std::vector<std::uint64_t> sizes;
  const std::vector<PageView> pages = manager.pages();
  for (const DevicePtr p : firsts) {
    for (const PageView& page : pages) {
      if (p >= page.base && p < page.base + page.size) {
        sizes.push_back(page.size);
        break;
      }
    }
  }
  return sizes;
}

// Page sizes in runs: {count, size} for each run, in order.
std::vector<std::uint64_t> runs(std::initializer_list<std::pair<int, std::uint64_t>> list) {
  std::vector<std::uint64_t> sizes;
  for (const auto& [count, size] : list) sizes.insert(sizes.end(), count, size);
  return sizes;
}

// Fills a pool of 2 MiB pages with 512 KiB slices, four a page, until `bytes` are in use; returns
// the slices, and in *firsts the first slice of each page the growths made.
std::vector<DevicePtr> fill(MemoryManager& manager, HostDevice& device, std::uint64_t bytes,
                            std::vector<DevicePtr>* firsts = nullptr) {
  std::vector<DevicePtr> live;
  for (std::uint64_t used = 0; used < bytes; used += 512 * KiB) {
    const std::uint64_t allocs = device.calls().allocate;
    const DevicePtr p = manager.allocate(512 * KiB).ptr;
    REQUIRE(p != 0);
    if (firsts != nullptr && device.calls().allocate != allocs) firsts->push_back(p);
    live.push_back(p);
  }
  return live;
}

void free_all(MemoryManager& manager, const std::vector<DevicePtr>& live) {
  for (const DevicePtr p : live) CHECK(manager.free(p) == FreeOutcome::freed);
  CHECK(manager.check_consistency().empty());
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("a sliced pool's pages widen as it grows, to eight configured pages at most") {
  HostDevice device(16 * GiB, 512);
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)})));
  std::vector<DevicePtr> firsts;
  const std::vector<DevicePtr> live = fill(manager, device, 160 * MiB, &firsts);
  // Eight 2 MiB pages, then 4 MiB ones until 32 MiB are held, 8 MiB ones until 64 MiB, then
  // 16 MiB ones: 160 MiB in 8 + 4 + 4 + 6 driver calls instead of 80.
  CHECK(page_sizes_in_order(manager, firsts) ==
        runs({{8, 2 * MiB}, {4, 4 * MiB}, {4, 8 * MiB}, {6, 16 * MiB}}));
  CHECK(device.calls().allocate == 22);
  CHECK(manager.memory_usage().bytes_reserved == 160 * MiB);
  // The report says so beside the configured page.
  const PoolReport pool = manager.report().dynamic[0];
  CHECK(pool.page_size == 2 * MiB);
  CHECK(pool.notes == "pages widened up to 16MiB");
  free_all(manager, live);
}

TEST_CASE("a small program keeps one page") {
  HostDevice device(16 * GiB, 512);
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)})));
  for (int i = 0; i < 10000; ++i) {
    const DevicePtr p = manager.allocate(64 * KiB).ptr;
    REQUIRE(p != 0);
    REQUIRE(manager.free(p) == FreeOutcome::freed);
  }
  CHECK(device.calls().allocate == 1);
  CHECK(manager.memory_usage().bytes_reserved == 2 * MiB);
  CHECK(manager.report().dynamic[0].notes.empty());
}

TEST_CASE("a page is never wider than a 64th of the device") {
  HostDevice device(512 * MiB, 512);  // 8 MiB pages at most
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)})));
  const std::vector<DevicePtr> live = fill(manager, device, 100 * MiB);
  for (const PageView& page : manager.pages()) CHECK(page.size <= 8 * MiB);
  CHECK(device.calls().allocate == 8 + 4 + 9);  // 2 MiB, 4 MiB, then 8 MiB pages
  free_all(manager, live);
}

TEST_CASE("pages widen only while the pools hold less than a quarter of the device") {
  HostDevice device(1 * GiB, 512);  // 16 MiB pages at most
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)})));
  std::vector<DevicePtr> firsts;
  const std::vector<DevicePtr> live = fill(manager, device, 300 * MiB, &firsts);
  // 8 + 4 + 4 pages make 64 MiB, then 12 of 16 MiB make 256 MiB, a quarter of the device; the
  // rest are 2 MiB pages, as without wider pages.
  CHECK(page_sizes_in_order(manager, firsts) ==
        runs({{8, 2 * MiB}, {4, 4 * MiB}, {4, 8 * MiB}, {12, 16 * MiB}, {22, 2 * MiB}}));
  free_all(manager, live);
}

TEST_CASE("a capped pool keeps its configured page") {
  HostDevice device(16 * GiB, 512);
  MemoryManager manager(device,
                        wide_options(custom({sliced(2 * MiB, 512 * KiB, 256 * MiB)})));
  const std::vector<DevicePtr> live = fill(manager, device, 64 * MiB);
  for (const PageView& page : manager.pages()) CHECK(page.size == 2 * MiB);
  free_all(manager, live);
}

TEST_CASE("the budget's room narrows a wide page, never below one configured page") {
  HostDevice host(16 * GiB, 512);
  RoomDevice device(host);
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)})));
  std::vector<DevicePtr> live = fill(manager, host, 64 * MiB);  // the next page would be 16 MiB
  device.room = 5 * MiB;
  live.push_back(manager.allocate(512 * KiB).ptr);
  REQUIRE(live.back() != 0);
  CHECK(manager.memory_usage().bytes_reserved == 64 * MiB + 4 * MiB);
  // Less room than one page: the growth asks for one page, and the budget decides.
  for (int i = 0; i < 7; ++i) live.push_back(manager.allocate(512 * KiB).ptr);
  device.room = 1 * MiB;
  live.push_back(manager.allocate(512 * KiB).ptr);
  REQUIRE(live.back() != 0);
  CHECK(manager.memory_usage().bytes_reserved == 64 * MiB + 4 * MiB + 2 * MiB);
  free_all(manager, live);
}

TEST_CASE("the held bound's room narrows a wide page") {
  HostDevice device(16 * GiB, 512);
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB),
                                                     exclusive(GiB, 100000)}),
                                             150));
  std::vector<DevicePtr> live = fill(manager, device, 64 * MiB);  // the next page: 16 MiB
  // Two buffers in use for a moment, each then idle in an exclusive page of its own: 108 MiB
  // was the most in use, so the bound is 162 MiB, and 148 MiB are held.
  for (const std::uint64_t size : {40 * MiB, 44 * MiB}) {
    const DevicePtr scratch = manager.allocate(size).ptr;
    REQUIRE(scratch != 0);
    REQUIRE(manager.free(scratch) == FreeOutcome::freed);
  }
  REQUIRE(manager.memory_usage().bytes_reserved == 148 * MiB);
  // 14 MiB of room: the page narrows to 8 MiB, and no idle page goes back for it.
  live.push_back(manager.allocate(512 * KiB).ptr);
  REQUIRE(live.back() != 0);
  CHECK(manager.memory_usage().bytes_reserved == 148 * MiB + 8 * MiB);
  CHECK(manager.report().held_released_bytes == 0);
  free_all(manager, live);
}

// Which pages were asked for as ones the pools can do without (Device::allocate_if_room).
class AskingDevice final : public ForwardingDevice<HostDevice> {
 public:
  using ForwardingDevice::ForwardingDevice;
  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override {
    needed.push_back(size);
    return inner_.allocate(size, out);
  }
  AllocStatus allocate_if_room(std::uint64_t size, DevicePtr* out) override {
    optional.push_back(size);
    return inner_.allocate(size, out);
  }
  std::vector<std::uint64_t> needed, optional;
};

TEST_CASE("a driver that refuses the wide page is asked for one configured page") {
  HostDevice host(16 * GiB, 512);
  AskingDevice device(host);
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)})));
  std::vector<DevicePtr> live = fill(manager, host, 64 * MiB);  // the next page: 16 MiB
  host.set_capacity(64 * MiB + 3 * MiB);
  device.needed.clear();
  device.optional.clear();
  const DevicePtr p = manager.allocate(512 * KiB).ptr;
  CHECK(p != 0);
  live.push_back(p);
  CHECK(manager.memory_usage().bytes_reserved == 66 * MiB);
  CHECK(manager.report().oom_failures == 0);
  CHECK(manager.report().oom_recoveries == 0);
  // The wide page was one the pool could do without (a budget does not count its refusal); the
  // configured page was needed.
  CHECK(device.optional == std::vector<std::uint64_t>{16 * MiB});
  CHECK(device.needed == std::vector<std::uint64_t>{2 * MiB});
  free_all(manager, live);
}

TEST_CASE("a page rounded to its size class is one the pools can do without; the exact size is "
          "needed") {
  // 5 MiB + 1 rounds to a 5.5 MiB page; with 5.25 MiB of device only the exact size fits.
  for (const PoolSpec& tail : {exclusive(1 * GiB), split(1 * GiB)}) {
    CAPTURE(static_cast<int>(tail.kind));
    HostDevice host(5 * MiB + 256 * KiB, 512);
    AskingDevice device(host);
    MemoryManager manager(device, wide_options(custom({tail})));
    const DevicePtr p = manager.allocate(5 * MiB + 1).ptr;
    REQUIRE(p != 0);
    CHECK(device.optional == std::vector<std::uint64_t>{5 * MiB + 512 * KiB});
    CHECK(device.needed == std::vector<std::uint64_t>{5 * MiB + 512});
    CHECK(manager.free(p) == FreeOutcome::freed);
  }
}

TEST_CASE("fence-pending memory in the pool keeps its pages narrow") {
  HostDevice device(16 * GiB, 512);
  device.set_fence_mode(HostDevice::FenceMode::manual);
  MemoryManager manager(device, wide_options(custom({sliced(2 * MiB, 512 * KiB)}), 0,
                                             FreeFence::events));
  std::vector<DevicePtr> live = fill(manager, device, 64 * MiB);
  // A freed slice waits for its fence, which never passes here: the growth takes one page.
  REQUIRE(manager.free(live.back()) == FreeOutcome::freed);
  live.pop_back();
  REQUIRE(manager.report().pending_fence_bytes != 0);
  std::vector<DevicePtr> firsts;
  std::vector<DevicePtr> more = fill(manager, device, 1 * MiB, &firsts);
  CHECK(page_sizes_in_order(manager, firsts) == std::vector<std::uint64_t>{2 * MiB});
  live.insert(live.end(), more.begin(), more.end());
  device.complete_fences();
  free_all(manager, live);
}

}  // TEST_SUITE
