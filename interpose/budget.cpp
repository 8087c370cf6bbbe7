// The memory budget (see budget.h).
//
// Note [Budget]
// ~~~~~~~~~~~~~
// GPU-sharing tools give each process a budget of device memory and make cudaMemGetInfo show
// it as the device's size. Under `limit` the library does the same for what it holds: a charge
// happens before every driver allocation the library makes for the program (a page, a managed
// slab, a request it passes through) and is given back once the driver has the memory back. A
// page the pools give up reaches the driver through the release thread, whose free waits for
// the device; it used to be uncharged as it was queued, and while it waited behind a long kernel
// another thread's request fitted the budget and the driver served it beside the page (52 MiB
// held under a 32 MiB budget in a two-thread program; plain CUDA on a 32 MiB device refused
// it). So the release thread uncharges a page when its free returns, and a request that needs
// that room waits for it as on a full device: recovery's flush waits for the pages on their way.
// A page the budget refuses looks to the pools like a full device, so out-of-memory recovery
// first returns idle pages and waits for freed memory, exactly as on a full device, before the
// program sees cudaErrorMemoryAllocation. A page wider than its request needs (a widened or
// rounded page, Device::allocate_if_room) is charged with charge_if_room: its refusal is
// neither logged nor counted, since the pool asks for the narrower page next and only that
// one's refusal is the program's. Allocations made behind the library's back (cudaMallocAsync,
// driver calls of other contexts) are not charged.
#include "interpose/budget.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "interpose/lifecycle.h"
#include "interpose/log.h"
#include "pools/lock_order.h"

namespace poolcuda::budget {

namespace {

constexpr int kMaxDevices = 64;

struct Account {
  std::atomic<std::uint64_t> charged{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> grown{0};  // count_growth(): never goes down
};

struct State {
  Account accounts[kMaxDevices];
  RankedMutex mutex{LockRank::device};
  struct Passed {
    int device;
    std::uint64_t bytes;
    const void* context;  // a context of the program's, or null: the device's primary one
  };
  std::unordered_map<void*, Passed> passed;
  std::uint64_t resets[kMaxDevices] = {};  // forget_device() calls, under `mutex`
};

State& state() {
  static State* s = new State;  // never destroyed (Note [Exit] in lifecycle.cpp)
  return *s;
}

bool in_range(int device) { return device >= 0 && device < kMaxDevices; }

std::optional<std::uint64_t> limit_of(int device) { return config().limit.for_device(device); }

bool charge_bytes(int device, std::uint64_t bytes, bool refusal_counts) {
  if (!in_range(device)) return true;
  const std::optional<std::uint64_t> limit = limit_of(device);
  Account& account = state().accounts[device];
  if (!limit) {
    account.charged.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  std::uint64_t now = account.charged.load(std::memory_order_relaxed);
  do {
    if (bytes > *limit || now > *limit - bytes) {
      if (refusal_counts && account.refused.fetch_add(1, std::memory_order_relaxed) == 0)
        log_format(LogLevel::basic,
                   "device %d: %llu B more would exceed the budget (limit %llu B, %llu B held): "
                   "idle memory goes back first, and what still does not fit fails as out of "
                   "memory",
                   device, static_cast<unsigned long long>(bytes),
                   static_cast<unsigned long long>(*limit),
                   static_cast<unsigned long long>(now));
      return false;
    }
  } while (!account.charged.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  return true;
}

}  // namespace

bool charge(int device, std::uint64_t bytes) { return charge_bytes(device, bytes, true); }

bool charge_if_room(int device, std::uint64_t bytes) {
  return charge_bytes(device, bytes, false);
}

std::optional<std::uint64_t> limit(int device) {
  return in_range(device) ? limit_of(device) : std::nullopt;
}

std::optional<std::uint64_t> room(int device) {
  if (!in_range(device)) return std::nullopt;
  const std::optional<std::uint64_t> limit = limit_of(device);
  if (!limit) return std::nullopt;
  const std::uint64_t charged = state().accounts[device].charged.load(std::memory_order_relaxed);
  return charged < *limit ? *limit - charged : 0;
}

void uncharge(int device, std::uint64_t bytes) {
  if (!in_range(device)) return;
  std::atomic<std::uint64_t>& charged = state().accounts[device].charged;
  std::uint64_t now = charged.load(std::memory_order_relaxed);
  // Never below zero: a reset may have forgotten the charge already.
  while (!charged.compare_exchange_weak(now, now > bytes ? now - bytes : 0,
                                        std::memory_order_relaxed)) {
  }
}

void passed_through(int device, void* ptr, std::uint64_t bytes, const void* context) {
  State& s = state();
  std::lock_guard hold(s.mutex);
  s.passed[ptr] = {device, bytes, context};
}

PassedCharge take_through(void* ptr) {
  State& s = state();
  std::lock_guard hold(s.mutex);
  auto it = s.passed.find(ptr);
  if (it == s.passed.end()) return PassedCharge{ptr};
  const int device = it->second.device;
  const PassedCharge taken{ptr, device, it->second.bytes, s.resets[device], it->second.context};
  s.passed.erase(it);
  return taken;
}

std::vector<PassedCharge> take_context(const void* context) {
  State& s = state();
  std::lock_guard hold(s.mutex);
  std::vector<PassedCharge> taken;
  std::erase_if(s.passed, [&](const auto& item) {
    if (item.second.context != context) return false;
    taken.push_back(PassedCharge{item.first, item.second.device, item.second.bytes,
                                 s.resets[item.second.device], context});
    return true;
  });
  return taken;
}

void settle_through(const PassedCharge& charge, bool freed) {
  if (charge.device < 0) return;
  State& s = state();
  std::lock_guard hold(s.mutex);
  // A reset meanwhile forgot the charge and the record; the device's charges now are others'.
  if (s.resets[charge.device] != charge.resets) return;
  if (freed) {
    uncharge(charge.device, charge.bytes);
  } else {
    // Not over a record made meanwhile: the address can only be another allocation's if this
    // one was freed after all.
    s.passed.try_emplace(charge.ptr, State::Passed{charge.device, charge.bytes, charge.context});
  }
}

void forget_device(int device) {
  if (!in_range(device)) return;
  State& s = state();
  std::lock_guard hold(s.mutex);
  std::erase_if(s.passed, [&](const auto& item) { return item.second.device == device; });
  s.accounts[device].charged.store(0, std::memory_order_relaxed);
  ++s.resets[device];
}

void count_growth(int device, std::uint64_t bytes) {
  if (in_range(device)) state().accounts[device].grown.fetch_add(bytes, std::memory_order_acq_rel);
}

std::uint64_t growth_so_far(int device) {
  return in_range(device) ? state().accounts[device].grown.load(std::memory_order_acquire) : 0;
}

std::uint64_t charged_now(int device) {
  return in_range(device) ? state().accounts[device].charged.load(std::memory_order_acquire) : 0;
}

void adjust_memory_info(int device, std::uint64_t charged, std::uint64_t idle,
                        std::size_t* free_bytes, std::size_t* total_bytes) {
  if (!in_range(device)) return;
  const std::optional<std::uint64_t> limit = limit_of(device);
  if (!limit) return;
  // Never more than the budget: `charged` was read before `idle`, so a page given back between
  // the two reads counts in neither (another order counted it twice, and free passed total).
  const std::uint64_t left =
      std::min(*limit, (charged < *limit ? *limit - charged : 0) + idle);
  if (free_bytes != nullptr && left < *free_bytes) *free_bytes = static_cast<std::size_t>(left);
  if (total_bytes != nullptr && *limit < *total_bytes)
    *total_bytes = static_cast<std::size_t>(*limit);
}

std::optional<ReportSection> describe(int device) {
  const std::optional<std::uint64_t> limit = in_range(device) ? limit_of(device) : std::nullopt;
  if (!limit) return std::nullopt;
  const Account& account = state().accounts[device];
  ReportSection section{"budget", "budget", {}, {}, {}};
  section.add("limit", "limit", ReportValue::of(Unit::bytes, *limit));
  section.add("held", "held", ReportValue::of(Unit::bytes, account.charged.load()));
  section.add("refused", "refused", ReportValue::of(Unit::count, account.refused.load()));
  return section;
}

}  // namespace poolcuda::budget
