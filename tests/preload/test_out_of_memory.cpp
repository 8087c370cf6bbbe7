// Preload test 6: out of memory. Memory the pools cached after frees (idle pages) is trimmed
// when a request needs it, and the request succeeds without the program seeing any error. When
// the device is really full, cudaMalloc answers cudaErrorMemoryAllocation and cudaGetLastError
// reports it once, as with the real library; after frees, allocation works again. An error the
// program left pending survives an allocation that recovered, as a successful call leaves it.
// Sizes are fractions of the device, so the same program runs on the stand-in (run with a small
// SIMCUDA_DEVICE_MEMORY) and on a GPU. On a 1 MiB stand-in device, where no 2 MiB page fits and
// the driver serves every small request itself, the library's out-of-memory line comes once, for
// the request the driver refuses too, not for each one it served.
#include <string>
#include <vector>

#include "check.h"

namespace {

// The child on a 1 MiB device: small allocations until one is refused.
int tiny_device() {
  std::vector<void*> held;
  void* ptr = nullptr;
  while (cudaMalloc(&ptr, 1000) == cudaSuccess) held.push_back(ptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  for (void* p : held) CHECK_CUDA(cudaFree(p));
  std::printf("tiny device: %zu served\n", held.size());
  return 0;
}

// A small allocation leaves an idle 2 MiB page; 7 MiB allocations, each a page of its own, then
// fill the device until CUDA refuses one too, after the pools gave that page back.
int idle_page_given_back() {
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 1000));
  CHECK_CUDA(cudaFree(small));
  std::vector<void*> held;
  void* ptr = nullptr;
  while (cudaMalloc(&ptr, 7 << 20) == cudaSuccess) held.push_back(ptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  for (void* p : held) CHECK_CUDA(cudaFree(p));
  std::printf("idle page: %zu served\n", held.size());
  return 0;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc == 2 && std::string(argv[1]) == "tiny") return tiny_device();
  if (argc == 2 && std::string(argv[1]) == "idle-page") return idle_page_given_back();
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const bool counted = preload_test::on_stand_in();

  // Fill three quarters of the device with sixteenths, then free them: the pools keep them.
  const std::size_t piece = total / 16;
  std::vector<void*> pieces;
  for (int i = 0; i < 12; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, piece));
    CHECK_CUDA(cudaMemset(ptr, i, piece));
    pieces.push_back(ptr);
  }
  for (void* ptr : pieces) CHECK_CUDA(cudaFree(ptr));
  pieces.clear();
  CHECK_CUDA(cudaDeviceSynchronize());
  if (counted) {
    // The setup is meaningful only if the pools really hold that memory now.
    CHECK_MSG(preload_test::counter("live_bytes") >= total / 2,
              "pools released the pieces: " + std::to_string(preload_test::counter("live_bytes")));
  }

  // Half the device in one piece: only possible once the cached pieces are trimmed.
  void* half = nullptr;
  CHECK_CUDA(cudaMalloc(&half, total / 2));
  CHECK_RESULT(cudaGetLastError(), cudaSuccess);  // the recovered failure left no trace
  CHECK_CUDA(cudaMemset(half, 0x5c, total / 2));

  // Really full: allocate eighths until the device refuses.
  std::vector<void*> filler;
  cudaError_t refused = cudaSuccess;
  for (int i = 0; i < 64; ++i) {
    void* ptr = nullptr;
    refused = cudaMalloc(&ptr, total / 8);
    if (refused != cudaSuccess) break;
    filler.push_back(ptr);
  }
  CHECK_RESULT(refused, cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaSuccess);
  CHECK(!filler.empty());
  CHECK(preload_test::device_bytes_equal(half, 4096, 0x5c));

  // After frees the same requests succeed again.
  for (void* ptr : filler) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(half));
  CHECK_CUDA(cudaMalloc(&half, total / 2));
  CHECK_CUDA(cudaFree(half));
  CHECK_CUDA(cudaGetLastError());

  // The pools hold the freed memory again; the program leaves an error pending, and an
  // allocation that needs the pools' memory back succeeds without replacing that error.
  CHECK_RESULT(cudaMalloc(nullptr, 256), cudaErrorInvalidValue);
  void* most = nullptr;
  CHECK_CUDA(cudaMalloc(&most, total / 4 * 3));
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_CUDA(cudaFree(most));
  if (preload_test::on_stand_in()) {
    const preload_test::ChildResult tiny =
        preload_test::run_self("tiny", {"SIMCUDA_DEVICE_MEMORY=1M"}, 60);
    CHECK_MSG(tiny.status == 0, tiny.output);
    CHECK_MSG(count(tiny.output, "tiny device: ") == 1 &&
                  count(tiny.output, "out of device memory") == 1,
              tiny.output.substr(0, 2000));
    // The pools' figures add up to what they reserve (padding included: on a 1 MiB device the
    // exclusive pool serves every request, a 1 KiB page each), and the line ends with what the
    // device had free when CUDA refused the request too.
    CHECK_MSG(count(tiny.output, ", in use 1024000 B, padding 24576 B, reserved 1048576 B, idle "
                                 "pages 0 B,") == 1 &&
                  count(tiny.output, ", given back but not yet freed by the driver 0 B; CUDA's "
                                     "own allocation failed too, with 0 B free on the device\n") ==
                      1,
              tiny.output.substr(0, 2000));
    // The idle page and the device's free bytes together are less than the request: the page
    // stays in the pools (Note [Requests beyond reach] in interpose/pooling.cpp), and the line
    // counts it once, as the pools' and not the device's.
    const preload_test::ChildResult idle =
        preload_test::run_self("idle-page", {"SIMCUDA_DEVICE_MEMORY=256M"}, 60);
    CHECK_MSG(idle.status == 0, idle.output);
    CHECK_MSG(count(idle.output, "idle pages 2097152 B,") == 1 &&
                  count(idle.output, "with 2097152 B free on the device\n") == 1 &&
                  count(idle.output, "once the pools had given their idle pages back") == 0,
              idle.output.substr(0, 2000));
  }
  std::printf("ok: %zu eighths fitted beside the half\n", filler.size());
  return 0;
}
