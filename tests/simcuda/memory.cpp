// Device memory of the stand-in: one arena per device, a large PROT_NONE address range reserved
// with mmap at first use, whose pages are made accessible only while an allocation covers them
// (so a "device pointer" is real host memory while live, faults after free, and never looks like
// an ordinary heap pointer). Each device has a capacity (SIMCUDA_DEVICE_MEMORY) that every
// allocation kind (cudaMalloc, cuMemAlloc, managed, async, graph memory) draws from.
// Also pinned host memory. Leaf module: takes only its own mutex (and, around a fork, the state
// mutex before it: Note [Forks while another thread allocates]), depends on core.h's config.
#include "core.h"

#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace poolcuda::sim {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kCharge = 256;  // capacity is charged in 256-byte units (cudaMalloc alignment)

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct Live {
  size_t size;
  size_t span;
  AllocKind kind;
  uint64_t id;
};

struct Arena {
  bool reserved = false;
  bool failed = false;
  uintptr_t base = 0;
  size_t span = 0;
  size_t used = 0;                           // charged bytes
  std::map<uintptr_t, size_t> free_ranges;  // start -> length, page multiples, coalesced
  std::map<uintptr_t, Live> live;           // base -> allocation
};

struct Memory {
  std::mutex m;
  std::vector<Arena> arenas;
  uint64_t next_id = 1;
  uint64_t live_count = 0;
  uint64_t live_bytes = 0;
  uint64_t live_bytes_peak = 0;  // high-water mark of live_bytes since the last counter reset
  std::map<uintptr_t, std::pair<size_t, unsigned>> host;  // pinned host blocks
};

Memory& memory();

// Note [Forks while another thread allocates]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A child forked while another thread of its parent was inside an allocation or a free inherits
// the memory mutex (or the state mutex, which an allocation takes first) locked by a thread it
// does not have, and hung at its own first allocation. A real runtime makes no promise to a
// forked child, but the fork tests ask what the allocator above does there, not what a runtime
// does; so the fork waits for both mutexes, in lock order, and lets them go on both sides. The
// wait is bounded (kForkLockWaitMillis): a signal handler that forks while its own thread holds
// one would otherwise wait for itself; the child then keeps the old risk, nothing worse.
constexpr long kForkLockWaitMillis = 2000;
thread_local bool t_fork_holds_state = false;
thread_local bool t_fork_holds_memory = false;

// Locks `m` within the bound left after `*waited_ms`, by tries a millisecond apart: a fork from a
// signal handler runs this too, so it neither allocates nor waits without a bound.
bool lock_within_bound(std::mutex& m, long* waited_ms) {
  for (;;) {
    if (m.try_lock()) return true;
    if (*waited_ms >= kForkLockWaitMillis) return false;
    const timespec one_ms{0, 1000000};
    ::nanosleep(&one_ms, nullptr);
    ++*waited_ms;
  }
}

void before_fork() {
  long waited_ms = 0;
  t_fork_holds_state = lock_within_bound(state_mutex(), &waited_ms);
  t_fork_holds_memory = t_fork_holds_state && lock_within_bound(memory().m, &waited_ms);
}

void after_fork() {
  if (t_fork_holds_memory) memory().m.unlock();
  if (t_fork_holds_state) state_mutex().unlock();
  t_fork_holds_memory = t_fork_holds_state = false;
}

Memory& memory() {
  static auto* m = [] {
    auto* mem = new Memory;  // never destroyed: workers may free memory during exit
    mem->arenas.resize(static_cast<size_t>(config().devices));
    ::pthread_atfork(&before_fork, &after_fork, &after_fork);
    return mem;
  }();
  return *m;
}

// Reserves the device's address range: 4x its capacity plus 4 GiB, so page rounding and
// fragmentation never exhaust addresses before capacity. Costs nothing until pages are used.
bool reserve(Arena& a) {
  if (a.reserved) return true;
  if (a.failed) return false;
  size_t span = round_up(config().memory, kPage) * 4 + (size_t{4} << 30);
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    a.failed = true;
    std::fprintf(stderr, "simcuda: cannot reserve %zu bytes of address space\n", span);
    return false;
  }
  a.reserved = true;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.span = span;
  a.free_ranges.emplace(a.base, span);
  return true;
}

Arena* arena_of(Memory& mem, uintptr_t p, int* device) {
  for (size_t i = 0; i < mem.arenas.size(); ++i) {
    Arena& a = mem.arenas[i];
    if (a.reserved && p >= a.base && p < a.base + a.span) {
      if (device) *device = static_cast<int>(i);
      return &a;
    }
  }
  return nullptr;
}

const std::pair<const uintptr_t, Live>* find_live(const Arena& a, uintptr_t p) {
  auto it = a.live.upper_bound(p);
  if (it == a.live.begin()) return nullptr;
  --it;
  if (p >= it->first && p < it->first + std::max<size_t>(it->second.size, 1)) return &*it;
  return nullptr;
}

void release_span(Arena& a, uintptr_t start, size_t span) {
  mprotect(reinterpret_cast<void*>(start), span, PROT_NONE);
  madvise(reinterpret_cast<void*>(start), span, MADV_DONTNEED);
  auto next = a.free_ranges.lower_bound(start);
  if (next != a.free_ranges.end() && start + span == next->first) {
    span += next->second;
    next = a.free_ranges.erase(next);
  }
  if (next != a.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += span;
      return;
    }
  }
  a.free_ranges.emplace(start, span);
}

void forget(Memory& mem, Arena& a, std::map<uintptr_t, Live>::iterator it) {
  a.used -= round_up(it->second.size, kCharge);
  mem.live_count -= 1;
  mem.live_bytes -= it->second.size;
  release_span(a, it->first, it->second.span);
  a.live.erase(it);
}

// Maps a new allocation of `size` bytes (non-zero) in `a` and books it; the caller checked the
// capacity. False when the address range has no room (or the pages cannot be made accessible).
bool place(Memory& mem, Arena& a, size_t size, AllocKind kind, void** out, uint64_t* id) {
  if (!reserve(a)) return false;
  size_t span = round_up(size, kPage);
  for (auto it = a.free_ranges.begin(); it != a.free_ranges.end(); ++it) {
    if (it->second < span) continue;
    uintptr_t start = it->first;
    size_t rest = it->second - span;
    a.free_ranges.erase(it);
    if (rest) a.free_ranges.emplace(start + span, rest);
    if (mprotect(reinterpret_cast<void*>(start), span, PROT_READ | PROT_WRITE) != 0) {
      release_span(a, start, span);
      return false;
    }
    uint64_t new_id = mem.next_id++;
    a.live.emplace(start, Live{size, span, kind, new_id});
    a.used += round_up(size, kCharge);
    mem.live_count += 1;
    mem.live_bytes += size;
    mem.live_bytes_peak = std::max(mem.live_bytes_peak, mem.live_bytes);
    if (id) *id = new_id;
    *out = reinterpret_cast<void*>(start);
    return true;
  }
  return false;
}

// Whether `size` more bytes fit in `a` once `released` charged bytes are given back.
bool fits(const Arena& a, size_t size, size_t released) {
  return size <= config().memory &&
         round_up(size, kCharge) <= config().memory - (a.used - released);
}

}  // namespace

cudaError_t mem_alloc(int device, size_t size, AllocKind kind, void** out, uint64_t* id) {
  if (!out) return cudaErrorInvalidValue;
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  *out = nullptr;
  if (size == 0) return cudaSuccess;
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  Arena& a = mem.arenas[static_cast<size_t>(device)];
  if (!fits(a, size, 0)) return cudaErrorMemoryAllocation;
  return place(mem, a, size, kind, out, id) ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t mem_replace(int device, const void* old, uint64_t old_id, size_t size, AllocKind kind,
                        void** out, uint64_t* id) {
  if (!out) return cudaErrorInvalidValue;
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  Arena& a = mem.arenas[static_cast<size_t>(device)];
  auto it = a.live.find(reinterpret_cast<uintptr_t>(old));
  if (old == nullptr || it == a.live.end() || it->second.id != old_id) it = a.live.end();
  const size_t released = it == a.live.end() ? 0 : round_up(it->second.size, kCharge);
  if (size > 0 && !fits(a, size, released)) return cudaErrorMemoryAllocation;
  // The new pages are found while the old are still mapped (the range has room for both), so a
  // refusal leaves the old allocation exactly as it was; the peak never sees the two at once.
  void* placed = nullptr;
  uint64_t placed_id = 0;
  const uint64_t peak = mem.live_bytes_peak;
  if (size > 0 && !place(mem, a, size, kind, &placed, &placed_id))
    return cudaErrorMemoryAllocation;
  if (it != a.live.end()) forget(mem, a, it);
  mem.live_bytes_peak = std::max(peak, mem.live_bytes);
  *out = placed;
  if (id) *id = placed_id;
  return cudaSuccess;
}

cudaError_t mem_free(const void* ptr, uint64_t id, AllocInfo* freed) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  int device = -1;
  Arena* a = arena_of(mem, p, &device);
  if (!a) return cudaErrorInvalidValue;
  auto it = a->live.find(p);
  if (it == a->live.end()) return cudaErrorInvalidValue;
  if (id && it->second.id != id) return cudaErrorInvalidValue;
  if (freed) *freed = AllocInfo{it->first, it->second.size, device, it->second.kind, it->second.id};
  forget(mem, *a, it);
  return cudaSuccess;
}

bool mem_find(const void* ptr, AllocInfo* out) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  int device = -1;
  Arena* a = arena_of(mem, reinterpret_cast<uintptr_t>(ptr), &device);
  if (!a) return false;
  const auto* live = find_live(*a, reinterpret_cast<uintptr_t>(ptr));
  if (!live) return false;
  if (out) *out = AllocInfo{live->first, live->second.size, device, live->second.kind, live->second.id};
  return true;
}

bool mem_ipc_handle(const void* ptr, unsigned char handle[64]) {
  AllocInfo info;
  if (!mem_find(ptr, &info) || info.kind != AllocKind::device) return false;
  std::memset(handle, 0, 64);
  std::memcpy(handle, "simipc", 6);
  const uint64_t base = info.base;
  std::memcpy(handle + 8, &base, sizeof base);
  std::memcpy(handle + 16, &info.id, sizeof info.id);
  return true;
}

bool mem_in_device_range(const void* ptr, int* device) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  return arena_of(mem, reinterpret_cast<uintptr_t>(ptr), device) != nullptr;
}

cudaError_t mem_check(const void* ptr, size_t n) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Arena* a = arena_of(mem, p, nullptr);
  if (!a) return cudaSuccess;  // host memory: the caller vouches for it
  const auto* live = find_live(*a, p);
  if (!live || p + n > live->first + live->second.size) return cudaErrorInvalidValue;
  return cudaSuccess;
}

void mem_free_all(int device) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  if (!valid_device(device)) return;
  Arena& a = mem.arenas[static_cast<size_t>(device)];
  while (!a.live.empty()) forget(mem, a, a.live.begin());
}

void mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  size_t used = valid_device(device) ? mem.arenas[static_cast<size_t>(device)].used : 0;
  if (free_bytes) *free_bytes = config().memory - used;
  if (total_bytes) *total_bytes = config().memory;
}

uint64_t mem_live_allocations() {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  return mem.live_count;
}

uint64_t mem_live_bytes() {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  return mem.live_bytes;
}

uint64_t mem_live_bytes_peak() {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  return mem.live_bytes_peak;
}

void mem_reset_live_bytes_peak() {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  mem.live_bytes_peak = mem.live_bytes;
}

cudaError_t host_alloc(size_t size, unsigned flags, void** out) {
  if (!out) return cudaErrorInvalidValue;
  *out = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = std::aligned_alloc(kPage, round_up(size, kPage));
  if (!p) return cudaErrorMemoryAllocation;
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  mem.host.emplace(reinterpret_cast<uintptr_t>(p), std::make_pair(size, flags));
  *out = p;
  return cudaSuccess;
}

cudaError_t host_free(void* ptr) {
  if (!ptr) return cudaSuccess;
  Memory& mem = memory();
  {
    std::lock_guard lock(mem.m);
    auto it = mem.host.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == mem.host.end()) return cudaErrorInvalidValue;
    mem.host.erase(it);
  }
  std::free(ptr);
  return cudaSuccess;
}

bool host_find(const void* ptr, unsigned* flags) {
  Memory& mem = memory();
  std::lock_guard lock(mem.m);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = mem.host.upper_bound(p);
  if (it == mem.host.begin()) return false;
  --it;
  if (p >= it->first + std::max<size_t>(it->second.first, 1)) return false;
  if (flags) *flags = it->second.second;
  return true;
}

}  // namespace poolcuda::sim
