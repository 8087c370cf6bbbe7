// The driver API as the sim tests reach it, the way a statically linked cudart does: dlopen
// ("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then cuGetProcAddress for every entry point.
#pragma once

#include <cuda.h>

#include "sim_test.h"

namespace simtest {

struct Driver {
  void* lib = nullptr;
  decltype(&cuGetProcAddress_v2) get_proc = nullptr;

  Driver() {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(lib != nullptr);
    get_proc = reinterpret_cast<decltype(get_proc)>(dlsym(lib, "cuGetProcAddress_v2"));
    REQUIRE(static_cast<bool>(get_proc));
  }
  // The variant of `name` for `version` and the stream flavour in `flags`.
  template <class F>
  F get(const char* name, int version = 13000, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status;
    REQUIRE_EQ(get_proc(name, &fn, version, flags, &status), CUDA_SUCCESS);
    REQUIRE_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    REQUIRE(fn != nullptr);
    return reinterpret_cast<F>(fn);
  }
};

inline Driver& driver() {
  static Driver d;
  return d;
}

// The current device's free bytes, as cudaMemGetInfo reports them.
inline size_t free_bytes() {
  size_t free = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free, &total));
  return free;
}

// `device`'s free bytes; the current device stays.
inline size_t free_on(int device) {
  int current = 0;
  CUDA_OK(cudaGetDevice(&current));
  CUDA_OK(cudaSetDevice(device));
  size_t free = free_bytes();
  CUDA_OK(cudaSetDevice(current));
  return free;
}

}  // namespace simtest
