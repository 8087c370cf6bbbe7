// A GPU check (scripts/gpu-check): what memory from cudaMalloc freed with cudaFreeAsync becomes
// while another stream is parked on a host function. The program fills half the device with
// buffers of one size, parks a stream, frees every buffer with cudaFreeAsync on a second stream
// and waits for that stream, then asks for one buffer of most of the device, more than any
// freed buffer and more than was free before the frees. Under the library the pools take the
// freed buffers back but cannot return their pages to the driver while the park lasts (the
// driver's free waits for every stream: docs/limits.md); whether plain CUDA gives the memory
// back at once is what this measures. Prints the device's free bytes before and after the
// frees, "large: ok" or "large: refused", then "ok". Exit status 0 unless a CUDA call failed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "check.h"

namespace {

std::atomic<bool> g_open{false};

// Holds its stream until main opens the gate, 30 s at most.
void CUDART_CB wait_at_gate(void*) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!g_open.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::size_t free_bytes() {
  std::size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

}  // namespace

int main() {
  CHECK(cudaFree(nullptr));
  std::size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));
  const std::size_t piece = std::size_t{64} << 20;
  std::vector<void*> buffers;
  while (buffers.size() * piece < free / 2) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, piece));
    buffers.push_back(p);
  }
  CHECK(cudaDeviceSynchronize());
  const std::size_t before = free_bytes();
  cudaStream_t parked = nullptr, freeing = nullptr;
  CHECK(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&freeing, cudaStreamNonBlocking));
  CHECK(cudaLaunchHostFunc(parked, wait_at_gate, nullptr));
  for (void* p : buffers) CHECK(cudaFreeAsync(p, freeing));
  CHECK(cudaStreamSynchronize(freeing));
  const std::size_t after = free_bytes();
  // More than was free before the frees, and more than one freed buffer.
  const std::size_t large = before + (after > before ? (after - before) / 2 : piece);
  void* big = nullptr;
  const cudaError_t got = cudaMalloc(&big, large);
  if (got != cudaSuccess) (void)cudaGetLastError();
  g_open.store(true);
  CHECK(cudaDeviceSynchronize());
  if (got == cudaSuccess) CHECK(cudaFree(big));
  std::printf("filled: %zu MiB\nfree before the frees: %zu MiB\nfree after them: %zu MiB\n",
              buffers.size() * piece >> 20, before >> 20, after >> 20);
  std::printf("large (%zu MiB): %s\nok\n", large >> 20, got == cudaSuccess ? "ok" : "refused");
  CHECK(cudaStreamDestroy(parked));
  CHECK(cudaStreamDestroy(freeing));
  return 0;
}
