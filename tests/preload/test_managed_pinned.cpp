// Preload test: managed slabs kept by small live allocations do not take the device (Note
// [Managed held bound] in pools/managed_bound.cpp). On a 1 GiB device (slabs of 16 MiB, a 64th)
// the program churns managed memory in rounds of a slab's worth and one more of 64 KiB each,
// keeps the first of every round and frees the rest, for 64 rounds. Without the bound every
// round took a slab that its one kept allocation then held: the 64th round failed for lack of
// memory (the device full of slabs), and after 40 rounds a cudaMalloc of half the device failed
// where plain CUDA, holding 2.5 MiB, served it. Now every round succeeds, the device keeps all but
// twice the live bytes and three slabs free, and half the device is there for cudaMalloc; the
// requests the slabs could not take went to the real cudaMallocManaged and free through
// cudaFree, so that once everything is freed the whole device is free again and a cudaMalloc of
// almost all of it succeeds (the empty slabs go back). Runs on a GPU too, with its own slab
// size.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kSize = 64 << 10;
constexpr int kRounds = 64;

std::size_t free_bytes() {
  std::size_t free = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return free;
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  std::size_t start = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&start, &total));
  // The library's slab: a 64th of the device, at most the default managed_slab.
  const std::size_t slab = std::min<std::size_t>(total / 64, 64 * kMiB);
  const int per_round = static_cast<int>(slab / kSize) + 1;

  std::vector<void*> kept;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<void*> made;
    for (int i = 0; i < per_round; ++i) {
      void* ptr = nullptr;
      CHECK_MSG(cudaMallocManaged(&ptr, kSize) == cudaSuccess,
                "round " + std::to_string(round) + ", allocation " + std::to_string(i));
      static_cast<char*>(ptr)[kSize - 1] = static_cast<char>(round);
      made.push_back(ptr);
    }
    kept.push_back(made.front());
    for (std::size_t i = 1; i < made.size(); ++i) CHECK_CUDA(cudaFree(made[i]));
  }

  // Held: at most twice the live bytes (a round's worth at its peak) and three slabs.
  const std::size_t peak_live = (per_round + kRounds) * kSize;
  const std::size_t held = start - std::min(start, free_bytes());
  CHECK_MSG(held <= 2 * peak_live + 3 * slab,
            std::to_string(held >> 20) + " MiB held for " + std::to_string(kRounds) +
                " x 64 KiB kept");
  void* half = nullptr;
  CHECK_CUDA(cudaMalloc(&half, total / 2));
  CHECK_CUDA(cudaFree(half));

  for (std::size_t i = 0; i < kept.size(); ++i) {
    CHECK(static_cast<char*>(kept[i])[kSize - 1] == static_cast<char>(i));
    CHECK_CUDA(cudaFree(kept[i]));
  }
  if (preload_test::on_stand_in()) {  // a GPU's free memory moves with other processes
    CHECK_MSG(free_bytes() == start,
              std::to_string(free_bytes()) + " of " + std::to_string(start) + " free");
  }
  void* most = nullptr;
  CHECK_CUDA(cudaMalloc(&most, start - 8 * kMiB));
  CHECK_CUDA(cudaFree(most));
  std::printf("ok\n");
  return 0;
}
