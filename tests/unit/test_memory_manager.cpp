// MemoryManager behaviour checked against the reference behaviour (usage accounting, reuse,
// page reuse, alignment padding, routing, caps and spill, persistent windows, install_layout,
// fragmentation, single arena, allocate/deallocate/reallocate and the exclusive variants).
// Each test is named after the behaviour it ports.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include "pools_test_util.h"

using namespace poolcuda;
using namespace poolcuda::test;

TEST_SUITE("unit") {

// The reference's handle-mutability tests: a live allocation is never shared with another one,
// and only once freed does its memory serve a new allocation.
void check_live_slices_are_exclusive(const PoolLayout& layout) {
  Rig rig(layout, 32, 128 * MiB, FreeFence::none);
  const DevicePtr a = rig.reserve(10);
  const DevicePtr b = rig.reserve(10);
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  CHECK(a != b);
  CHECK((a + 10 <= b || b + 10 <= a));
  CHECK(rig.manager.live_size(a) == 10);
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.manager.live_size(a) == 0);
  CHECK(rig.reserve(10) == a);
}

TEST_CASE("test_handle_mutability") { check_live_slices_are_exclusive(preset(PoolPreset::subslices)); }

TEST_CASE("noslice_test_handle_mutability") {
  check_live_slices_are_exclusive(preset(PoolPreset::exclusive));
}

TEST_CASE("find_unknown_pointer_returns_not_found") {
  // The reference's never-initialized and stale-descriptor lookups: a pointer that is not the
  // start of a live slice resolves to nothing, even with a live page around it.
  Rig rig(custom({sliced(2048)}));
  const DevicePtr live = rig.reserve(512);
  CHECK(rig.manager.live_size(0) == 0);
  CHECK(rig.manager.live_size(live + 32) == 0);
  const DevicePtr stale = rig.reserve(512);
  rig.manager.free(stale);
  CHECK(rig.manager.live_size(stale) == 0);
  CHECK(rig.manager.live_size(live) == 512);
}

TEST_CASE("locate_names_the_page_and_the_live_allocation_holding_a_pointer") {
  Rig rig(custom({sliced(2048), exclusive(GiB)}));
  const DevicePtr a = rig.reserve(512);
  const DevicePtr b = rig.reserve(512);
  const std::vector<PageView> pages = rig.manager.pages();
  REQUIRE(pages.size() == 1);
  // Slices are carved from the top of the free space: neither starts the page.
  for (const DevicePtr p : {a, b, a + 100}) {
    const PointerPlace place = rig.manager.locate(p);
    CHECK(place.pooled);
    CHECK(place.page_base == pages[0].base);
    CHECK(place.page_size == pages[0].size);
    CHECK(place.allocation == (p == b ? b : a));
    CHECK(place.allocation_size == 512);
    CHECK(place.allocation != place.page_base);
  }
  // Free space in a page: pooled, no allocation.
  CHECK(rig.manager.locate(pages[0].base).pooled);
  CHECK(rig.manager.locate(pages[0].base).allocation == 0);
  REQUIRE(rig.manager.free(b) == FreeOutcome::freed);
  CHECK(rig.manager.locate(b).allocation == 0);
  // A page-per-request pool's allocation starts its page.
  const DevicePtr big = rig.reserve(4096);
  CHECK(rig.manager.locate(big).allocation == big);
  CHECK(rig.manager.locate(big + 4000).allocation_size == 4096);
  CHECK(rig.manager.locate(big + 4000).page_base == big);
  CHECK_FALSE(rig.manager.locate(0).pooled);
}

// Note [Locating a pointer]: the index is asked for the slice starts just below a pointer before
// the page's slices are walked. Every pointer of a page full of live, freed and padded slices,
// small and large (a pointer deep in a large one is past the looked-up starts), gets the
// allocation that holds it, or none.
TEST_CASE("locate_agrees_with_the_live_allocations_for_every_pointer_of_a_page") {
  Rig rig(custom({sliced(256 * KiB)}), 32, 128 * MiB, FreeFence::none);
  std::vector<std::pair<DevicePtr, std::uint64_t>> live;
  std::uint64_t state = 12345;
  const auto next = [&state] {
    return state = state * 6364136223846793005ull + 1442695040888963407ull;
  };
  for (int i = 0; i < 64; ++i) {
    const std::uint64_t size = next() % 4 == 0 ? 2000 + next() % 6000 : 1 + next() % 200;
    const DevicePtr ptr = rig.reserve(size);
    REQUIRE(ptr != 0);
    live.emplace_back(ptr, size);
  }
  for (std::size_t i = 0; i < live.size();) {  // free about a third
    if (next() % 3 == 0) {
      REQUIRE(rig.manager.free(live[i].first) == FreeOutcome::freed);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  const std::vector<PageView> pages = rig.manager.pages();
  REQUIRE(pages.size() == 1);
  for (DevicePtr p = pages[0].base; p < pages[0].base + pages[0].size; p += 7) {
    const PointerPlace place = rig.manager.locate(p);
    REQUIRE(place.pooled);
    CHECK(place.page_in_use);
    DevicePtr holder = 0, below = 0;  // the live allocation holding p; the nearest start below
    std::uint64_t holder_size = 0;
    for (const auto& [start, size] : live) {
      if (p >= start && p - start < size) holder = start, holder_size = size;
      if (start <= p && start > below) below = start;
    }
    if (holder != 0) {
      CHECK(place.allocation == holder);
      CHECK(place.allocation_size == holder_size);
    } else if (place.allocation != 0) {  // the padding of the nearest allocation below
      CHECK(place.allocation == below);
      CHECK(p - place.allocation >= place.allocation_size);
      CHECK(p - place.allocation < align_up(place.allocation_size, 32) + 32);
    }
  }
}

TEST_CASE("test_memory_usage") {
  Rig rig(custom({exclusive(512)}));
  DevicePtr a = rig.reserve(100);
  REQUIRE(a != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.bytes_in_use == 100);
  CHECK(usage.bytes_reserved >= 100);
  CHECK(usage.bytes_reserved <= 512);
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  REQUIRE(rig.reserve(100) != 0);
  CHECK(rig.manager.memory_usage() == usage);
}

TEST_CASE("held_binding_survives_explicit_cleanup_renumber") {
  Rig rig(custom({exclusive(1024)}));
  DevicePtr a = rig.reserve(1024), b = rig.reserve(1024), c = rig.reserve(1024);
  std::memset(reinterpret_cast<void*>(b), 0x5a, 1024);
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.manager.free(c) == FreeOutcome::freed);
  rig.manager.cleanup(true);
  CHECK(rig.manager.live_size(b) == 1024);
  CHECK(rig.manager.memory_usage().bytes_reserved == 1024);
  CHECK(reinterpret_cast<unsigned char*>(b)[1023] == 0x5a);
  CHECK(rig.manager.free(b) == FreeOutcome::freed);
}

TEST_CASE("capped_sliced_pool_errors_instead_of_growing") {
  Rig rig(custom({sliced(1024, 0, 2048)}));
  REQUIRE(rig.reserve(1024) != 0);
  REQUIRE(rig.reserve(1024) != 0);
  const Reservation r = rig.manager.allocate(1024);
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::pool_capacity_exceeded, 2048});
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
}

// An operator reads a full cap off the report: which pool spilled or refused, and how often.
TEST_CASE("reports_count_spills_and_refusals_of_a_full_capped_pool") {
  Rig rig(custom({sliced(1024, 0, 1024), sliced(4096, 0, 4096)}));
  REQUIRE(rig.reserve(1024) != 0);  // the first pool's one page, full
  REQUIRE(rig.reserve(512) != 0);   // spills to the second pool
  REQUIRE(rig.reserve(1024) != 0);  // spills too
  ManagerReport report = rig.manager.report();
  CHECK(report.dynamic[0].capacity_spills == 2);
  CHECK(report.dynamic[0].capacity_refusals == 0);
  CHECK(report.dynamic[1].capacity_spills == 0);
  CHECK(report.cap_refusals == 0);
  REQUIRE(rig.reserve(2048) != 0);  // only the second pool accepts it: no spill
  // Both full: the first pool's cap answers a size both accept, the second's one only it does.
  CHECK(rig.manager.allocate(1024).error.kind == ErrorKind::pool_capacity_exceeded);
  CHECK(rig.manager.allocate(2048).error.kind == ErrorKind::pool_capacity_exceeded);
  report = rig.manager.report();
  CHECK(report.dynamic[0].capacity_spills == 2);
  CHECK(report.dynamic[0].capacity_refusals == 1);
  CHECK(report.dynamic[1].capacity_refusals == 1);
  CHECK(report.cap_refusals == 2);
  CHECK(report.oom_failures == 0);
  const std::string text =
      render_report(ReportHeader{1, 1, "request"}, {report}, ReportFormat::text);
  CHECK(text.find("refused at a cap 2") != std::string::npos);
}

TEST_CASE("persistent_window_serves_what_a_capped_layout_refuses") {
  Rig rig(custom({sliced(1024, 0, 1024)}));
  CHECK(rig.manager.allocate(4096).error.kind == ErrorKind::buffer_too_big);
  rig.manager.set_mode(AllocationMode::persistent);
  CHECK(rig.reserve(4096) != 0);
  CHECK(rig.reserve(4096) != 0);
  CHECK(rig.reserve(16) != 0);
  rig.manager.set_mode(AllocationMode::automatic);
  const ManagerReport report = rig.manager.report();
  CHECK(report.persistent.bytes_in_use == 2 * 4096 + 16);
  CHECK(report.dynamic[0].pages_peak == 0);
}

TEST_CASE("capped_sliced_pool_reuses_freed_memory") {
  Rig rig(custom({sliced(1024, 0, 2048)}));
  DevicePtr a = rig.reserve(1024);
  REQUIRE(rig.reserve(1024) != 0);
  CHECK(rig.manager.free(a) == FreeOutcome::freed);
  CHECK(rig.reserve(1024) != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
}

TEST_CASE("capped_lazy_pool_cleanup_still_frees") {
  Rig rig(custom({sliced(1024, 0, 2048)}));
  DevicePtr a = rig.reserve(1024), b = rig.reserve(1024);
  rig.manager.free(a);
  rig.manager.free(b);
  rig.manager.cleanup(true);
  CHECK(rig.manager.memory_usage().bytes_reserved == 0);
  CHECK(rig.reserve(1024) != 0);
  CHECK(rig.reserve(1024) != 0);
  CHECK(rig.manager.allocate(1024).error.kind == ErrorKind::pool_capacity_exceeded);
}

// The first pool is at its cap, and the device has no room for the next pool's page: that is
// out of memory (recovery, then CUDA itself, may still serve the request), not the first pool's
// cap, which refused it outright.
TEST_CASE("spill_past_a_cap_onto_a_full_device_is_out_of_memory") {
  Rig rig(custom({sliced(1024, 0, 1024), sliced(4096, 0)}), 32, 4096);
  REQUIRE(rig.reserve(1024) != 0);  // the first pool's one page, full; 3 KiB left on the device
  const Reservation r = rig.manager.allocate(512);
  CHECK(r.ptr == 0);
  CHECK(r.error.kind == ErrorKind::out_of_memory);
}

TEST_CASE("max_pool_size_smaller_than_page_shrinks_page") {
  Rig rig(custom({sliced(2048, 0, 512)}));
  CHECK(rig.reserve(256) != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved <= 512);
  const Reservation big = rig.manager.allocate(1024);
  CHECK(big.ptr == 0);
  CHECK(big.error.kind == ErrorKind::pool_capacity_exceeded);
  CHECK(rig.manager.memory_usage().bytes_reserved <= 512);
}

TEST_CASE("max_pool_size_below_alignment_never_overshoots") {
  Rig rig(custom({sliced(1024, 0, 16)}));
  const Reservation r = rig.manager.allocate(8);
  CHECK(r.error == Error{ErrorKind::pool_capacity_exceeded, 16});
  CHECK(rig.manager.memory_usage().bytes_reserved == 0);
  CHECK(rig.device.calls().allocate == 0);
}

TEST_CASE("persistent_windows_nest") {
  Rig rig(custom({sliced(4096)}));
  rig.manager.set_mode(AllocationMode::persistent);
  rig.manager.set_mode(AllocationMode::persistent);
  rig.manager.set_mode(AllocationMode::automatic);
  const DevicePtr weight = rig.reserve(1024);
  REQUIRE(weight != 0);
  ManagerReport report = rig.manager.report();
  CHECK(report.persistent.bytes_in_use == 1024);
  CHECK(report.dynamic[0].pages_peak == 0);
  rig.manager.set_mode(AllocationMode::automatic);
  REQUIRE(rig.reserve(1024) != 0);
  CHECK(rig.manager.report().dynamic[0].pages_peak == 1);
  // More closes than opens saturate at zero: the next open is a real window again.
  rig.manager.set_mode(AllocationMode::automatic);
  rig.manager.set_mode(AllocationMode::persistent);
  REQUIRE(rig.reserve(2048) != 0);
  CHECK(rig.manager.report().persistent.bytes_in_use == 1024 + 2048);
}

TEST_CASE("persistent_setting_disabled_and_enforced_ignore_windows") {
  Rig off(custom({sliced(4096)}), 32, 128 * MiB, FreeFence::events, PersistentMode::disabled);
  off.manager.set_mode(AllocationMode::persistent);
  REQUIRE(off.reserve(1024) != 0);
  CHECK(off.manager.report().persistent.bytes_in_use == 0);

  Rig on(custom({sliced(4096)}), 32, 128 * MiB, FreeFence::events, PersistentMode::enforced);
  on.manager.set_mode(AllocationMode::automatic);
  REQUIRE(on.reserve(1024) != 0);
  CHECK(on.manager.report().persistent.bytes_in_use == 1024);
  CHECK(on.manager.report().dynamic[0].pages_peak == 0);
}

TEST_CASE("persistent_setting_size_match_reuses_known_sizes_only") {
  Rig rig(custom({sliced(4096)}), 32, 128 * MiB, FreeFence::none, PersistentMode::size_match);
  // Outside a window an unknown size goes to the dynamic pools.
  const DevicePtr dynamic = rig.reserve(1000);
  CHECK(rig.manager.report().persistent.bytes_in_use == 0);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr weight = rig.reserve(1000);
  rig.manager.set_mode(AllocationMode::automatic);
  CHECK(rig.manager.report().persistent.bytes_in_use == 1000);
  // A size the persistent pool knows (same effective size) goes there, even when all its
  // slices of that size are live (the pool grows).
  const DevicePtr again = rig.reserve(1010);
  CHECK(rig.manager.report().persistent.bytes_in_use == 2010);
  rig.manager.free(weight);
  const DevicePtr reuse = rig.reserve(1000);
  CHECK(reuse == weight);
  CHECK(rig.manager.report().persistent.pages == 2);
  rig.manager.free(dynamic);
  rig.manager.free(again);
  rig.manager.free(reuse);
}

TEST_CASE("capacity_overflow_falls_through_to_later_accepting_pool") {
  Rig rig(custom({sliced(1024, 1024, 1024), sliced(1024)}));
  REQUIRE(rig.reserve(1024) != 0);
  REQUIRE(rig.reserve(1024) != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048);
  const ManagerReport report = rig.manager.report();
  CHECK(report.dynamic[0].pages_peak == 1);
  CHECK(report.dynamic[1].pages_peak == 1);
}

TEST_CASE("capacity_spill_warns_once_per_pool_per_layout") {
  const PoolLayout layout = custom({sliced(1024, 1024, 1024), sliced(1024)});
  Rig rig(layout);
  for (int i = 0; i < 5; ++i) REQUIRE(rig.reserve(1024) != 0);
  CHECK(rig.count_logs("at capacity") == 1);
  CHECK(rig.logs.front().level == LogLevel::basic);
  CHECK(rig.logs.front().text.find("pool 0") != std::string::npos);
  // Free everything and install the same layout again: a new plan may warn again.
  rig.manager.forget();
  CHECK_FALSE(rig.manager.install_layout(layout));
  for (int i = 0; i < 3; ++i) REQUIRE(rig.reserve(1024) != 0);
  CHECK(rig.count_logs("at capacity") == 2);
}

TEST_CASE("spill_log_is_silent_under_log_off") {
  HostDevice device(128 * MiB, 32);
  int lines = 0;
  ManagerOptions o;
  o.layout = custom({sliced(1024, 1024, 1024), sliced(1024)});
  o.log = LogLevel::off;
  o.log_sink = [&](LogLevel, std::string_view) { ++lines; };
  MemoryManager manager(device, o);
  for (int i = 0; i < 3; ++i) REQUIRE(manager.allocate(1024).ptr != 0);
  CHECK(lines == 0);
}

TEST_CASE("alloc_two_chunks_on_one_page") {
  Rig rig(custom({sliced(2048)}));
  REQUIRE(rig.reserve(512) != 0);
  REQUIRE(rig.reserve(512) != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.number_allocs == 2);
  CHECK(usage.bytes_in_use == 1024);
  CHECK(usage.bytes_reserved == 2048);
}

// Note [Pages larger than the device]: such a pool is passed over at once, with one line, not
// after an out-of-memory recovery per request.
TEST_CASE("a_pool_whose_page_is_larger_than_the_device_is_passed_over_with_one_line") {
  Rig rig(custom({sliced(256 * MiB, MiB), sliced(2 * MiB, MiB)}));  // a 128 MiB device
  std::vector<DevicePtr> live;
  for (int i = 0; i < 4; ++i) {
    live.push_back(rig.reserve(MiB));
    REQUIRE(live.back() != 0);
  }
  const ManagerReport report = rig.manager.report();
  CHECK(report.dynamic[0].pages_peak == 0);
  CHECK(report.dynamic[1].pages_peak == 2);
  CHECK(report.oom_failures == 0);
  CHECK(rig.count_logs("has pages larger than the device (128 MiB)") == 1);
  CHECK(rig.count_logs("memory pool 0 (page=256MiB") == 1);
  for (const DevicePtr p : live) CHECK(rig.manager.free(p) == FreeOutcome::freed);
}

TEST_CASE("a_request_only_a_page_larger_than_the_device_accepts_goes_to_the_driver") {
  Rig rig(custom({sliced(256 * MiB, MiB)}));
  for (int i = 0; i < 3; ++i) {
    const Reservation r = rig.manager.allocate(4096);
    CHECK(r.ptr == 0);
    // Not refused, not out of memory: the interposer passes it to CUDA, as a size no pool
    // accepts (the plain call may succeed).
    CHECK(r.error.kind == ErrorKind::buffer_too_big);
  }
  CHECK(rig.manager.report().oom_failures == 0);
  CHECK(rig.device.calls().allocate == 0);
  CHECK(rig.count_logs("larger than the device") == 1);
}

TEST_CASE("the_default_ladder_leaves_out_a_first_rung_larger_than_the_device") {
  // A 1 MiB device: no 2 MiB page ever fits, so the exclusive tail serves every size, pooled,
  // with nothing to warn about.
  Rig tiny(preset(PoolPreset::subslices), 512, MiB);
  CHECK(tiny.manager.report().dynamic.size() == 1);
  std::vector<DevicePtr> held;
  for (DevicePtr p = tiny.reserve(1000); p != 0; p = tiny.reserve(1000)) held.push_back(p);
  CHECK(held.size() == 1024);  // one 1 KiB page each: the whole device, as 1,024 driver calls
  CHECK(tiny.count_logs("larger than the device") == 0);
  for (const DevicePtr p : held) CHECK(tiny.manager.free(p) == FreeOutcome::freed);
  // A device that holds one 2 MiB page keeps the rung.
  Rig small(preset(PoolPreset::subslices), 512, 2 * MiB);
  CHECK(small.manager.report().dynamic.size() == 2);
}

TEST_CASE("a_full_cap_beside_a_pool_passed_over_for_its_page_leaves_the_request_to_cuda") {
  // A 4 KiB device: a capped pool that fills, and one whose 8 KiB pages never fit, in either
  // order. The request is CUDA's to answer (the plain call may succeed), not refused by the cap.
  for (const bool capped_first : {true, false}) {
    CAPTURE(capped_first);
    const PoolSpec capped = sliced(1024, 0, 1024);
    const PoolSpec oversized = sliced(8192, 0);
    Rig rig(custom(capped_first ? std::vector<PoolSpec>{capped, oversized}
                                : std::vector<PoolSpec>{oversized, capped}),
            32, 4096);
    REQUIRE(rig.reserve(1024) != 0);
    CHECK(rig.manager.allocate(512).error.kind == ErrorKind::buffer_too_big);
    // The cap's line says where the request goes: not a spill into the pool that never grows.
    CHECK(rig.count_logs("is at capacity") == 1);
    CHECK(rig.count_logs("passing such requests to CUDA unpooled") == 1);
  }
}

TEST_CASE("recovery_makes_room_for_the_first_pool_that_can_grow") {
  // Note [Recovery in two steps]: one idle 4 MiB page covers the 2 MiB page a 1 MiB request
  // needs; the 256 MiB pages of the pool passed over must not size that room.
  Rig rig(custom({sliced(256 * MiB, MiB), sliced(2 * MiB, MiB), sliced(4 * MiB, 4 * MiB)}), 32,
          128 * MiB, FreeFence::none);
  std::vector<DevicePtr> big;
  for (int i = 0; i < 32; ++i) {
    big.push_back(rig.reserve(3 * MiB));
    REQUIRE(big.back() != 0);
  }
  for (int i = 0; i < 10; ++i) REQUIRE(rig.manager.free(big[i]) == FreeOutcome::freed);
  const auto released_before = rig.device.calls().release;
  CHECK(rig.reserve(MiB) != 0);
  CHECK(rig.device.calls().release - released_before == 1);
}

TEST_CASE("the_line_of_a_pool_passed_over_comes_once_per_layout_not_per_reset") {
  const PoolLayout layout = custom({sliced(256 * MiB, MiB), sliced(2 * MiB, MiB)});
  Rig rig(layout);
  rig.manager.free(rig.reserve(4096));
  CHECK(rig.count_logs("larger than the device") == 1);
  // A device reset rebuilds the pools, the layout stays: nothing new to say.
  rig.manager.forget();
  rig.manager.free(rig.reserve(4096));
  CHECK(rig.count_logs("larger than the device") == 1);
  // A layout installed again is a new plan.
  CHECK_FALSE(rig.manager.install_layout(layout));
  rig.manager.free(rig.reserve(4096));
  CHECK(rig.count_logs("larger than the device") == 2);
}

TEST_CASE("alloc_reuses_storage") {
  Rig rig(custom({sliced(512)}));
  const DevicePtr a = rig.reserve(512);
  rig.manager.free(a);
  CHECK(rig.reserve(512) == a);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.number_allocs == 1);
  CHECK(usage.bytes_in_use == 512);
  CHECK(usage.bytes_reserved == 512);
}

TEST_CASE("alloc_allocs_new_storage") {
  Rig rig(custom({sliced(1024)}));
  REQUIRE(rig.reserve(768) != 0);
  REQUIRE(rig.reserve(768) != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.number_allocs == 2);
  CHECK(usage.bytes_in_use == 768 * 2);
  CHECK(usage.bytes_reserved == 1024 * 2);
}

TEST_CASE("alloc_respects_alignment_size") {
  Rig rig(custom({sliced(500)}), 50);
  const DevicePtr a = rig.reserve(40), b = rig.reserve(40);
  CHECK(rig.manager.memory_usage().bytes_padding == 10 * 2);
  CHECK(a % 50 == 0);
  CHECK(b % 50 == 0);
  CHECK((a > b ? a - b : b - a) == 50);
}

TEST_CASE("allocs_on_correct_page") {
  Rig rig(custom({sliced(100), sliced(200), sliced(300), sliced(400)}), 10);
  for (std::uint64_t size : {50, 150, 250, 350}) REQUIRE(rig.reserve(size) != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.bytes_in_use == 50 + 150 + 250 + 350);
  CHECK(usage.bytes_reserved >= 100 + 200 + 300 + 400);
  const ManagerReport report = rig.manager.report();
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(report.dynamic[i].pages == 1);
    CHECK(report.dynamic[i].slices == 1);
  }
}

TEST_CASE("resolved_single_arena_reuses_across_sizes") {
  Rig rig(custom({sliced(1 * MiB)}));
  const DevicePtr small = rig.reserve(4 * KiB);
  rig.manager.free(small);
  REQUIRE(rig.reserve(512 * KiB) != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.bytes_reserved == 1 * MiB);
  CHECK(usage.number_allocs == 1);
}

TEST_CASE("allocate_deallocate_reallocate") {
  Rig rig(preset(PoolPreset::subslices));
  std::vector<DevicePtr> handles;
  for (std::uint64_t i = 0; i < 5; ++i) handles.push_back(rig.reserve(1000 * (i + 1)));
  const MemoryUsage before = rig.manager.memory_usage();
  for (DevicePtr p : handles) CHECK(rig.manager.free(p) == FreeOutcome::freed);
  for (std::uint64_t i = 0; i < 5; ++i) REQUIRE(rig.reserve(1000 * (i + 1)) != 0);
  const MemoryUsage after = rig.manager.memory_usage();
  CHECK(before.number_allocs == after.number_allocs);
  CHECK(before.bytes_in_use == after.bytes_in_use);
  CHECK(before.bytes_reserved >= after.bytes_reserved);
}

TEST_CASE("test_fragmentation_resistance") {
  Rig rig(preset(PoolPreset::subslices));
  const std::uint64_t sizes[] = {50, 1000, 100, 5000, 200, 10000, 300};
  std::vector<DevicePtr> handles;
  for (std::uint64_t size : sizes) handles.push_back(rig.reserve(size));
  const MemoryUsage before = rig.manager.memory_usage();
  for (std::size_t i = 0; i < handles.size(); i += 2) rig.manager.free(handles[i]);
  for (std::size_t i = 0; i < std::size(sizes) / 2; ++i) REQUIRE(rig.reserve(sizes[i]) != 0);
  const MemoryUsage after = rig.manager.memory_usage();
  CHECK(after.bytes_reserved <= before.bytes_reserved * 11 / 10);
}

TEST_CASE("install_layout_refuses_while_dynamic_slices_live") {
  Rig rig(custom({sliced(4096)}));
  const DevicePtr live = rig.reserve(1000);
  rig.manager.set_mode(AllocationMode::persistent);
  const DevicePtr weight = rig.reserve(3000);
  rig.manager.set_mode(AllocationMode::automatic);
  const std::size_t pools_before = rig.manager.report().dynamic.size();
  const Error refused = rig.manager.install_layout(custom({sliced(8192), exclusive(1 * MiB)}));
  CHECK(refused == Error{ErrorKind::pools_in_use, 1000});
  CHECK(rig.manager.report().dynamic.size() == pools_before);
  CHECK(rig.manager.live_size(live) == 1000);
  // Persistent slices (weights) never block a rebuild.
  rig.manager.free(live);
  CHECK_FALSE(rig.manager.install_layout(custom({sliced(8192), exclusive(1 * MiB)})));
  CHECK(rig.manager.report().dynamic.size() == 2);
  CHECK(rig.manager.live_size(weight) == 3000);
}

TEST_CASE("install_layout_resets_high_water_marks") {
  Rig rig(custom({sliced(4096)}));
  std::vector<DevicePtr> held;
  for (int i = 0; i < 3; ++i) held.push_back(rig.reserve(4096));
  CHECK(rig.manager.report().dynamic[0].pages_peak == 3);
  for (DevicePtr p : held) rig.manager.free(p);
  CHECK_FALSE(rig.manager.install_layout(custom({sliced(4096)})));
  const ManagerReport report = rig.manager.report();
  CHECK(report.dynamic[0].pages_peak == 0);
  CHECK(report.dynamic[0].bytes_peak == 0);
  CHECK(report.bytes_reserved == 0);
  CHECK(rig.device.outstanding_allocations() == 0);
}

TEST_CASE("buffer_too_big_when_no_pool_accepts") {
  Rig rig(custom({sliced(1024), exclusive(4096)}));
  const Reservation r = rig.manager.allocate(5000);
  CHECK(r.ptr == 0);
  CHECK(r.error == Error{ErrorKind::buffer_too_big, 5000});
  CHECK(rig.manager.allocate(0).error.kind == ErrorKind::buffer_too_big);
  // Sizes whose alignment would wrap around are refused before any pool sees them.
  Rig any(custom({direct(1 * GiB)}));
  any.manager.set_mode(AllocationMode::persistent);
  CHECK(any.manager.allocate(~std::uint64_t{0}).error ==
        Error{ErrorKind::buffer_too_big, ~std::uint64_t{0}});
  CHECK(any.manager.allocate((std::uint64_t{1} << 62) + 1).error.kind ==
        ErrorKind::buffer_too_big);
  CHECK(any.manager.memory_usage() == MemoryUsage{});
  CHECK(any.device.calls().allocate == 0);
  CHECK(rig.manager.memory_usage() == MemoryUsage{});
  CHECK(rig.device.calls().allocate == 0);
}

TEST_CASE("direct_pool_reclaims_idle_allocations_above_threshold") {
  Rig rig(custom({direct(4096)}), 32, 128 * MiB, FreeFence::none);
  const DevicePtr a = rig.reserve(2048), b = rig.reserve(2048);
  rig.manager.free(a);
  rig.manager.free(b);
  CHECK(rig.manager.memory_usage().bytes_reserved == 4096);
  // Same size: exact reuse, no device call.
  const auto allocs = rig.device.calls().allocate;
  const DevicePtr c = rig.reserve(2048);
  CHECK((c == a || c == b));
  CHECK(rig.device.calls().allocate == allocs);
  // A new size above the threshold releases idle allocations until it fits.
  REQUIRE(rig.reserve(2048 + 32) != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 2048 + 2048 + 32);
  CHECK(rig.device.calls().release == 1);
}

// Exclusive ("noslice") variants.

TEST_CASE("noslice_alloc_two_chunk") {
  Rig rig(custom({exclusive(1024)}));
  REQUIRE(rig.reserve(512) != 0);
  REQUIRE(rig.reserve(512) != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.number_allocs == 2);
  CHECK(usage.bytes_in_use == 1024);
  CHECK(usage.bytes_reserved >= 1024);
}

TEST_CASE("noslice_alloc_reuses_storage") {
  Rig rig(custom({exclusive(1024)}));
  const DevicePtr a = rig.reserve(512);
  rig.manager.free(a);
  CHECK(rig.reserve(512) == a);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.number_allocs == 1);
  CHECK(usage.bytes_in_use == 512);
  CHECK(usage.bytes_reserved >= 512);
}

TEST_CASE("noslice_alloc_allocs_new_storage") {
  Rig rig(custom({exclusive(1024)}));
  REQUIRE(rig.reserve(768) != 0);
  REQUIRE(rig.reserve(768) != 0);
  const MemoryUsage usage = rig.manager.memory_usage();
  CHECK(usage.number_allocs == 2);
  CHECK(usage.bytes_in_use == 768 * 2);
  CHECK(usage.bytes_reserved >= 768 * 2);
}

TEST_CASE("noslice_alloc_respects_alignment_size") {
  Rig rig(custom({exclusive(50 * 20)}), 50);
  REQUIRE(rig.reserve(40) != 0);
  REQUIRE(rig.reserve(40) != 0);
  CHECK(rig.manager.memory_usage().bytes_padding == 10 * 2);
}

TEST_CASE("noslice_allocs_on_correct_page") {
  Rig rig(custom({sliced(100), sliced(200), sliced(300), sliced(400)}), 10);
  for (std::uint64_t size : {50, 150, 250, 350}) REQUIRE(rig.reserve(size) != 0);
  CHECK(rig.manager.memory_usage().bytes_in_use == 50 + 150 + 250 + 350);
}

TEST_CASE("noslice_allocate_deallocate_reallocate") {
  Rig rig(preset(PoolPreset::exclusive));
  std::vector<DevicePtr> handles;
  for (std::uint64_t i = 0; i < 5; ++i) handles.push_back(rig.reserve(1000 * (i + 1)));
  const MemoryUsage before = rig.manager.memory_usage();
  for (DevicePtr p : handles) rig.manager.free(p);
  for (std::uint64_t i = 0; i < 5; ++i) REQUIRE(rig.reserve(1000 * (i + 1)) != 0);
  const MemoryUsage after = rig.manager.memory_usage();
  CHECK(before.number_allocs == after.number_allocs);
  CHECK(before.bytes_in_use == after.bytes_in_use);
  CHECK(before.bytes_reserved == after.bytes_reserved);
}

TEST_CASE("exclusive_pages_are_size_classes_and_reuse_the_smallest_fit_within_a_bound") {
  Rig rig(custom({exclusive(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  // A new page is the request's size class: rounded up to an eighth of its power of two.
  const DevicePtr a = rig.reserve(99 * MiB + 1);  // class 100 MiB (steps of 2 MiB at most)
  const DevicePtr b = rig.reserve(5 * MiB);        // exactly 5 MiB (steps of 512 KiB)
  std::uint64_t a_page = 0, b_page = 0;
  for (const PageView& p : rig.manager.pages()) {
    if (p.base == a) a_page = p.size;
    if (p.base == b) b_page = p.size;
  }
  CHECK(a_page == 100 * MiB);
  CHECK(b_page == 5 * MiB);
  rig.manager.free(a);
  rig.manager.free(b);
  // A free page serves a request whose class is at least half of it: 2.25 MiB (a 2.25 MiB
  // class) gets a page of its own, 2.5 MiB takes the 5 MiB page.
  const DevicePtr below_half = rig.reserve(2 * MiB + 256 * KiB);
  CHECK(below_half != b);
  CHECK(rig.reserve(2 * MiB + 512 * KiB) == b);
  // A page far larger than the request is never handed out: 3 MiB gets a page of its own
  // instead of the idle 100 MiB one.
  const DevicePtr c = rig.reserve(3 * MiB);
  CHECK(c != a);
  CHECK(rig.manager.memory_usage().bytes_padding == 2 * MiB + 512 * KiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("exclusive_reuse_finds_a_page_that_fits_behind_smaller_and_too_large_ones") {
  // In the bin of 129 MiB (bins of 4 MiB there), eight idle 128 MiB pages come first, too small;
  // the first page of the next bin up (200 MiB) is larger than a 129 MiB request may take
  // (130 + 64 MiB). The idle 130 MiB page further down the own bin must still serve.
  Rig rig(custom({sliced(64 * KiB), exclusive(4 * GiB)}), 512, 4 * GiB, FreeFence::none);
  const DevicePtr fits = rig.reserve(130 * MiB);
  std::vector<DevicePtr> small;
  for (int i = 0; i < 8; ++i) small.push_back(rig.reserve(128 * MiB));
  const DevicePtr huge = rig.reserve(200 * MiB);
  REQUIRE((fits != 0 && huge != 0));
  rig.manager.free(fits);
  for (const DevicePtr p : small) rig.manager.free(p);  // newest first: they lead the bin
  rig.manager.free(huge);
  const std::uint64_t before = rig.device.outstanding_bytes();
  CHECK(rig.reserve(129 * MiB) == fits);
  CHECK(rig.device.outstanding_bytes() == before);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("exclusive_reuse_padding_is_capped_at_a_64th_of_the_device") {
  // On a 1 GiB device a reused page may carry at most 16 MiB of padding, though twice the
  // request's class would allow 400 MiB: the 500 MiB page is not handed to 400 MiB.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  const DevicePtr big = rig.reserve(500 * MiB);
  REQUIRE(big != 0);
  rig.manager.free(big);
  const DevicePtr smaller = rig.reserve(400 * MiB);
  CHECK(smaller != 0);
  CHECK(smaller != big);
  CHECK(rig.manager.memory_usage().bytes_padding == 0);
  rig.manager.free(smaller);
  // Within the cap it is reused: 490 MiB takes the 500 MiB page (10 MiB of padding).
  CHECK(rig.reserve(490 * MiB) == big);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("exclusive_growth_releases_pages_idle_for_500_reservations_beyond_an_eighth_of_use") {
  for (const bool with_period : {true, false}) {
    CAPTURE(with_period);
    const std::optional<std::uint64_t> period =
        with_period ? std::optional<std::uint64_t>(1000000) : std::nullopt;
    Rig rig(custom({sliced(64 * KiB), exclusive(1 * GiB, period)}), 512, 1 * GiB,
            FreeFence::none);
    const DevicePtr live = rig.reserve(4 * MiB);
    const DevicePtr a = rig.reserve(8 * MiB), b = rig.reserve(3 * MiB), c = rig.reserve(3 * MiB);
    REQUIRE((live != 0 && a != 0 && b != 0 && c != 0));
    rig.manager.free(a);  // idle from oldest to youngest: a, b, c
    rig.manager.free(b);
    rig.manager.free(c);
    // A growth right away keeps them: they were idle for too few reservations.
    const DevicePtr other = rig.reserve(20 * MiB);
    REQUIRE(other != 0);
    CHECK(rig.device.outstanding_bytes() == 38 * MiB);
    for (int i = 0; i < 500; ++i) rig.manager.free(rig.reserve(512));
    // Now each idle page is old enough. With 24 MiB in use, 3 MiB may stay idle: the next growth
    // releases `a`, then `b` (6 MiB idle is still too much), and keeps `c`. A quarter of the bytes
    // in use would have kept `b` too. Without a period the pool keeps its idle pages.
    const DevicePtr grown = rig.reserve(48 * MiB);
    REQUIRE(grown != 0);
    const PoolReport exclusive_pool = rig.manager.report().dynamic.at(1);
    if (with_period) {
      CHECK(rig.device.outstanding_bytes() == 4 * MiB + 20 * MiB + 3 * MiB + 48 * MiB + 64 * KiB);
      CHECK(rig.manager.free(a) == FreeOutcome::not_mine);  // its page is gone
      CHECK(exclusive_pool.stale_releases == 2);             // the report says why
      CHECK(rig.reserve(3 * MiB) == c);                      // the page kept is reused
    } else {
      CHECK(rig.device.outstanding_bytes() == 86 * MiB + 64 * KiB);
      CHECK(exclusive_pool.stale_releases == 0);
    }
    CHECK(rig.manager.check_consistency().empty());
  }
}

TEST_CASE("exclusive_growth_releases_a_page_idle_for_500_allocations_not_499") {
  Rig rig(custom({sliced(64 * KiB), exclusive(1 * GiB, 1000000)}), 512, 1 * GiB,
          FreeFence::none);
  const DevicePtr live = rig.reserve(4 * MiB);  // an eighth: 512 KiB may stay idle
  const DevicePtr idle = rig.reserve(8 * MiB);
  REQUIRE((live != 0 && idle != 0));
  rig.manager.free(idle);
  for (int i = 0; i < 498; ++i) rig.manager.free(rig.reserve(512));
  // The 499th allocation since the free grows the pool: the page is not stale yet.
  REQUIRE(rig.reserve(20 * MiB) != 0);
  CHECK(rig.manager.report().dynamic.at(1).stale_releases == 0);
  // The 500th grows it again and releases the page.
  REQUIRE(rig.reserve(24 * MiB) != 0);
  CHECK(rig.manager.report().dynamic.at(1).stale_releases == 1);
  CHECK(rig.manager.free(idle) == FreeOutcome::not_mine);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("exclusive_reuse_far_above_the_class_stops_at_a_16th_of_the_device_in_padding") {
  // 1 GiB device: each reuse of a 30 MiB page by a 16 MiB request pads 14 MiB (within the
  // page's cap of 16 MiB); four of them fit the pool's 64 MiB budget, the fifth would not, so
  // it and the sixth get pages of their own and the device keeps what plain CUDA would have.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 1 * GiB, FreeFence::none);
  std::vector<DevicePtr> big;
  for (int i = 0; i < 6; ++i) big.push_back(rig.reserve(30 * MiB));
  for (DevicePtr p : big) rig.manager.free(p);
  int reused = 0;
  for (int i = 0; i < 6; ++i) {
    const DevicePtr p = rig.reserve(16 * MiB);
    REQUIRE(p != 0);
    reused += std::find(big.begin(), big.end(), p) != big.end();
  }
  CHECK(reused == 4);
  CHECK(rig.manager.memory_usage().bytes_padding == 4 * 14 * MiB);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("a_rounded_page_that_does_not_fit_is_tried_at_the_exact_size") {
  // 5 MiB + 1 rounds to a 5.5 MiB page; with 5.25 MiB of device only the exact size fits.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 5 * MiB + 256 * KiB, FreeFence::none);
  REQUIRE(rig.reserve(5 * MiB + 1) != 0);
  CHECK(rig.manager.memory_usage().bytes_reserved == 5 * MiB + 512);
}

TEST_CASE("an_idle_oversized_page_goes_back_when_the_device_fills") {
  // An 8 MiB scratch page, freed, must not make the device refuse what plain CUDA would give:
  // requests too small for it get pages of their own, and when the device is full the idle
  // scratch page is returned to make room.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 12 * MiB, FreeFence::none);
  const DevicePtr scratch = rig.reserve(8 * MiB);
  REQUIRE(scratch != 0);
  rig.manager.free(scratch);
  std::vector<DevicePtr> small;
  for (int i = 0; i < 12; ++i) {
    const DevicePtr p = rig.reserve(1 * MiB);
    REQUIRE(p != 0);
    small.push_back(p);
  }
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.manager.memory_usage().bytes_padding == 0);
  for (DevicePtr p : small) rig.manager.free(p);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_first_returns_only_the_oldest_idle_pages_the_request_lacks") {
  // Note [Recovery in two steps]: seven idle 8 MiB pages on a 64 MiB device (8 MiB free); a
  // 12 MiB request lacks 4 MiB and the slack, so the oldest idle page alone goes back.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 64 * MiB, FreeFence::none);
  std::vector<DevicePtr> pages;
  for (int i = 0; i < 7; ++i) pages.push_back(rig.reserve(8 * MiB));
  for (const DevicePtr p : pages) REQUIRE(p != 0);
  for (const DevicePtr p : pages) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  const DevicePtr big = rig.reserve(12 * MiB);
  REQUIRE(big != 0);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.device.outstanding_allocations() == 7);  // six idle pages kept, and the new one
  // The page freed first went back (its pool reuses the smallest page that fits, so probe it by
  // filling the six that are left with 8 MiB requests: none is a new driver allocation).
  std::vector<DevicePtr> again;
  for (int i = 0; i < 6; ++i) again.push_back(rig.reserve(8 * MiB));
  CHECK(rig.device.outstanding_allocations() == 7);
  for (const DevicePtr p : again) CHECK(std::find(pages.begin() + 1, pages.end(), p) != pages.end());
  // A 40 MiB request with 4 MiB free and six idle pages lacks 38 MiB: five pages go back.
  for (const DevicePtr p : again) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  const DevicePtr bigger = rig.reserve(40 * MiB);
  CHECK(bigger != 0);
  CHECK(rig.device.outstanding_allocations() == 3);
  CHECK(rig.manager.report().oom_recoveries == 2);
  rig.manager.free(big);
  rig.manager.free(bigger);
  CHECK(rig.manager.check_consistency().empty());
}

// One exclusive pool, free_fence:none, no log: a manager over a device of a test's own.
ManagerOptions exclusive_options() {
  ManagerOptions options;
  options.layout = custom({exclusive(1 * GiB)});
  options.free_fence = FreeFence::none;
  options.log_sink = [](LogLevel, std::string_view) {};
  return options;
}

// Allocates `n` pages of `size` and frees them: idle pages for a recovery to find.
void leave_idle_pages(MemoryManager& manager, int n, std::uint64_t size) {
  std::vector<DevicePtr> pages;
  for (int i = 0; i < n; ++i) pages.push_back(manager.allocate(size).ptr);
  for (const DevicePtr p : pages) REQUIRE(manager.free(p) == FreeOutcome::freed);
}

TEST_CASE("oom_recovery_with_the_room_there_already_routes_again_and_keeps_every_idle_page") {
  // Note [Recovery in two steps]: the driver refuses one page although it has room (another
  // thread's recovery gave pages back meanwhile, in a program with shards). Recovery releases
  // nothing and routes again: the three idle pages stay for the requests that reuse them.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 64 * MiB, FreeFence::none);
  leave_idle_pages(rig.manager, 3, 8 * MiB);
  rig.device.fail_nth_allocation(1);
  const DevicePtr big = rig.reserve(16 * MiB);
  REQUIRE(big != 0);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.device.outstanding_allocations() == 4);
  CHECK(rig.device.calls().release == 0);
  rig.manager.free(big);
  CHECK(rig.manager.check_consistency().empty());
}

// A device that refuses its next `refusals` allocations whatever it has free: a refusal with
// another cause than a full device.
class RefusingDevice final : public ForwardingDevice<HostDevice> {
 public:
  RefusingDevice(HostDevice& inner, int refusals)
      : ForwardingDevice(inner), refusals_(refusals) {}
  void refuse(int refusals) { refusals_ = refusals; }
  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override {
    if (refusals_ > 0) {
      --refusals_;
      return AllocStatus::out_of_memory;
    }
    return inner_.allocate(size, out);
  }

 private:
  int refusals_;
};

TEST_CASE("oom_recovery_whose_retry_is_refused_again_goes_on_to_return_every_idle_page") {
  // The room is there, so the first step only routes again; the driver refuses once more, and
  // the second step returns the three idle pages before the request succeeds.
  HostDevice host(64 * MiB, 512);
  RefusingDevice device(host, 0);
  MemoryManager manager(device, exclusive_options());
  leave_idle_pages(manager, 3, 8 * MiB);
  device.refuse(2);
  const DevicePtr big = manager.allocate(16 * MiB).ptr;
  REQUIRE(big != 0);
  CHECK(manager.report().oom_recoveries == 1);
  CHECK(host.calls().release == 3);
  CHECK(host.outstanding_allocations() == 1);
  manager.free(big);
  CHECK(manager.check_consistency().empty());
}

// A device with a budget of its own, as CudaDevice has under `limit`: it refuses what would pass
// the budget, whatever memory_info() says is free.
class BudgetDevice final : public ForwardingDevice<HostDevice> {
 public:
  BudgetDevice(HostDevice& inner, std::uint64_t limit)
      : ForwardingDevice(inner), limit_(limit) {}
  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override {
    if (charged_ + size > limit_) return AllocStatus::out_of_memory;
    const AllocStatus status = inner_.allocate(size, out);
    if (status == AllocStatus::ok) charged_ += size;
    return status;
  }
  void release(DevicePtr ptr, std::uint64_t size) override {
    charged_ -= size;
    inner_.release(ptr, size);
  }
  std::uint64_t growth_room() override { return limit_ - charged_; }

 private:
  std::uint64_t limit_;
  std::uint64_t charged_ = 0;
};

TEST_CASE("oom_recovery_first_step_sizes_the_lack_by_a_budget") {
  // Three idle 8 MiB pages under a 32 MiB budget on a 64 MiB device: a 16 MiB request passes
  // the budget though the driver has 40 MiB free. It lacks 10 MiB of room and the slack, so two
  // of the idle pages go back, not three.
  HostDevice host(64 * MiB, 512);
  BudgetDevice device(host, 32 * MiB);
  MemoryManager manager(device, exclusive_options());
  leave_idle_pages(manager, 3, 8 * MiB);
  const DevicePtr big = manager.allocate(16 * MiB).ptr;
  REQUIRE(big != 0);
  CHECK(manager.report().oom_recoveries == 1);
  CHECK(host.outstanding_allocations() == 2);
  manager.free(big);
  CHECK(manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_first_returns_idle_pages_in_the_order_they_went_idle_across_pools") {
  // Two exclusive 8 MiB pages go idle, then a sliced pool's 8 MiB page, with no allocation in
  // between (the reservation clock does not move); on a 32 MiB device an 18 MiB request lacks
  // 12 MiB and the slack, which no page covers alone: the two exclusive pages go, the sliced
  // page stays.
  Rig rig(custom({sliced(8 * MiB, MiB), exclusive(1 * GiB)}), 512, 32 * MiB, FreeFence::none);
  const DevicePtr slice = rig.reserve(MiB);
  const DevicePtr first = rig.reserve(8 * MiB);
  const DevicePtr second = rig.reserve(8 * MiB);
  REQUIRE((slice != 0 && first != 0 && second != 0));
  REQUIRE(rig.manager.free(first) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(second) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(slice) == FreeOutcome::freed);
  const DevicePtr big = rig.reserve(18 * MiB);
  REQUIRE(big != 0);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.device.outstanding_allocations() == 2);
  const DevicePtr again = rig.reserve(MiB);  // the sliced page, still there: no recovery
  CHECK(rig.device.outstanding_allocations() == 2);
  CHECK(rig.manager.report().oom_recoveries == 1);
  rig.manager.free(again);
  rig.manager.free(big);
  CHECK(rig.manager.check_consistency().empty());
}

TEST_CASE("oom_recovery_first_returns_one_page_that_covers_the_lack_before_older_smaller_ones") {
  // Four idle 4 MiB pages, then an idle 24 MiB one, on a 64 MiB device (24 MiB free): a 30 MiB
  // request lacks 8 MiB and the slack. The large page alone covers it and goes back, though the
  // small ones went idle first; they stay for the requests that reuse them.
  Rig rig(custom({exclusive(1 * GiB)}), 512, 64 * MiB, FreeFence::none);
  std::vector<DevicePtr> small;
  for (int i = 0; i < 4; ++i) small.push_back(rig.reserve(4 * MiB));
  const DevicePtr large = rig.reserve(24 * MiB);
  REQUIRE(large != 0);
  for (const DevicePtr p : small) REQUIRE(rig.manager.free(p) == FreeOutcome::freed);
  REQUIRE(rig.manager.free(large) == FreeOutcome::freed);
  const DevicePtr big = rig.reserve(30 * MiB);
  REQUIRE(big != 0);
  CHECK(rig.manager.report().oom_recoveries == 1);
  CHECK(rig.device.outstanding_allocations() == 5);
  std::vector<DevicePtr> again;
  for (int i = 0; i < 4; ++i) again.push_back(rig.reserve(4 * MiB));
  CHECK(rig.device.outstanding_allocations() == 5);
  for (const DevicePtr p : again) rig.manager.free(p);
  rig.manager.free(big);
  CHECK(rig.manager.check_consistency().empty());
}

}  // TEST_SUITE
