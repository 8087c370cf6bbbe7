// FenceQueue: the epochs of Note [Free fences] (memory_manager.cpp). Freed slices join the open
// epoch through their intrusive `next_pending` link (no allocation per free); closing an epoch
// records one Device fence; closed epochs are reaped oldest first once their fence has passed.
// A thread that must wait for a fence borrows a ticket for the oldest closed epoch, releases the
// manager's lock, waits, and hands the ticket back under the lock: a ticketed fence is never
// destroyed while it is waited on, even if the epoch is reaped or forgotten meanwhile
// (Note [Outside the lock] in memory_manager.cpp). A stream-ordered free waits apart, in the
// lane of its stream and freeing thread, for the fence recorded on that stream alone at its free
// (Note [Stream-ordered frees] in memory_manager.cpp); a lane is reaped oldest first too.
// Not thread-safe: the MemoryManager's lock covers it. Depends on pool.h, device.h and
// work_since_free.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

#include "pools/device.h"
#include "pools/pool.h"
#include "pools/work_since_free.h"

namespace poolcuda {

// A borrowed view of a closed epoch's fence, valid until given back.
struct FenceTicket {
  std::uint64_t epoch = 0;  // 0: no ticket
  FenceHandle fence = kNoFence;
  explicit operator bool() const { return epoch != 0; }
};

class FenceQueue {
 public:
  void add(Slice* slice) {
    slice->next_pending = nullptr;
    if (open_.tail != nullptr) open_.tail->next_pending = slice;
    else open_.head = slice;
    open_.tail = slice;
    // Published once per epoch: host-work hooks read it without the lock on every launch.
    if (open_.count++ == 0) {
      open_published_.store(true, std::memory_order_relaxed);
      open_.batch = work_since_free::batch_begun();
    }
    open_.bytes += slice->size;
  }

  // Adds `slice`, freed by `thread` (a number unique to the thread for the process's life) in
  // the order of `stream` (the lane token Device::fence_record_on gave), whose own fence was
  // recorded on that stream at the free: it waits for that fence alone. One thread's fences on
  // one stream pass in the order it recorded them; the thread is part of the lane because one
  // token may name a stream of each thread (the per-thread default stream), and one thread's
  // park must not hold back another's frees.
  void add_ordered(Slice* slice, FenceHandle fence, StreamToken stream, std::uint64_t thread) {
    slice->next_pending = nullptr;
    Epoch epoch;
    epoch.id = next_id_++;
    epoch.fence = fence;
    epoch.head = epoch.tail = slice;
    epoch.count = 1;
    epoch.bytes = slice->size;
    // Counted once added: a list that cannot grow (the host is out of memory) throws with
    // nothing changed, and the caller fences the free as any other.
    for (StreamLane& lane : lanes_) {
      if (lane.stream == stream && lane.thread == thread) {
        lane.frees.push_back(epoch);
        ++lane_frees_;
        return;
      }
    }
    lanes_.push_back(StreamLane{stream, thread, {epoch}});
    ++lane_frees_;
  }

  std::uint32_t open_count() const { return open_.count; }
  std::uint64_t open_bytes() const { return open_.bytes; }
  // Lanes are dropped once empty: one in the list holds a free.
  bool any() const { return open_.count != 0 || !closed_.empty() || !lanes_.empty(); }
  // Whether the open epoch holds any free, readable without the manager's lock (a hint: a
  // caller that sees true takes the lock and looks again).
  bool open_hint() const { return open_published_.load(std::memory_order_relaxed); }
  // Whether any free waits for a fence already recorded.
  bool any_closed() const { return !closed_.empty() || !lanes_.empty(); }
  // Whether any free that is not stream-ordered does (a window's empty epoch holds none:
  // close_with_fence()).
  bool any_closed_epoch() const {
    for (const Epoch& epoch : closed_)
      if (epoch.count != 0) return true;
    return false;
  }
  // Whether any stream-ordered free waits: fences then need not pass in the order recorded, so
  // a wait for the oldest must not outlast a short slice (Note [Stream-ordered frees]).
  bool any_lanes() const { return !lanes_.empty(); }
  // Stream-ordered frees waiting, each with a fence of its own.
  std::uint64_t lane_frees() const { return lane_frees_; }

  // Closes the open epoch with a fence. False when it is empty or the device refused a fence
  // (kNoFence: the epoch stays open and is retried at the next close).
  bool close(Device& device) {
    if (open_.count == 0) return false;
    const FenceHandle fence = device.fence_record();
    if (fence == kNoFence) return false;
    Epoch closing = open_;
    closing.fence = fence;
    closing.id = next_id_;
    closing.work_after_free = work_since_free::work_since(open_.batch);
    try {
      closed_.push_back(closing);
    } catch (...) {  // no host memory: the epoch stays open, to close later
      device.fence_destroy(fence);
      throw;
    }
    ++next_id_;
    open_ = Epoch{};
    open_published_.store(false, std::memory_order_relaxed);
    return true;
  }

  // Closes the open epoch with a fence, or records a fence for an empty closed epoch when the
  // open one is empty: the id of that closed epoch, or 0 when the device refused a fence.
  std::uint64_t close_with_fence(Device& device) {
    if (open_.count == 0) {
      const FenceHandle fence = device.fence_record();
      if (fence == kNoFence) return 0;
      Epoch empty;
      empty.fence = fence;
      empty.id = next_id_;
      try {
        closed_.push_back(empty);
      } catch (...) {
        device.fence_destroy(fence);
        throw;
      }
      return next_id_++;
    }
    const std::uint64_t id = next_id_;
    return close(device) ? id : 0;
  }

  // Where closed epoch `id` (close_with_fence's) is: still waiting for its fence; reaped, so its
  // fence passed (closed epochs are reaped oldest first: one older than the oldest queued has
  // passed); or unknown (never closed, or forgotten with the device's memory).
  enum class ClosedEpoch : std::uint8_t { waiting, passed, unknown };
  ClosedEpoch closed_epoch(std::uint64_t id) const {
    if (id == 0 || id >= next_id_) return ClosedEpoch::unknown;
    for (const Epoch& epoch : closed_)
      if (epoch.id == id) return ClosedEpoch::waiting;
    return closed_.empty() || id < closed_.front().id ? ClosedEpoch::passed
                                                      : ClosedEpoch::unknown;
  }

  // Adds `slice`, pending, to closed epoch `id`, which is waiting (closed_epoch()) and whose
  // fence was recorded after the slice's free: it comes back with that epoch.
  void join_closed(Slice* slice, std::uint64_t id) {
    for (Epoch& epoch : closed_) {
      if (epoch.id != id) continue;
      slice->next_pending = nullptr;
      if (epoch.tail != nullptr) epoch.tail->next_pending = slice;
      else epoch.head = slice;
      epoch.tail = slice;
      ++epoch.count;
      epoch.bytes += slice->size;
      return;
    }
  }

  // Gives back the slices of every closed epoch whose fence has passed, oldest first, and stops
  // at the first that has not (a later fence never passes before an earlier one: each is
  // recorded after all work issued before it); then each lane's the same way. Never blocks.
  // Returns slices given back.
  template <typename GiveBack>
  std::uint64_t reap(Device& device, GiveBack&& give_back) {
    std::uint64_t returned = 0;
    while (!closed_.empty() && device.fence_passed(closed_.front().fence))
      returned += retire_front(device, closed_, give_back);
    for (StreamLane& lane : lanes_) {
      while (!lane.frees.empty() && device.fence_passed(lane.frees.front().fence))
        returned += retire_front(device, lane.frees, give_back);
    }
    std::erase_if(lanes_, [](const StreamLane& lane) { return lane.frees.empty(); });
    return returned;
  }

  // A ticket for the oldest fence recorded (a closed epoch's or, `with_lanes`, a stream lane's),
  // or an empty one when none is.
  FenceTicket borrow_oldest(bool with_lanes = true) {
    Epoch* oldest = closed_.empty() ? nullptr : &closed_.front();
    for (StreamLane& lane : lanes_) {
      if (!with_lanes) break;
      if (oldest == nullptr || lane.frees.front().id < oldest->id) oldest = &lane.frees.front();
    }
    if (oldest == nullptr) return {};
    ++oldest->waiters;
    return FenceTicket{oldest->id, oldest->fence};
  }

  // Hands a ticket back. If its epoch was retired or forgotten while it was out and this was
  // its last ticket, the fence is destroyed now.
  void give_back_ticket(Device& device, const FenceTicket& ticket) {
    for (Epoch& epoch : closed_) {
      if (epoch.id == ticket.epoch) {
        --epoch.waiters;
        return;
      }
    }
    for (StreamLane& lane : lanes_) {
      for (Epoch& epoch : lane.frees) {
        if (epoch.id == ticket.epoch) {
          --epoch.waiters;
          return;
        }
      }
    }
    for (auto it = lingering_.begin(); it != lingering_.end(); ++it) {
      if (it->epoch != ticket.epoch) continue;
      if (--it->waiters == 0) {
        device.fence_destroy(it->fence);
        lingering_.erase(it);
      }
      return;
    }
  }

  // Drops every epoch (the device's memory is gone): each closed epoch's fence is destroyed,
  // so the device's fence records are not leaked, unless a ticket holds it; no other device
  // call.
  void forget(Device& device) {
    for (const Epoch& epoch : closed_) drop_fence(device, epoch);
    for (const StreamLane& lane : lanes_)
      for (const Epoch& epoch : lane.frees) drop_fence(device, epoch);
    open_ = Epoch{};
    open_published_.store(false, std::memory_order_relaxed);
    closed_.clear();
    lanes_.clear();
    lane_frees_ = 0;
  }

  // Every slice waiting for a batch's fence (open or closed) that no work the program put on a
  // stream after the batch's first free holds back: its fence waits only for work issued before
  // the frees. Not a stream-ordered free's.
  template <typename Fn>
  void for_each_batch_pending_behind_earlier_work(Fn&& fn) const {
    if (open_.count != 0 && !work_since_free::work_since(open_.batch))
      for (Slice* s = open_.head; s != nullptr; s = s->next_pending) fn(s);
    for (const Epoch& e : closed_) {
      if (e.work_after_free) continue;
      for (Slice* s = e.head; s != nullptr; s = s->next_pending) fn(s);
    }
  }

  template <typename Fn>
  void for_each_pending(Fn&& fn) const {
    for (Slice* s = open_.head; s != nullptr; s = s->next_pending) fn(s);
    for (const Epoch& e : closed_)
      for (Slice* s = e.head; s != nullptr; s = s->next_pending) fn(s);
    for (const StreamLane& lane : lanes_)
      for (const Epoch& e : lane.frees)
        for (Slice* s = e.head; s != nullptr; s = s->next_pending) fn(s);
  }

 private:
  struct Epoch {
    std::uint64_t id = 0;
    FenceHandle fence = kNoFence;
    Slice* head = nullptr;
    Slice* tail = nullptr;
    std::uint32_t count = 0;
    std::uint32_t waiters = 0;  // tickets out
    std::uint64_t bytes = 0;
    std::uint64_t batch = 0;       // work_since_free's number of the batch, from its first free
    bool work_after_free = false;  // work was put on a stream between its first free and fence
  };
  // One thread's stream-ordered frees on one stream, oldest first; each is an epoch of one
  // slice.
  struct StreamLane {
    StreamToken stream;
    std::uint64_t thread;
    std::deque<Epoch> frees;
  };
  struct Lingering {
    std::uint64_t epoch;
    FenceHandle fence;
    std::uint32_t waiters;
  };

  void drop_fence(Device& device, const Epoch& epoch) {
    if (epoch.waiters == 0) {
      device.fence_destroy(epoch.fence);
    } else {
      lingering_.push_back(Lingering{epoch.id, epoch.fence, epoch.waiters});
    }
  }

  template <typename GiveBack>
  std::uint64_t retire_front(Device& device, std::deque<Epoch>& epochs, GiveBack& give_back) {
    Epoch epoch = epochs.front();
    epochs.pop_front();
    if (&epochs != &closed_) --lane_frees_;
    drop_fence(device, epoch);
    for (Slice* s = epoch.head; s != nullptr;) {
      Slice* next = s->next_pending;  // give_back may recycle s
      give_back(s);
      s = next;
    }
    return epoch.count;
  }

  Epoch open_;
  std::deque<Epoch> closed_;
  std::vector<StreamLane> lanes_;  // only lanes that hold a free
  std::uint64_t lane_frees_ = 0;   // in every lane
  std::vector<Lingering> lingering_;  // retired or forgotten while a ticket was out
  std::uint64_t next_id_ = 1;
  std::atomic<bool> open_published_{false};  // open_.count != 0, for open_hint()
};

}  // namespace poolcuda
