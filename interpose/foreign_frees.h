// ForeignFree: the guard around a free the pools do not own, from the moment the pools say
// "not mine" to the end of the real free (Note [Foreign frees] in foreign_frees.cpp), and the
// thaw of a manager frozen by a device reset once the frees that may have seen the memory from
// before the reset are over.
//
// Usage, on the free path only (never on a pooled free):
//     ForeignFree guard(ptr);
//     outcome = the pools' release(ptr) again; not_mine and guard.may_free() -> the real free,
//     then guard.end() at once; not_mine otherwise -> answer as the driver answers a pointer
//     it does not know
//
// Depends on the real-function table, the log, the release worker and the lock order; never on
// the pools.
#pragma once

#include <cstdint>

namespace poolcuda {

class MemoryManager;

class ForeignFree {
 public:
  // Registers the free; waits (bounded) while another thread's free of the same pointer is
  // still in flight.
  explicit ForeignFree(const void* ptr);
  ~ForeignFree() { end(); }
  ForeignFree(const ForeignFree&) = delete;
  ForeignFree& operator=(const ForeignFree&) = delete;

  // True when the real free may run: no other thread's free of the same pointer was still in
  // flight once the guard had waited, the driver knew an allocation at it then, and it was not
  // the library's (a page on its way back to the driver, or returned to it since: the pointer is
  // stale and the free could only hit whatever the driver put there next).
  bool may_free() const;

  // The real free has returned: the free is over (the driver may already have given the
  // address to a new allocation, whose free must not wait for this guard's scope to end).
  // Idempotent; the destructor calls it.
  void end();

 private:
  std::uint64_t ticket_ = 0;
  const void* ptr_;
  bool duplicate_ = false;  // another foreign free of ptr_ was still in flight after the wait
  bool driver_knew_ = true;
  bool ended_ = false;
};

// Calls `thaw(device)` (which lets the device's pools and managed slabs take memory from the
// driver again) once every foreign free that began before this call has ended: at once when
// none is in flight, else from the thread that ends the last of them.
void thaw_after_foreign_frees(int device, void (*thaw)(int device));

// The ticket the next foreign free will get. The release worker reads it just before the
// driver's free of a page: a foreign free registered before that cannot name a new allocation
// at the page's address, one registered after it may.
std::uint64_t next_foreign_free_ticket();

// The release worker returned the page at `ptr` to the driver: a foreign free of it in flight
// that registered before `boundary` (next_foreign_free_ticket() read before the driver's free)
// may not run (its driver query may have seen the library's page).
void library_freed(const void* ptr, std::uint64_t boundary);

}  // namespace poolcuda
