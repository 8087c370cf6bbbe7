// Preload test: churn of mixed sizes near a full device under pools:exclusive, the layout the
// README's limits give for it. A child keeps the device 90% full with random sizes up to an
// eighth of it, then up to 1 MiB, then up to a 32nd, frees a random half after each fill
// (checking a byte of each buffer), and at the end asks for nearly all the memory that was free
// at its start. Under the default layout pages that live slices keep fill the device and a
// request fails in the third round (README, Limits); a page per allocation must run to the end
// whatever plain CUDA runs to the end.
//
// The plain run is the reference. On the stand-in, which counts a device's bytes exactly, it
// runs the churn at 90% to the end. A real driver rounds and packs small allocations its own
// way, and the holes a freed half leaves among them cost it memory beyond the bytes live: an
// H200 refused a 3.3 GiB request with 116 GiB of its 140 GiB live. So the plain run is tried at
// 90% and then 10% less at a time, down to half the device, and the pooled run must run the
// churn to the end at the first fill the plain run finished.

#include <algorithm>
#include <random>
#include <vector>

#include "check.h"

namespace {

constexpr int kRounds = 6;

// The child's exit status when a request was refused (any other failure exits with 1).
constexpr int kRefused = 3;

int churn(int percent) {
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  std::mt19937_64 rng(3);
  std::vector<std::pair<void*, std::size_t>> live;
  const std::size_t target = total / 100 * static_cast<std::size_t>(percent);
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
        return kRefused;
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
  // Nearly all that was free at the start (on a GPU the context itself takes some of the total).
  const std::size_t last = free_bytes - total / 64;
  void* big = nullptr;
  const cudaError_t result = cudaMalloc(&big, last);
  if (result != cudaSuccess) {
    std::printf("at the end: %zu bytes refused: %s\n", last, cudaGetErrorName(result));
    return kRefused;
  }
  CHECK_CUDA(cudaFree(big));
  std::printf("ran to the end\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc == 2 ? argv[1] : "";
  if (role.starts_with("churn")) return churn(std::stoi(role.substr(5)));
  preload_test::require_preloaded();
  int percent = 90;
  for (;; percent -= 10) {
    const std::string role_now = "churn" + std::to_string(percent);
    const preload_test::ChildResult plain =
        preload_test::run_self(role_now.c_str(), {"LD_PRELOAD"}, 120);
    if (plain.status == 0) break;
    CHECK_MSG(plain.status == kRefused, "without the library: " + plain.output);
    std::printf("without the library, %d%% full: %s", percent, plain.output.c_str());
    // The stand-in counts bytes exactly: there the workload itself fits.
    CHECK_MSG(!preload_test::on_stand_in() && percent > 50,
              "without the library, " + std::to_string(percent) + "% full: " + plain.output);
  }
  const preload_test::ChildResult pooled = preload_test::run_self(
      ("churn" + std::to_string(percent)).c_str(), {"POOLCUDA_CONF=pools:exclusive"}, 120);
  CHECK_MSG(pooled.status == 0, "under pools:exclusive, " + std::to_string(percent) +
                                    "% full (as far as plain CUDA ran): " + pooled.output);
  std::printf("ran to the end %d%% full, as without the library\n", percent);
  return 0;
}
