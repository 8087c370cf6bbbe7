// The host running out of memory for the pools' records (a program under a tight RLIMIT_AS):
// the records of a new page, and the tables of a new managed slab, are made before its memory
// is taken, so a failure to make them leaves no device memory that nothing knows of
// (Pool::new_page, ManagedSlabs::populate), and the next request works (a slab slot used to
// keep its marks without its sizes, and the next allocation there crashed). This binary
// replaces the aligned operator new, from which the records' slabs and the pointer index grow,
// and operator new[], from which the slabs' tables come, so that it can refuse on demand.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "pools/host_device.h"
#include "pools/memory_manager.h"
#include "tests/unit/managed_test_util.h"

namespace {

std::atomic<bool> g_refuse_aligned{false};
// operator new[] calls still allowed before it refuses; negative: no limit.
std::atomic<int> g_arrays_allowed{-1};

}  // namespace

void* operator new[](std::size_t bytes) {
  for (int allowed = g_arrays_allowed.load(); allowed >= 0;) {
    if (allowed == 0) throw std::bad_alloc();
    if (g_arrays_allowed.compare_exchange_weak(allowed, allowed - 1)) break;
  }
  void* block = std::malloc(bytes == 0 ? 1 : bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}
void operator delete[](void* block) noexcept { std::free(block); }
void operator delete[](void* block, std::size_t) noexcept { std::free(block); }

void* operator new(std::size_t bytes, std::align_val_t alignment) {
  if (g_refuse_aligned.load()) throw std::bad_alloc();
  const auto align = static_cast<std::size_t>(alignment);
  void* block = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}
void operator delete(void* block, std::align_val_t) noexcept { std::free(block); }
void operator delete(void* block, std::size_t, std::align_val_t) noexcept { std::free(block); }

using namespace poolcuda;

TEST_CASE("a page whose records the host cannot make takes no device memory") {
  HostDevice device(256 * GiB, 512);  // host pages are reserved, never touched
  MemoryManager manager(device, ManagerOptions{});
  std::vector<DevicePtr> held;
  bool refused = false;
  // Each 64 MiB allocation takes a page of its own; sooner or later one needs a new chunk of
  // records, and the host refuses it.
  for (int i = 0; i < 3000 && !refused; ++i) {
    const std::uint64_t free_before = device.memory_info().free_bytes;
    g_refuse_aligned.store(true);
    try {
      const Reservation r = manager.allocate(64 << 20);
      g_refuse_aligned.store(false);
      REQUIRE(r.ptr != 0);
      held.push_back(r.ptr);
    } catch (const std::bad_alloc&) {
      g_refuse_aligned.store(false);
      refused = true;
      CHECK(device.memory_info().free_bytes == free_before);
    }
  }
  CHECK(refused);
  for (DevicePtr ptr : held) manager.free(ptr);
  manager.drain_fences();
  manager.cleanup(true);
  CHECK(device.memory_info().free_bytes == 256 * GiB);
}

TEST_CASE("a managed slab whose tables the host cannot make takes no memory, and the next works") {
  test::Chain chain(4 * KiB, 4);
  const DevicePtr first = chain.allocate(4 * KiB);  // fills the first slab
  const std::uint64_t free_before = chain.device.memory_info().free_bytes;
  // The slot's marks are made, its sizes are not (the host refuses the second array).
  g_arrays_allowed.store(1);
  bool refused = false;
  try {
    (void)chain.slabs.allocate(4 * KiB, test::kGranule);
  } catch (const std::bad_alloc&) {
    refused = true;
  }
  g_arrays_allowed.store(-1);
  CHECK(refused);
  CHECK(chain.device.memory_info().free_bytes == free_before);
  const DevicePtr second = chain.allocate(4 * KiB);
  test::fill(second, 4 * KiB, 7);
  CHECK(test::all_bytes(second, 4 * KiB, 7));
  CHECK(chain.slabs.free(second) == FreeOutcome::freed);
  CHECK(chain.slabs.free(first) == FreeOutcome::freed);
}
