// Split pools (Note [Split pools] in pools/split_pool.cpp): a request served from the bottom of a
// free page too wide to take whole, the rest left for later requests, frees merged back into an
// idle page; whole takes within the exclusive pool's bound; and the budget of split pages that
// keeps a program filling the device within a 16th of what it gets without the pools.
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

TEST_CASE("a_split_pool_fills_holes_in_split_pages_and_splits_no_more_pages_than_its_budget") {
  // 1 GiB device: a budget of 64 MiB of pages that may stay reserved for a small allocation.
  Rig rig(custom({split(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  const DevicePtr first = rig.reserve(60 * MiB);
  const DevicePtr second = rig.reserve(60 * MiB);
  REQUIRE((first != 0 && second != 0));
  rig.manager.free(second);
  rig.manager.free(first);  // the most recently freed page serves first
  // Splitting one 60 MiB page fits the budget.
  const DevicePtr a = rig.reserve(10 * MiB);
  CHECK(a == first);
  CHECK(rig.manager.report().hole_bytes == 50 * MiB);
  // The rest of a split page is used before anything else, whatever the budget says: using it
  // holds back nothing more.
  const DevicePtr b = rig.reserve(20 * MiB);
  CHECK(b == first + 10 * MiB);
  CHECK(rig.reserve(30 * MiB) == first + 30 * MiB);  // the last of the rest, whole
  // Splitting the other idle page would take the split pages to 120 MiB: 5 MiB gets a page of
  // its own.
  const DevicePtr c = rig.reserve(5 * MiB);
  CHECK(c != 0);
  CHECK(page_of(rig, c) == 5 * MiB);
  CHECK(rig.device.outstanding_bytes() == 125 * MiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a_split_pool_never_strands_more_than_its_budget_after_the_large_allocations_go") {
  // Fifteen idle 60 MiB pages on a 1 GiB device. Each round splits one for a 4 MiB allocation
  // and gives its 56 MiB rest to a large one; then every large one is freed. A split page stays
  // reserved as long as its small allocation lives, so only as many pages as the 64 MiB budget
  // holds may be split: the others' rounds get pages of their own, which go back when freed.
  // So 800 MiB still fits beside the 60 MiB left live, as it does without the pools.
  Rig rig(custom({split(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  std::vector<DevicePtr> pages;
  for (int i = 0; i < 15; ++i) pages.push_back(rig.reserve(60 * MiB));
  for (DevicePtr p : pages) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  std::vector<DevicePtr> large;
  for (int i = 0; i < 15; ++i) {
    REQUIRE(rig.reserve(4 * MiB) != 0);
    large.push_back(rig.reserve(56 * MiB));
    REQUIRE(large.back() != 0);
  }
  for (DevicePtr p : large) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  CHECK(rig.manager.report().hole_bytes <= 64 * MiB);
  CHECK(rig.reserve(800 * MiB) != 0);
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

TEST_CASE("a_split_page_freed_whole_no_longer_counts_against_the_budget") {
  // 1 GiB device, 64 MiB of budget: one 60 MiB page split at a time. Each round splits the page
  // again once the last round's allocations are all freed.
  Rig rig(custom({split(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  const DevicePtr page = rig.reserve(60 * MiB);
  REQUIRE(page != 0);
  rig.manager.free(page);
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    const DevicePtr a = rig.reserve(10 * MiB);
    const DevicePtr b = rig.reserve(10 * MiB);
    CHECK(a == page);
    CHECK(b == page + 10 * MiB);
    rig.manager.free(a);
    rig.manager.free(b);
    CHECK(rig.manager.check_consistency().empty());
  }
  CHECK(rig.device.outstanding_bytes() == 60 * MiB);
}

TEST_CASE("a_split_pool_tries_the_exact_size_when_the_class_does_not_fit") {
  // 5 MiB + 1 rounds to a 5.5 MiB page; with 5.25 MiB of device only the exact size fits.
  Rig rig(custom({split(1 * GiB)}), 512, 5 * MiB + 256 * KiB, FreeFence::none);
  const DevicePtr p = rig.reserve(5 * MiB + 1);
  REQUIRE(p != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 5 * MiB + 512);
  CHECK(rig.manager.check_consistency().empty());
}
