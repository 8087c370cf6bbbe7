// Preload test: a request that nothing the library holds could make room for is refused at
// once, as the plain call refuses it, while other work keeps the device busy (Note [Requests
// beyond reach] in interpose/pooling.cpp). On a 256 MiB stand-in device with 100 MiB live and a
// 50 MiB page idle in the pools, 200 MiB are asked for by cudaMalloc, cudaMallocPitch and
// cudaMallocManaged: first while a kernel runs on another stream until the
// test lets it end, then while a stream is parked on a host function with 10 MiB freed onto it.
// Each is refused with cudaErrorMemoryAllocation before the test lets the device go: the library
// used to give its idle memory back first, which waits for the device (the kernel's whole run,
// the 10 s bound behind the park). The pools keep their idle page: a 50 MiB request afterwards
// makes no driver allocation. A request a budget refuses gets the same (child "budget"). Memory a
// dead graph shared (capture_share:on) counts as the library's to give back (child "shared").
#include <chrono>
#include <string>

#include "check.h"

namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kOutOfReach = 200 * kMiB;

// Every kind of request the library sees but a stream-ordered pool's (which may take memory its
// pool keeps, out of the library's sight), each refused without waiting for the device.
void refused_at_once(const char* beside) {
  const auto began = std::chrono::steady_clock::now();
  void* ptr = nullptr;
  CHECK_RESULT(cudaMalloc(&ptr, kOutOfReach), cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  std::size_t pitch = 0;
  CHECK_RESULT(cudaMallocPitch(&ptr, &pitch, kMiB, kOutOfReach / kMiB),
               cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaMallocManaged(&ptr, kOutOfReach), cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  // Each wait for the device lasted until the gate's own 10 s deadline.
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - began)
                        .count();
  CHECK_MSG(took < 5000, std::string("three refusals beside ") + beside + " took " +
                             std::to_string(took) + " ms");
}

// Under limit:128M on a 1 GiB device, 100 MiB live and a 10 MiB page idle: a 60 MiB managed
// request (past the slabs, so charged as it passes through) is more than the budget has left
// and the idle page together, and is refused at once beside a running kernel.
int beyond_the_budget(preload_test::LaunchAccessFn launch_access) {
  void* live = nullptr;
  CHECK_CUDA(cudaMalloc(&live, 100 * kMiB));
  void* page = nullptr;
  CHECK_CUDA(cudaMalloc(&page, 10 * kMiB));
  CHECK_CUDA(cudaFree(page));
  cudaStream_t busy = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  preload_test::Gate gate;
  CHECK(launch_access(busy, live, kMiB, 1, &preload_test::wait_at_gate, &gate) == cudaSuccess);
  while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto began = std::chrono::steady_clock::now();
  void* ptr = nullptr;
  CHECK_RESULT(cudaMallocManaged(&ptr, 60 * kMiB), cudaErrorMemoryAllocation);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - began)
                        .count();
  gate.open.store(true);
  CHECK_MSG(took < 5000, "the refusal took " + std::to_string(took) + " ms");
  CHECK_CUDA(cudaStreamSynchronize(busy));
  CHECK_CUDA(cudaStreamDestroy(busy));
  CHECK_CUDA(cudaFree(live));
  std::printf("child ok\n");
  return 0;
}

// Under capture_share:on on a 1 GiB device: 600 MiB allocated and freed inside a capture whose
// graph then dies. That memory is the graph's until the library takes the graph's end, and a
// 700 MiB managed request (past the slabs) needs it: within reach, so the pools give it back
// and the request is served, as under plain CUDA.
int shared_capture_memory() {
  cudaStream_t capturing = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, 600 * kMiB));
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, kMiB));
  CHECK_CUDA(cudaMemsetAsync(small, 1, kMiB, capturing));
  CHECK_CUDA(cudaFree(big));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &graph));
  preload_test::launch_once(graph, capturing);
  void* ptr = nullptr;
  CHECK_CUDA(cudaMallocManaged(&ptr, 700 * kMiB));
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(small));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  std::printf("child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const preload_test::LaunchAccessFn launch_access = preload_test::launch_access_function();
  if (launch_access == nullptr) preload_test::skip("needs the stand-in's kernels");
  if (argc == 2 && std::string(argv[1]) == "budget") return beyond_the_budget(launch_access);
  if (argc == 2 && std::string(argv[1]) == "shared") return shared_capture_memory();
  cudaStream_t busy = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  void* live = nullptr;
  CHECK_CUDA(cudaMalloc(&live, 100 * kMiB));
  void* page = nullptr;
  CHECK_CUDA(cudaMalloc(&page, 50 * kMiB));
  CHECK_CUDA(cudaFree(page));  // the device idle: the page stays in the pools
  void* touched = nullptr;
  CHECK_CUDA(cudaMalloc(&touched, kMiB));

  {
    preload_test::Gate gate;
    CHECK(launch_access(busy, touched, kMiB, 1, &preload_test::wait_at_gate, &gate) ==
          cudaSuccess);
    while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    refused_at_once("a running kernel");
    gate.open.store(true);
    CHECK_CUDA(cudaStreamSynchronize(busy));
  }
  const std::uint64_t driver_allocations = preload_test::counter("cudaMalloc");
  CHECK_CUDA(cudaMalloc(&page, 50 * kMiB));
  CHECK_MSG(preload_test::counter("cudaMalloc") == driver_allocations,
            "the idle page went back to the driver for a request it could not serve");
  CHECK_CUDA(cudaFree(page));

  {
    preload_test::Gate gate;
    preload_test::park(busy, gate);
    void* freed_onto_park = nullptr;
    CHECK_CUDA(cudaMalloc(&freed_onto_park, 10 * kMiB));
    CHECK_CUDA(cudaFreeAsync(freed_onto_park, busy));
    refused_at_once("a parked stream");
    gate.open.store(true);
    CHECK_CUDA(cudaStreamSynchronize(busy));
  }
  CHECK_CUDA(cudaFree(touched));
  CHECK_CUDA(cudaFree(live));
  CHECK_CUDA(cudaStreamDestroy(busy));
  const preload_test::ChildResult budget = preload_test::run_self(
      "budget", {"POOLCUDA_CONF=limit:128M", "SIMCUDA_DEVICE_MEMORY=1G"}, 60);
  std::printf("%s", budget.output.c_str());
  CHECK_MSG(budget.status == 0, "budget child exited with " + std::to_string(budget.status));
  const preload_test::ChildResult shared = preload_test::run_self(
      "shared", {"POOLCUDA_CONF=capture_share:on", "SIMCUDA_DEVICE_MEMORY=1G"}, 60);
  std::printf("%s", shared.output.c_str());
  CHECK_MSG(shared.status == 0, "shared child exited with " + std::to_string(shared.status));
  std::printf("ok\n");
  return 0;
}
