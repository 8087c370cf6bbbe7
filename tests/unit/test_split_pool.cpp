// Split pools (Note [Split pools] in pools/split_pool.cpp): a request served from the bottom of a
// free page too wide to take whole, the rest left for later requests, frees merged back into an
// idle page; whole takes within the exclusive pool's bound; and the budget that keeps a program
// filling the device within a 16th of what it gets without the pools.
#include <vector>

#include <doctest/doctest.h>

#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

// The size of the page `ptr` lies in, 0 when none.
std::uint64_t page_of(const Rig& rig, DevicePtr ptr) {
  for (const PageView& p : rig.manager.pages())
    if (ptr >= p.base && ptr < p.base + p.size) return p.size;
  return 0;
}

}  // namespace

TEST_CASE("a_split_pool_serves_a_small_request_from_the_bottom_of_a_wide_free_page") {
  Rig rig(custom({split(4 * GiB)}), 512, 4 * GiB, FreeFence::none);
  const DevicePtr big = rig.reserve(100 * MiB);  // a page of its own, its class: 100 MiB
  REQUIRE(big != 0);
  CHECK(page_of(rig, big) == 100 * MiB);
  REQUIRE(rig.manager.free(big) == FreeOutcome::freed);
  // 10 MiB may take at most 20 MiB whole: the idle page is split, from its bottom, and the rest
  // serves the next request. An exclusive pool would have grown two pages.
  const DevicePtr a = rig.reserve(10 * MiB);
  const DevicePtr b = rig.reserve(20 * MiB);
  CHECK(a == big);
  CHECK(b == big + 10 * MiB);
  CHECK(rig.device.outstanding_bytes() == 100 * MiB);
  CHECK(rig.manager.memory_usage().bytes_padding == 0);
  CHECK(rig.manager.check_consistency().empty());
  // Freed, the slices merge back into one idle page, which a 100 MiB request takes whole.
  REQUIRE(rig.manager.free(b) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.manager.check_consistency().empty());
  CHECK(rig.manager.report().idle_bytes == 100 * MiB);
  CHECK(rig.reserve(100 * MiB) == big);
  CHECK(rig.device.outstanding_bytes() == 100 * MiB);
  CHECK(rig.manager.report().dynamic.at(0).kind == "split");
}

TEST_CASE("a_split_pool_takes_a_free_page_whole_within_the_exclusive_bound") {
  Rig rig(custom({split(4 * GiB)}), 512, 4 * GiB, FreeFence::none);
  const DevicePtr page = rig.reserve(130 * MiB);
  REQUIRE(page != 0);
  rig.manager.free(page);
  // 110 MiB is within a quarter above its class: the page goes whole, 20 MiB of padding, no
  // free rest.
  CHECK(rig.reserve(110 * MiB) == page);
  CHECK(rig.manager.memory_usage().bytes_padding == 20 * MiB);
  CHECK(rig.manager.report().hole_bytes == 0);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a_split_pool_fills_a_hole_in_a_page_in_use_whatever_its_budget") {
  // 1 GiB device: a budget of 64 MiB. Splitting the idle 100 MiB page for 40 MiB leaves 60 MiB
  // free in a page in use; the next request is served from that rest, which frees nothing that
  // could have gone back, so it is split whatever the budget says.
  Rig rig(custom({split(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  const DevicePtr big = rig.reserve(100 * MiB);
  REQUIRE(big != 0);
  rig.manager.free(big);
  const DevicePtr a = rig.reserve(40 * MiB);
  CHECK(a == big);
  CHECK(rig.manager.report().hole_bytes == 60 * MiB);
  const DevicePtr b = rig.reserve(10 * MiB);
  CHECK(b == big + 40 * MiB);
  CHECK(rig.manager.report().hole_bytes == 50 * MiB);
  CHECK(rig.device.outstanding_bytes() == 100 * MiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a_split_pool_grows_rather_than_strand_more_than_a_16th_of_the_device") {
  // 1 GiB device, 64 MiB of budget. Splitting the idle 200 MiB page for 10 MiB would leave
  // 190 MiB that no release could return while the 10 MiB lives: the request gets a page of its
  // own instead, and the idle page goes back when the device needs it. So 900 MiB more fits, as
  // it does without the pools; had the page been split, 200 + 900 MiB would not.
  Rig rig(custom({split(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  const DevicePtr wide = rig.reserve(200 * MiB);
  REQUIRE(wide != 0);
  rig.manager.free(wide);
  const DevicePtr small = rig.reserve(10 * MiB);
  REQUIRE(small != 0);
  CHECK(small != wide);
  CHECK(page_of(rig, small) == 10 * MiB);
  CHECK(rig.manager.report().hole_bytes == 0);
  const DevicePtr large = rig.reserve(900 * MiB);
  CHECK(large != 0);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a_split_pool_releases_a_page_once_every_slice_of_it_is_free") {
  Rig rig(custom({split(4 * GiB)}), 512, 4 * GiB, FreeFence::none);
  const DevicePtr big = rig.reserve(64 * MiB);
  REQUIRE(big != 0);
  rig.manager.free(big);
  std::vector<DevicePtr> parts;
  for (int i = 0; i < 4; ++i) parts.push_back(rig.reserve(5 * MiB));
  for (int i = 0; i < 4; ++i) CHECK(parts[i] == big + static_cast<std::uint64_t>(i) * 5 * MiB);
  // A page with a slice in use stays; freed in any order, the last free makes it idle.
  rig.manager.free(parts[1]);
  rig.manager.free(parts[3]);
  rig.manager.free(parts[0]);
  rig.manager.cleanup(true);
  CHECK(rig.device.outstanding_bytes() == 64 * MiB);
  rig.manager.free(parts[2]);
  CHECK(rig.manager.check_consistency().empty());
  rig.manager.cleanup(true);
  CHECK(rig.device.outstanding_bytes() == 0);
  CHECK(rig.manager.free(parts[2]) == FreeOutcome::not_mine);
}

TEST_CASE("a_split_pool_tries_the_exact_size_when_the_class_does_not_fit") {
  // 5 MiB + 1 rounds to a 5.5 MiB page; with 5.25 MiB of device only the exact size fits.
  Rig rig(custom({split(1 * GiB)}), 512, 5 * MiB + 256 * KiB, FreeFence::none);
  const DevicePtr p = rig.reserve(5 * MiB + 1);
  REQUIRE(p != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 5 * MiB + 512);
  CHECK(rig.manager.check_consistency().empty());
}
