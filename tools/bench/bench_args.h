// Shared by the benchmark programs that run against the CUDA runtime (preload_bench.cpp,
// managed_bench.cpp): stopping on a failed call, strict whole-number options, and labels that
// can be copied into JSON as they are. Header-only; needs the CUDA runtime header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace bench {

// Prints "<program>: <call> failed at line N: <error name>" and exits with status 2.
inline void die_on_error(const char* program, cudaError_t err, const char* what, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s failed at line %d: %s\n", program, what, line,
               cudaGetErrorName(err));
  std::exit(2);
}

// The whole text must be a number in [lo, hi].
inline bool parse_long(const char* text, long lo, long hi, long& out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) return false;
  out = v;
  return true;
}

// No quotes, backslashes or control characters: the label goes into a JSON string verbatim.
inline bool json_safe_label(std::string_view label) {
  for (char c : label) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
  }
  return true;
}

}  // namespace bench
