// CHECK for the GPU check programs (scripts/gpu-check): a CUDA call that fails prints where,
// what and CUDA's error string, and ends the program with status 1.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(expr)                                                                       \
  do {                                                                                    \
    cudaError_t check_ = (expr);                                                          \
    if (check_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                 \
                   cudaGetErrorString(check_));                                           \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
