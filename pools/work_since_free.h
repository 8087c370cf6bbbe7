// Whether the program put work on a device since a batch of frees began (Note [Memory info after
// a free] in manager_api.cpp): a batch's fence is recorded when the batch closes, so it waits for
// that later work too, and the batch's memory is then not what the plain cudaFree had given back.
// Process-wide and over every device: work anywhere marks every open batch, which only makes
// the memory info count less. The interposer notes the work it sees (launches, copies, memsets);
// tests note it themselves. Header-only; depends on nothing.
#pragma once

#include <atomic>
#include <cstdint>

namespace poolcuda::work_since_free {

inline std::atomic<std::uint64_t> g_batches_begun{0};
// The latest batch the program put work after (batches are numbered in the order they began).
inline std::atomic<std::uint64_t> g_work_after{0};

// A batch of frees begins: its number, for work_since().
inline std::uint64_t batch_begun() { return g_batches_begun.fetch_add(1) + 1; }

// The program puts work on a stream. Two loads when no batch began since the last work: no
// store that every launching thread would pass between its cores.
inline void note_work() {
  const std::uint64_t latest = g_batches_begun.load();
  std::uint64_t seen = g_work_after.load(std::memory_order_relaxed);
  while (seen < latest && !g_work_after.compare_exchange_weak(seen, latest)) {
  }
}

// Notes work when made, before the call that puts work on a stream, and again once the call has
// queued it, so that a batch begun during the call is marked too (noted before the call only,
// such a batch's fence waited for this work while its memory counted as free; noted after it
// only, a batch closed during a long call, a blocking copy, kept no mark). `wanted` false (a
// call the library makes itself) notes nothing.
class NoteWorkAround {
 public:
  explicit NoteWorkAround(bool wanted) : wanted_(wanted) {
    if (wanted_) note_work();
  }
  NoteWorkAround(const NoteWorkAround&) = delete;
  NoteWorkAround& operator=(const NoteWorkAround&) = delete;
  ~NoteWorkAround() {
    if (wanted_) note_work();
  }

 private:
  bool wanted_;
};

// Whether work was put on a stream after batch `batch` began.
inline bool work_since(std::uint64_t batch) { return g_work_after.load() >= batch; }

}  // namespace poolcuda::work_since_free
