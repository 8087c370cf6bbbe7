// Helpers of the managed-memory preload tests that act on slab allocations by range (hints,
// batch discards): host reads of managed bytes, a global managed allocation, a memory location,
// and the check that a call was refused with cudaErrorInvalidValue left as the last error.
//
// Plain C++ against the CUDA runtime header, over check.h.
#pragma once

#include <algorithm>
#include <cstddef>

#include "check.h"

namespace managed_test {

inline bool host_bytes(const void* ptr, std::size_t size, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(ptr);
  return std::all_of(bytes, bytes + size, [&](unsigned char b) { return b == value; });
}

inline char* managed(std::size_t size) {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMallocManaged(&ptr, size, cudaMemAttachGlobal));
  return static_cast<char*>(ptr);
}

inline cudaMemLocation location(cudaMemLocationType type, int id) {
  cudaMemLocation where{};
  where.type = type;
  where.id = id;
  return where;
}

inline void refused(cudaError_t result) {
  CHECK_RESULT(result, cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

}  // namespace managed_test
