// The pools' large bookkeeping (Note [Tables on huge pages] in pools/host_tables.h): blocks of
// 2 MiB or more on their own aligned mappings with the huge-page hint, smaller ones on the heap,
// and the slice index and node slabs keeping every entry as they grow onto such blocks.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "pools/host_tables.h"
#include "pools/slab.h"
#include "pools/slice_index.h"

using namespace poolcuda;

namespace {

// The VmFlags line of the mapping that holds `address` in /proc/self/smaps ("" if none).
std::string vm_flags_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > 8) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Whether this kernel takes the huge-page hint at all.
bool kernel_has_thp() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string setting;
  std::getline(enabled, setting);
  return !setting.empty() && setting.find("[never]") == std::string::npos;
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("a table of 2 MiB or more is 2 MiB-aligned, writable and marked for huge pages") {
  const std::size_t bytes = kHugeTableBytes + 4096;  // not a multiple: the rest is rounded up
  void* block = allocate_table(bytes);
  REQUIRE(block != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(block) % kHugeTableBytes == 0);
  std::memset(block, 0xab, bytes);
  CHECK(static_cast<unsigned char*>(block)[bytes - 1] == 0xab);
  if (kernel_has_thp()) CHECK(vm_flags_of(block).find(" hg") != std::string::npos);
  const char* last = static_cast<const char*>(block) + 2 * kHugeTableBytes - 4096;
  CHECK(!vm_flags_of(last).empty());  // rounded up to whole huge pages
  free_table(block, bytes);
  CHECK(vm_flags_of(block).empty());  // the whole mapping went back, to its last page
  CHECK(vm_flags_of(last).empty());
}

TEST_CASE("a small table comes from the heap, 64-byte aligned, without the hint") {
  void* block = allocate_table(1000);
  REQUIRE(block != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(block) % 64 == 0);
  std::memset(block, 1, 1000);
  CHECK(vm_flags_of(block).find(" hg") == std::string::npos);
  free_table(block, 1000);
  free_table(nullptr, kHugeTableBytes);  // ignored
}

TEST_CASE("a table the system cannot map throws bad_alloc") {
  CHECK_THROWS_AS(allocate_table(std::size_t{1} << 62), std::bad_alloc);
  CHECK_THROWS_AS(allocate_table(~std::size_t{0}), std::bad_alloc);
}

TEST_CASE("the slice index keeps every entry as its table grows onto huge pages and clears") {
  SliceIndex index;
  std::vector<Slice> nodes(16);
  constexpr std::size_t kEntries = 300000;  // a table of 8 MiB at a load factor of a half
  for (std::size_t i = 0; i < kEntries; ++i) index.insert(512 * (i + 1), &nodes[i % 16]);
  REQUIRE(index.size() == kEntries);
  for (std::size_t i = 0; i < kEntries; ++i)
    REQUIRE(index.find(512 * (i + 1)) == &nodes[i % 16]);
  for (std::size_t i = 0; i < kEntries; i += 2)
    REQUIRE(index.erase(512 * (i + 1)) == &nodes[i % 16]);
  CHECK(index.size() == kEntries / 2);
  CHECK(index.find(512) == nullptr);
  CHECK(index.find(1024) == &nodes[1]);
  index.clear();
  CHECK(index.size() == 0);
  CHECK(index.find(1024) == nullptr);
  index.insert(1024, &nodes[3]);
  CHECK(index.find(1024) == &nodes[3]);
}

TEST_CASE("a node slab hands out distinct nodes across chunks of every size, reusing freed ones") {
  struct Node {
    std::uint64_t a, b, c;
  };
  NodeSlab<Node> slab;
  std::vector<Node*> made;
  std::set<Node*> distinct;
  for (std::uint64_t i = 0; i < 400000; ++i) {  // about 9 MiB of nodes: several huge chunks
    Node* n = slab.create(Node{i, i * 3, ~i});
    made.push_back(n);
    distinct.insert(n);
  }
  CHECK(distinct.size() == made.size());
  CHECK(slab.live() == made.size());
  for (std::uint64_t i = 0; i < made.size(); i += 997) {
    REQUIRE(made[i]->a == i);
    REQUIRE(made[i]->c == ~i);
  }
  Node* freed = made[12345];
  slab.destroy(freed);
  CHECK(slab.create(Node{1, 2, 3}) == freed);  // the free list first
  // Then the newest chunk's nodes never handed out: none of them is a live one.
  for (int i = 0; i < 1000; ++i) REQUIRE(distinct.insert(slab.create(Node{4, 5, 6})).second);
  slab.reset();
  CHECK(slab.live() == 0);
  Node* fresh = slab.create(Node{7, 8, 9});
  CHECK(fresh->b == 8);
}

TEST_CASE("a slab's first chunk made ahead serves the first nodes, and is made once") {
  struct Node {
    std::uint64_t a, b;
  };
  NodeSlab<Node, 64> slab;
  slab.make_first_chunk();
  CHECK(slab.chunks() == 1);
  CHECK(slab.live() == 0);
  slab.make_first_chunk();  // a second call makes no second chunk
  CHECK(slab.chunks() == 1);
  Node* first = slab.create(Node{1, 2});
  slab.make_first_chunk();  // nor one made after the first node
  for (std::uint64_t i = 1; i < 64; ++i) {
    Node* n = slab.create(Node{i, i});
    // One chunk's nodes go out in address order, from its first.
    REQUIRE(reinterpret_cast<std::uintptr_t>(n) - reinterpret_cast<std::uintptr_t>(first) ==
            i * sizeof(Node));
  }
  CHECK(slab.chunks() == 1);
  CHECK(first->b == 2);
  slab.create(Node{0, 0});  // the 65th node needs the second chunk
  CHECK(slab.chunks() == 2);
  CHECK(slab.live() == 65);
}

}  // TEST_SUITE
