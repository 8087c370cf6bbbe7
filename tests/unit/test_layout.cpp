// Layout resolution: the subslices and exclusive presets for several device sizes, and the
// normalisation of custom lists (alignment, defaults), from a PoolLayout and from a parsed
// POOLCUDA_CONF value.
#include <doctest/doctest.h>

#include "config/config.h"
#include "pools/layout.h"
#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

namespace {

std::vector<std::uint64_t> sliced_pages(const std::vector<PoolSpec>& pools) {
  std::vector<std::uint64_t> pages;
  for (const PoolSpec& p : pools)
    if (p.kind == PoolKind::sliced) pages.push_back(p.page_size);
  return pages;
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("resolve_subslices_ladder_for_16_and_80_GiB") {
  const auto small = resolve_layout(preset(PoolPreset::subslices), 16 * GiB, 512);
  CHECK(sliced_pages(small) == std::vector<std::uint64_t>{2 * MiB, 8 * MiB});
  for (const PoolSpec& p : small)
    if (p.kind == PoolKind::sliced) CHECK(p.max_slice_size == p.page_size / 4);
  REQUIRE(small.back().kind == PoolKind::exclusive);
  CHECK(small.back().max_alloc_size == 16 * GiB);
  CHECK(small.back().dealloc_period == std::optional<std::uint64_t>(10000));

  const auto large = resolve_layout(preset(PoolPreset::subslices), 80 * GiB, 512);
  CHECK(sliced_pages(large) == std::vector<std::uint64_t>{2 * MiB, 8 * MiB});
  CHECK(large.back().max_alloc_size == 80 * GiB);

  // A small device gets the rungs of which 32 pages fit; a tiny one the first rung and the tail.
  CHECK(sliced_pages(resolve_layout(preset(PoolPreset::subslices), 128 * MiB, 512)) ==
        std::vector<std::uint64_t>{2 * MiB});
  const auto tiny = resolve_layout(preset(PoolPreset::subslices), 16 * MiB, 512);
  CHECK(sliced_pages(tiny) == std::vector<std::uint64_t>{2 * MiB});
  CHECK(tiny.size() == 2);
}

TEST_CASE("resolve_split_preset_is_the_ladder_with_a_split_tail") {
  for (const std::uint64_t total : {16 * MiB, 128 * MiB, 16 * GiB}) {
    auto split = resolve_layout(preset(PoolPreset::split), total, 512);
    auto ladder = resolve_layout(preset(PoolPreset::subslices), total, 512);
    REQUIRE(split.back().kind == PoolKind::split);
    CHECK(split.back().max_alloc_size == ladder.back().max_alloc_size);
    CHECK(split.back().dealloc_period == ladder.back().dealloc_period);
    split.back().kind = PoolKind::exclusive;
    CHECK(split == ladder);
  }
  const ParseResult parsed = parse_config("pools:split");
  REQUIRE(parsed);
  Rig rig(parsed.config->pools);
  CHECK(rig.manager.report().dynamic.back().kind == "split");
}

TEST_CASE("resolve_exclusive_preset_buckets") {
  const auto pools = resolve_layout(preset(PoolPreset::exclusive), 16 * GiB, 512);
  std::vector<std::uint64_t> maxes;
  for (const PoolSpec& p : pools) {
    CHECK(p.kind == PoolKind::exclusive);
    maxes.push_back(p.max_alloc_size);
  }
  CHECK(maxes == std::vector<std::uint64_t>{32 * KiB, 512 * KiB, 8 * MiB, 128 * MiB, 2 * GiB,
                                            16 * GiB});
  CHECK(pools[0].dealloc_period == std::optional<std::uint64_t>(5000));
  CHECK(pools[2].dealloc_period == std::optional<std::uint64_t>(45000));
}

TEST_CASE("resolve_absent_pools_config_keeps_runtime_choice") {
  // The default layout is the subslices preset.
  const Config defaults;
  CHECK(defaults.pools.preset == PoolPreset::subslices);
  CHECK(resolve_layout(defaults.pools, 1 * GiB, 512) ==
        resolve_layout(preset(PoolPreset::subslices), 1 * GiB, 512));
}

TEST_CASE("resolve_preset_overrides_runtime_choice") {
  const ParseResult parsed = parse_config("pools:exclusive");
  REQUIRE(parsed);
  CHECK(parsed.config->pools.preset == PoolPreset::exclusive);
  Rig rig(parsed.config->pools);
  for (const PoolReport& p : rig.manager.report().dynamic) CHECK(p.kind == "exclusive");
}

TEST_CASE("resolve_explicit_list_aligns_and_defaults") {
  const auto pools =
      resolve_layout(custom({exclusive(8 * KiB, 10000), sliced(1000, 0, 4096)}), 128 * MiB, 32);
  REQUIRE(pools.size() == 2);
  CHECK(pools[0].kind == PoolKind::exclusive);
  CHECK(pools[0].max_alloc_size == 8192);
  CHECK(pools[0].dealloc_period == std::optional<std::uint64_t>(10000));
  CHECK(pools[1].kind == PoolKind::sliced);
  CHECK(pools[1].page_size == 1024);
  CHECK(pools[1].max_slice_size == 1024);
  CHECK(pools[1].cap == std::optional<std::uint64_t>(4096));
  CHECK(pools[1].dealloc_period == std::nullopt);
  // An exclusive max is aligned up too; a slice larger than the page is clamped to it.
  const auto more = resolve_layout(custom({exclusive(1000), sliced(1024, 4096)}), 1 * GiB, 512);
  CHECK(more[0].max_alloc_size == 1024);
  CHECK(more[1].max_slice_size == 1024);
}

TEST_CASE("resolve_parsed_custom_list_builds_those_pools") {
  const ParseResult parsed = parse_config(
      "pools:[sliced(page=64K,slice=16K,cap=1M,period=5000);exclusive(max=1M,period=10000);"
      "direct(reclaim=4M)]");
  REQUIRE(parsed);
  Rig rig(parsed.config->pools, 512);
  const ManagerReport report = rig.manager.report();
  REQUIRE(report.dynamic.size() == 3);
  CHECK(report.dynamic[0].kind == "sliced");
  CHECK(report.dynamic[0].page_size == 64 * KiB);
  CHECK(report.dynamic[0].max_slice_size == 16 * KiB);
  CHECK(report.dynamic[0].cap == 1 * MiB);
  CHECK(report.dynamic[1].kind == "exclusive");
  CHECK(report.dynamic[1].max_slice_size == 1 * MiB);
  CHECK(report.dynamic[2].kind == "direct");
  // Routing follows the list: 16K sliced, 17K exclusive, 2M direct.
  REQUIRE(rig.reserve(16 * KiB) != 0);
  REQUIRE(rig.reserve(17 * KiB) != 0);
  REQUIRE(rig.reserve(2 * MiB) != 0);
  const ManagerReport after = rig.manager.report();
  CHECK(after.dynamic[0].slices == 1);
  CHECK(after.dynamic[1].slices == 1);
  CHECK(after.dynamic[2].slices == 1);
}

TEST_CASE("subslices_preset_routes_small_to_small_pages_and_large_to_the_tail") {
  Rig rig(preset(PoolPreset::subslices), 512, 1 * GiB);
  // 1 GiB device: pages 2M (slices up to 512K) and 8M (up to 2M), then the exclusive tail.
  const ManagerReport empty = rig.manager.report();
  REQUIRE(empty.dynamic.size() == 3);
  REQUIRE(rig.reserve(100 * KiB) != 0);
  REQUIRE(rig.reserve(1 * MiB) != 0);
  REQUIRE(rig.reserve(2 * MiB + 1) != 0);
  REQUIRE(rig.reserve(9 * MiB) != 0);
  const ManagerReport r = rig.manager.report();
  CHECK(r.dynamic[0].slices == 1);
  CHECK(r.dynamic[1].slices == 1);
  CHECK(r.dynamic[2].slices == 2);
  CHECK(r.dynamic[2].kind == "exclusive");
}

}  // TEST_SUITE
