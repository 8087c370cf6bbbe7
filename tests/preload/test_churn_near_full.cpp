// Preload test: churn of mixed sizes near a full device under pools:exclusive, the layout the
// README's limits give for it. A child keeps the device 90% full with random sizes up to an
// eighth of it, then up to 1 MiB, then up to a 32nd, frees a random half after each fill
// (checking a byte of each buffer), and at the end asks for nearly the whole device. Under the
// default layout pages that live slices keep fill the device and a request fails in the third
// round (README, Limits); a page per allocation must run it to the end, as plain CUDA does, and
// the child must run to the end without the library too (the workload itself fits).

#include <algorithm>
#include <random>
#include <vector>

#include "check.h"

namespace {

constexpr int kRounds = 6;

int churn() {
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  std::mt19937_64 rng(3);
  std::vector<std::pair<void*, std::size_t>> live;
  const std::size_t target = total / 10 * 9;
  std::size_t used = 0;
  for (int round = 0; round < kRounds; ++round) {
    const std::size_t most =
        round % 3 == 0 ? total / 8 : (round % 3 == 1 ? std::size_t{1} << 20 : total / 32);
    for (;;) {
      const std::size_t size = 1 + rng() % most;
      if (used + size > target) break;
      void* p = nullptr;
      const cudaError_t result = cudaMalloc(&p, size);
      if (result != cudaSuccess) {
        std::printf("round %d: %zu bytes refused with %zu live: %s\n", round, size, used,
                    cudaGetErrorName(result));
        return 1;
      }
      CHECK_CUDA(cudaMemset(p, static_cast<int>(size & 0xff), size));
      live.push_back({p, size});
      used += size;
    }
    std::shuffle(live.begin(), live.end(), rng);
    const std::size_t keep = live.size() / 2;
    for (std::size_t i = keep; i < live.size(); ++i) {
      unsigned char byte = 0;
      CHECK_CUDA(cudaMemcpy(&byte, static_cast<char*>(live[i].first) + live[i].second / 2, 1,
                            cudaMemcpyDeviceToHost));
      CHECK_MSG(byte == (live[i].second & 0xff), "a buffer lost its bytes");
      CHECK_CUDA(cudaFree(live[i].first));
      used -= live[i].second;
    }
    live.resize(keep);
  }
  for (const auto& [p, size] : live) CHECK_CUDA(cudaFree(p));
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, total - total / 64));
  CHECK_CUDA(cudaFree(big));
  std::printf("ran to the end\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "churn") return churn();
  preload_test::require_preloaded();
  const preload_test::ChildResult plain = preload_test::run_self("churn", {"LD_PRELOAD"}, 120);
  CHECK_MSG(plain.status == 0, "without the library: " + plain.output);
  const preload_test::ChildResult pooled =
      preload_test::run_self("churn", {"POOLCUDA_CONF=pools:exclusive"}, 120);
  CHECK_MSG(pooled.status == 0, "under pools:exclusive: " + pooled.output);
  return 0;
}
