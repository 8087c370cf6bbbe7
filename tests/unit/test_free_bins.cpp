// FreeBins (pools/free_bins.h): what the pools rely on when they look for free memory. A fit is
// never smaller than asked, never missed when any free node is large enough, and never from a
// bin above one that holds a larger-enough node; exact fits, the largest size and the count stay
// true through inserts, erases and resizes, and a set never reads the head of a bin it did not
// fill. Checked against a plain list of the same nodes under a random mix of operations, and on
// the cases the random mix rarely reaches.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <new>
#include <random>
#include <vector>

#include "pools/free_bins.h"

using namespace poolcuda;

namespace {

struct Node {
  std::uint64_t size = 0;
  std::uint64_t tag = 0;
  Node* free_prev = nullptr;
  Node* free_next = nullptr;
  bool in_set = false;
};

using Bins = FreeBins<Node>;

// The bins are used on one thread here: ThreadSanitizer has nothing to watch, and its
// instrumentation made the reference scans below take 38 s of CI. Under it the random test runs
// a fifth of its steps.
#if defined(__SANITIZE_THREAD__)
constexpr int kRandomSteps = 40000;
#else
constexpr int kRandomSteps = 200000;
#endif

// The smallest size among `nodes` in the set that is at least `size`, or 0.
std::uint64_t best_fit(const std::vector<Node>& nodes, std::uint64_t size) {
  std::uint64_t best = 0;
  for (const Node& n : nodes)
    if (n.in_set && n.size >= size && (best == 0 || n.size < best)) best = n.size;
  return best;
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("free_bins_bins_are_ordered_by_size") {
  // A larger size never lands in a lower bin, and sizes 1/32 apart at most share one.
  int last = 0;
  for (std::uint64_t size = 1; size < (std::uint64_t{1} << 40); size += 1 + size / 97) {
    const int b = Bins::bin(size);
    CHECK(b >= last);
    CHECK(b < Bins::kBins);
    last = b;
  }
  CHECK(Bins::bin(std::uint64_t{1} << 63) < Bins::kBins);
  CHECK(Bins::bin(~std::uint64_t{0}) < Bins::kBins);
  CHECK(Bins::bin(1 << 20) == Bins::bin((1 << 20) + (1 << 15) - 1));
  CHECK(Bins::bin(1 << 20) != Bins::bin((1 << 20) + (1 << 15)));
}

TEST_CASE("free_bins_fit_finds_a_node_that_fits_past_a_full_scan_of_smaller_ones") {
  // The own bin holds many nodes just too small, the one that fits last in its list: nothing
  // above, so the fit must still find it rather than report no room.
  Bins bins;
  std::vector<Node> nodes(3 * Bins::kOwnBinScan);
  const std::uint64_t request = (1 << 20) + 4096;
  nodes[0].size = request + 512;  // inserted first: last in the newest-first list
  for (std::size_t i = 1; i < nodes.size(); ++i) nodes[i].size = request - 512;
  for (Node& n : nodes) bins.insert(n);
  CHECK(bins.fit(request) == &nodes[0]);
  CHECK(bins.fit(request + 1024) == nullptr);
  // With a larger node in a higher bin, that one serves instead (a bounded scan).
  Node big;
  big.size = 2 << 20;
  bins.insert(big);
  CHECK(bins.fit(request) == &big);
}

TEST_CASE("free_bins_fit_within_a_largest_size") {
  // A caller that may take nothing above `max_size`: a node that fits the range is found even
  // when the first one of the next bin up is too large, or lies past the own bin's scan.
  Bins bins;
  std::vector<Node> nodes(Bins::kOwnBinScan + 3);
  const std::uint64_t request = (128 + 1) << 20;  // in the bin of 128..132 MiB
  Node& fits = nodes[0];
  fits.size = 130 << 20;
  bins.insert(fits);  // last in its bin's list
  for (std::size_t i = 1; i <= Bins::kOwnBinScan; ++i) {
    nodes[i].size = std::uint64_t{128} << 20;
    bins.insert(nodes[i]);
  }
  Node& above_small = nodes[Bins::kOwnBinScan + 1];
  Node& above_large = nodes[Bins::kOwnBinScan + 2];
  above_small.size = std::uint64_t{133} << 20;
  above_large.size = std::uint64_t{135} << 20;
  REQUIRE(Bins::bin(above_small.size) == Bins::bin(above_large.size));
  bins.insert(above_small);
  bins.insert(above_large);  // the head of the bin above
  CHECK(bins.fit(request) == &above_large);  // no limit: the next bin's first
  CHECK(bins.fit(request, std::uint64_t{134} << 20) == &above_small);  // further in that bin
  CHECK(bins.fit(request, std::uint64_t{131} << 20) == &fits);  // past the own bin's scan
  CHECK(bins.fit(request, std::uint64_t{129} << 20) == nullptr);
  CHECK(bins.consistent());
}

TEST_CASE("free_bins_exact_count_largest_and_resize") {
  Bins bins;
  std::vector<Node> nodes(6);
  const std::uint64_t sizes[] = {4096, 4096, 4608, 1 << 20, (1 << 20) + 512, 64 << 20};
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].size = sizes[i];
    bins.insert(nodes[i]);
  }
  CHECK(bins.size() == 6);
  CHECK(bins.count_exact(4096) == 2);
  CHECK(bins.count_exact(4608) == 1);
  CHECK(bins.count_exact(5120) == 0);
  CHECK(bins.exact((1 << 20) + 512) == &nodes[4]);
  CHECK(bins.exact((1 << 20) + 1024) == nullptr);
  CHECK(bins.largest() == std::uint64_t{64} << 20);

  // Within its bin a resize only changes the fields; across bins the node moves.
  bins.resize(nodes[3], (1 << 20) + 1024, [](Node& n) { n.tag = 1; });
  CHECK(nodes[3].tag == 1);
  CHECK(bins.exact((1 << 20) + 1024) == &nodes[3]);
  bins.resize(nodes[5], 512, [](Node& n) { n.tag = 2; });
  CHECK(bins.largest() == (1 << 20) + 1024);
  CHECK(bins.exact(512) == &nodes[5]);
  CHECK(bins.size() == 6);
  CHECK(bins.consistent());

  for (Node& n : nodes) bins.erase(n);
  CHECK(bins.empty());
  CHECK(bins.largest() == 0);
  CHECK(bins.fit(1) == nullptr);
}

// Note [Unwritten bin heads]: a set made in memory full of stale pointers, and one cleared with
// nodes in it, answer as empty and link new nodes only to each other.
TEST_CASE("free_bins_never_read_a_head_of_a_bin_it_did_not_fill") {
  alignas(Bins) unsigned char storage[sizeof(Bins)];
  std::fill(std::begin(storage), std::end(storage), static_cast<unsigned char>(0xa5));
  Bins* bins = ::new (static_cast<void*>(storage)) Bins;
  CHECK(bins->empty());
  CHECK(bins->fit(512) == nullptr);
  CHECK(bins->exact(4096) == nullptr);
  CHECK(bins->count_exact(4096) == 0);
  CHECK(bins->largest() == 0);
  CHECK(bins->consistent());

  std::vector<Node> nodes(4);
  const std::uint64_t sizes[] = {4096, 4096, 1 << 20, 8 << 20};
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].size = sizes[i];
    bins->insert(nodes[i]);
  }
  CHECK(nodes[0].free_next == nullptr);  // the first in its bin: no stale successor
  CHECK(nodes[1].free_next == &nodes[0]);
  CHECK(nodes[2].free_next == nullptr);
  CHECK(bins->consistent());

  // After a clear, the bins' old heads name nodes no longer in the set.
  bins->clear();
  CHECK(bins->exact(4096) == nullptr);
  CHECK(bins->count_exact(4096) == 0);
  CHECK(bins->fit(1) == nullptr);
  Node fresh;
  fresh.size = 4096;
  bins->insert(fresh);
  CHECK(fresh.free_next == nullptr);
  CHECK(bins->exact(4096) == &fresh);
  CHECK(bins->count_exact(4096) == 1);
  CHECK(bins->fit(8 << 20) == nullptr);
  CHECK(bins->consistent());
  bins->erase(fresh);
  CHECK(bins->empty());
  bins->~Bins();
}

TEST_CASE("free_bins_match_a_reference_under_random_operations") {
  Bins bins;
  std::vector<Node> nodes(2000);
  std::mt19937_64 rng(11);
  // Sizes as the pools make them (multiples of 512), over many powers of two, with repeats.
  auto random_size = [&] {
    const int top = 9 + static_cast<int>(rng() % 22);
    return std::max<std::uint64_t>(512, (rng() % (std::uint64_t{1} << top)) / 512 * 512);
  };
  std::size_t in_set = 0;
  for (int step = 0; step < kRandomSteps; ++step) {
    Node& n = nodes[rng() % nodes.size()];
    switch (rng() % 4) {
      case 0:
        if (!n.in_set) {
          n.size = random_size();
          bins.insert(n);
          n.in_set = true;
          ++in_set;
        }
        break;
      case 1:
        if (n.in_set) {
          bins.erase(n);
          n.in_set = false;
          --in_set;
        }
        break;
      case 2:
        if (n.in_set) bins.resize(n, random_size(), [&](Node& m) { m.tag = step; });
        break;
      default: {
        const std::uint64_t want = random_size();
        const Node* got = bins.fit(want);
        const std::uint64_t best = best_fit(nodes, want);
        REQUIRE((got == nullptr) == (best == 0));
        if (got == nullptr) break;
        CHECK(got->in_set);
        CHECK(got->size >= want);
        // Either from the request's own bin, or from the first bin above it that holds any.
        const int got_bin = Bins::bin(got->size);
        bool skipped_a_bin = false;
        for (const Node& other : nodes) {
          const int b = Bins::bin(other.size);
          skipped_a_bin |= other.in_set && b > Bins::bin(want) && b < got_bin;
        }
        CHECK_FALSE(skipped_a_bin);
        break;
      }
    }
    REQUIRE(bins.size() == in_set);
    if (step % 1000 == 0) REQUIRE(bins.consistent());
  }
  CHECK(bins.consistent());
  std::uint64_t largest = 0;
  for (const Node& n : nodes)
    if (n.in_set) largest = std::max(largest, n.size);
  CHECK(bins.largest() == largest);
  for (const Node& n : nodes)
    if (n.in_set) CHECK(bins.count_exact(n.size) >= 1);
}

}  // TEST_SUITE
