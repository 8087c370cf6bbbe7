// SliceIndex (open addressing, backward-shift deletion) against std::unordered_map under a
// random mix of inserts, lookups and erases, including clustered keys and growth; and prefetch()
// from another thread while the table grows and is cleared (a free prefetches before it takes
// the lock that guards the index: under ThreadSanitizer this case fails if prefetch() reads the
// table unsynchronized).
#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pools/slice_index.h"

using namespace poolcuda;

namespace {

// A random mix of inserts, erases and lookups after `base` entries (their keys above the mix's).
void matches_a_reference_map(std::size_t base) {
  SliceIndex index;
  std::unordered_map<DevicePtr, Slice*> model;
  std::vector<Slice> nodes(4096);
  std::mt19937_64 rng(7);
  std::vector<DevicePtr> keys;
  for (std::size_t i = 0; i < base; ++i) {
    const DevicePtr key = 512 * (100000 + i);
    index.insert(key, &nodes[i % nodes.size()]);
    model[key] = &nodes[i % nodes.size()];
  }
  for (int step = 0; step < 200000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 || keys.empty()) {
      // Clustered addresses (multiples of 512 in a narrow range) stress probe runs.
      const DevicePtr key = 512 * (1 + rng() % 50000);
      if (model.count(key)) continue;
      Slice* value = &nodes[rng() % nodes.size()];
      index.insert(key, value);
      model[key] = value;
      keys.push_back(key);
    } else if (op == 1) {
      const std::size_t i = rng() % keys.size();
      const DevicePtr key = keys[i];
      REQUIRE(index.erase(key) == model[key]);
      model.erase(key);
      keys[i] = keys.back();
      keys.pop_back();
      CHECK(index.erase(key) == nullptr);
    } else {
      const DevicePtr key = 512 * (1 + rng() % 50000);
      auto it = model.find(key);
      REQUIRE(index.find(key) == (it == model.end() ? nullptr : it->second));
    }
    REQUIRE(index.size() == model.size());
  }
  for (const auto& [key, value] : model) REQUIRE(index.find(key) == value);
  std::size_t listed = 0;
  index.for_each([&](DevicePtr key, Slice* value) {
    ++listed;
    REQUIRE(model.at(key) == value);
  });
  CHECK(listed == model.size());
  index.clear();
  CHECK(index.size() == 0);
  for (const auto& [key, value] : model) REQUIRE(index.find(key) == nullptr);
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("slice_index_matches_a_reference_map") { matches_a_reference_map(0); }

// A table of 2^18 cells and more queues its newest entries (Note [Late inserts]): lookups,
// erases and the listing must find them there.
TEST_CASE("slice_index_with_queued_inserts_matches_a_reference_map") {
  matches_a_reference_map(140000);
}

TEST_CASE("slice_index_prefetch_is_safe_beside_a_growing_table") {
  SliceIndex index;
  std::vector<Slice> nodes(16);
  std::atomic<bool> done{false};
  std::thread prefetcher([&] {
    std::mt19937_64 rng(11);
    while (!done.load(std::memory_order_relaxed)) index.prefetch(512 * (1 + rng() % 100000));
  });
  for (int round = 0; round < 3; ++round) {
    // Grows from 1,024 cells through seven doublings, then starts again from the smallest table.
    for (DevicePtr key = 1; key <= 40000; ++key) index.insert(512 * key, &nodes[key % 16]);
    CHECK(index.size() == 40000);
    CHECK(index.find(512 * 777) == &nodes[777 % 16]);
    index.clear();
  }
  done.store(true);
  prefetcher.join();
  CHECK(index.size() == 0);
}

}  // TEST_SUITE
