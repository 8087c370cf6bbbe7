// Basic vocabulary of the pools layer: device addresses, usage counters and the error values
// every pool and the MemoryManager return. No CUDA header, no platform dependency: this file is
// included by everything above it.
#pragma once

#include <cstdint>
#include <string>

namespace poolcuda {

// A device address. Never dereferenced on the host; only compared, hashed and offset.
using DevicePtr = std::uint64_t;

// One of the program's streams, as the implementation names it (cudaStreamLegacy and
// cudaStreamPerThread for the default streams). kNoStream: no stream was named.
using StreamToken = std::uintptr_t;
inline constexpr StreamToken kNoStream = 0;

inline constexpr std::uint64_t KiB = 1024;
inline constexpr std::uint64_t MiB = 1024 * KiB;
inline constexpr std::uint64_t GiB = 1024 * MiB;

// Round `value` up to a multiple of `alignment` (alignment > 0, not necessarily a power of two).
// Alignments are powers of two in practice, and a mask is a cycle where a 64-bit division costs
// tens: the pools round every request several times.
constexpr std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  if ((alignment & (alignment - 1)) == 0) return (value + alignment - 1) & ~(alignment - 1);
  return (value + alignment - 1) / alignment * alignment;
}

// Usage of one pool or of a whole manager. `bytes_in_use` counts what the program asked for,
// `bytes_padding` what alignment and bucket rounding added on top, `bytes_reserved` what the
// pools hold from the device.
struct MemoryUsage {
  std::uint64_t number_allocs = 0;
  std::uint64_t bytes_in_use = 0;
  std::uint64_t bytes_padding = 0;
  std::uint64_t bytes_reserved = 0;

  MemoryUsage& operator+=(const MemoryUsage& other) {
    number_allocs += other.number_allocs;
    bytes_in_use += other.bytes_in_use;
    bytes_padding += other.bytes_padding;
    bytes_reserved += other.bytes_reserved;
    return *this;
  }
  friend bool operator==(const MemoryUsage&, const MemoryUsage&) = default;
};

// Why a reservation or a layout change failed. `value` carries the number the kind names.
enum class ErrorKind : std::uint8_t {
  none,
  buffer_too_big,           // no pool accepts the size; value = requested size
  pool_capacity_exceeded,   // a capped pool is full; value = the pool's capacity
  pools_in_use,             // install_layout refused; value = bytes live in the dynamic pools
  out_of_memory,            // the device refused even after recovery; value = size
  device_error,             // the device failed for another reason; value = size
};

struct Error {
  ErrorKind kind = ErrorKind::none;
  std::uint64_t value = 0;

  explicit operator bool() const { return kind != ErrorKind::none; }
  friend bool operator==(const Error&, const Error&) = default;
};

// A one-line human description, e.g. "pool capacity exceeded (capacity 2048 B)".
std::string describe(const Error& error);

// What a free by device pointer found.
enum class FreeOutcome : std::uint8_t {
  freed,             // the slice was live and is now free (or waiting on its free fence)
  not_mine,          // the pointer lies in no page of this manager: pass it to the real free
  double_free,       // the pointer started an allocation of this manager that is already freed
  interior_pointer,  // the pointer lies inside a live slice but is not its start
  not_allocated,     // the pointer lies in this manager's free memory but started no recent
                     // allocation
};

// Which fences MemoryManager::give_back_all() waits for: every one, or only those of frees that
// are not stream-ordered (Note [Idle memory before a park] in memory_manager.cpp).
// before_park: as cudafree_fences, and the idle pages whose last slice a stream-ordered free
// gave back stay (Note [Idle memory before a park] in memory_manager.cpp).
enum class GiveBackWait : std::uint8_t { every_fence, cudafree_fences, before_park };

}  // namespace poolcuda
