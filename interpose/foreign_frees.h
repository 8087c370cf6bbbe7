// ForeignFree: the guard around a free the pools do not own, from the moment the pools say
// "not mine" to the end of the real free (Note [Foreign frees] in foreign_frees.cpp), and the
// thaw of a manager frozen by a device reset once the frees that may have seen the memory from
// before the reset are over.
//
// Usage, on the free path only (never on a pooled free):
//     ForeignFree guard(ptr);
//     if (guard.refused()) -> answer as the driver answers a pointer it does not know
//     outcome = the pools' release(ptr) again; not_mine -> the real free
//
// Depends on the real-function table and the lock order; never on the pools.
#pragma once

#include <cstdint>

namespace poolcuda {

class MemoryManager;

class ForeignFree {
 public:
  explicit ForeignFree(const void* ptr);
  ~ForeignFree();
  ForeignFree(const ForeignFree&) = delete;
  ForeignFree& operator=(const ForeignFree&) = delete;

  // True when the real free must not be called: the driver knows no allocation at the pointer
  // (the free could only hit memory someone gets there next).
  bool refused() const { return refused_; }

 private:
  std::uint64_t ticket_ = 0;
  bool refused_ = false;
};

// Unfreezes `manager` (MemoryManager::set_frozen(false)) once every foreign free that began
// before this call has ended: at once when none is in flight, else from the thread that ends
// the last of them.
void thaw_after_foreign_frees(MemoryManager* manager);

}  // namespace poolcuda
