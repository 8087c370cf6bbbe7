// The per-device memory budget of the `limit` key (Note [Budget] in budget.cpp): every byte of
// device memory the library takes on the program's behalf (pool pages, allocations it passes to
// the driver, managed slabs) is charged to the device before the driver is asked for it, and a
// charge over the budget is refused.
//
// Depends on config.h and the log.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.h"
#include "pools/report_tree.h"

namespace poolcuda::budget {

// Charges `bytes` on `device`; false (nothing charged) when that would exceed its budget. The
// first refusal on a device is logged; every refusal is counted. Always true on a device without
// a budget.
bool charge(int device, std::uint64_t bytes);
// As charge(), for memory the library can do without (a page wider than the request needs, tried
// before the one it does): a refusal is not the program's, so it is neither logged nor counted.
bool charge_if_room(int device, std::uint64_t bytes);
void uncharge(int device, std::uint64_t bytes);

// A charge made for one driver allocation, taken back when the scope ends unless kept (the
// allocation succeeded). A thread cancelled inside the driver's call unwinds through the scope
// (Note [Cancellation] in pools/no_cancel.h): a charge taken back only after the call returned
// stayed on the books for good, and the budget then refused what the device had room for.
class ChargeScope {
 public:
  ChargeScope(int device, std::uint64_t bytes) : device_(device), bytes_(bytes) {}
  ~ChargeScope() {
    if (bytes_ != 0) uncharge(device_, bytes_);
  }
  ChargeScope(const ChargeScope&) = delete;
  ChargeScope& operator=(const ChargeScope&) = delete;
  void keep() { bytes_ = 0; }

 private:
  int device_;
  std::uint64_t bytes_;
};

// What is left of the device's budget; nullopt when it has none.
std::optional<std::uint64_t> room(int device);
// The device's budget; nullopt when it has none.
std::optional<std::uint64_t> limit(int device);

// An allocation passed to the driver, charged: remembered so that its free, or the destroy of
// the program's `context` it was made in (null: the primary context), uncharges it.
void passed_through(int device, void* ptr, std::uint64_t bytes, const void* context);

// The charge of a passed-through allocation, taken off the books just before the driver's free
// of it: once that free is done the driver may give the address to another thread's
// allocation, whose passed_through a later look-up by address would undo.
struct PassedCharge {
  void* ptr = nullptr;
  int device = -1;  // -1: `ptr` was not passed through (or not charged)
  std::uint64_t bytes = 0;
  std::uint64_t resets = 0;  // the device's resets when it was taken
  const void* context = nullptr;
};
PassedCharge take_through(void* ptr);
// After the driver's free: uncharged when it freed the memory, else remembered again; neither
// when the device was reset meanwhile (the reset forgot the charge).
void settle_through(const PassedCharge& charge, bool freed);

// The charges of what was passed through in a context of the program's, taken off the books
// before its cuCtxDestroy (a context made meanwhile may get the same handle), to be settled by
// settle_through() with the destroy's outcome.
std::vector<PassedCharge> take_context(const void* context);

// cudaDeviceReset freed everything on the device: nothing is charged any more.
void forget_device(int device);

// Counts `bytes` the library just took from the driver on `device` for a pool's page or a
// managed slab (with or without a budget), after the driver's allocation returned and before
// the memory reaches a pool; growth_so_far() is the sum so far, which never goes down. A
// cudaMemGetInfo reads it before the driver's figure and again after the pools' idle bytes
// (Note [Memory on its way to the driver] in pooling.cpp).
void count_growth(int device, std::uint64_t bytes);
std::uint64_t growth_so_far(int device);

// Bytes charged to `device`'s budget now (0 without one), read before the pools' idle bytes
// for adjust_memory_info.
std::uint64_t charged_now(int device);

// cudaMemGetInfo under a budget: the budget as the total, what is left of it (plus `idle`
// bytes still charged that the library gives back: idle pooled pages, pages queued for the
// driver) as free, never more than the driver says nor than the budget; `charged` is
// charged_now() from before `idle` was read.
void adjust_memory_info(int device, std::uint64_t charged, std::uint64_t idle,
                        std::size_t* free_bytes,
                        std::size_t* total_bytes);

// The device's budget part of the report; nullopt when it has no budget.
std::optional<ReportSection> describe(int device);

}  // namespace poolcuda::budget
