// FenceQueue: the epochs of Note [Free fences] (memory_manager.cpp). Freed slices join the open
// epoch through their intrusive `next_pending` link (no allocation per free); closing an epoch
// records one Device fence; closed epochs are reaped oldest first once their fence has passed,
// or waited for (a bounded wait) oldest first when the pending bytes exceed their bound
// (Note [Free fences]).
// Not thread-safe: the MemoryManager's lock covers it. Depends on pool.h and device.h.
#pragma once

#include <cstdint>
#include <deque>

#include "pools/device.h"
#include "pools/pool.h"

namespace poolcuda {

class FenceQueue {
 public:
  void add(Slice* slice) {
    slice->next_pending = nullptr;
    if (open_.tail != nullptr) open_.tail->next_pending = slice;
    else open_.head = slice;
    open_.tail = slice;
    ++open_.count;
    open_.bytes += slice->size;
  }

  std::uint32_t open_count() const { return open_.count; }
  std::uint64_t open_bytes() const { return open_.bytes; }
  bool any() const { return open_.count != 0 || !closed_.empty(); }
  bool any_closed() const { return !closed_.empty(); }

  // Closes the open epoch with a fence. False when it is empty or the device refused a fence
  // (kNoFence: the epoch stays open and is retried at the next close).
  bool close(Device& device) {
    if (open_.count == 0) return false;
    const FenceHandle fence = device.fence_record();
    if (fence == kNoFence) return false;
    open_.fence = fence;
    closed_.push_back(open_);
    open_ = Epoch{};
    return true;
  }

  // Gives back the slices of every closed epoch whose fence has passed, oldest first, and stops
  // at the first that has not (a later fence never passes before an earlier one: each is
  // recorded after all work issued before it). Never blocks. Returns slices given back.
  template <typename GiveBack>
  std::uint64_t reap(Device& device, GiveBack&& give_back) {
    std::uint64_t returned = 0;
    while (!closed_.empty() && device.fence_passed(closed_.front().fence))
      returned += retire_front(device, give_back);
    return returned;
  }

  // Waits at most `max_microseconds` for the oldest closed epoch's fence only; when it passed,
  // gives that epoch's slices back and returns true. False (nothing changes) when no epoch is
  // closed or the bound expired first. The bound on pending bytes (Note [Free fences]).
  template <typename GiveBack>
  bool wait_oldest_for(Device& device, std::uint32_t max_microseconds, GiveBack&& give_back) {
    if (closed_.empty()) return false;
    if (!device.fence_wait_for(closed_.front().fence, max_microseconds)) return false;
    retire_front(device, give_back);
    return true;
  }

  // Waits, without limit, for every closed epoch's fence, then gives its slices back
  // (out-of-memory path and drain_fences()).
  template <typename GiveBack>
  std::uint64_t wait_all(Device& device, GiveBack&& give_back) {
    std::uint64_t returned = 0;
    while (!closed_.empty()) {
      device.fence_wait(closed_.front().fence);
      returned += retire_front(device, give_back);
    }
    return returned;
  }

  // Drops every epoch (the device's memory is gone): each closed epoch's fence is destroyed,
  // so the device's fence records are not leaked; no other device call.
  void forget(Device& device) {
    for (const Epoch& epoch : closed_) device.fence_destroy(epoch.fence);
    open_ = Epoch{};
    closed_.clear();
  }

  template <typename Fn>
  void for_each_pending(Fn&& fn) const {
    for (Slice* s = open_.head; s != nullptr; s = s->next_pending) fn(s);
    for (const Epoch& e : closed_)
      for (Slice* s = e.head; s != nullptr; s = s->next_pending) fn(s);
  }

 private:
  struct Epoch {
    FenceHandle fence = kNoFence;
    Slice* head = nullptr;
    Slice* tail = nullptr;
    std::uint32_t count = 0;
    std::uint64_t bytes = 0;
  };

  template <typename GiveBack>
  std::uint64_t retire_front(Device& device, GiveBack& give_back) {
    Epoch epoch = closed_.front();
    closed_.pop_front();
    device.fence_destroy(epoch.fence);
    for (Slice* s = epoch.head; s != nullptr;) {
      Slice* next = s->next_pending;  // give_back may recycle s
      give_back(s);
      s = next;
    }
    return epoch.count;
  }

  Epoch open_;
  std::deque<Epoch> closed_;
};

}  // namespace poolcuda
