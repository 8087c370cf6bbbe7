// Preload test: two frees of one address at once, of memory the pools do not serve (Note [Foreign
// frees] in interpose/foreign_frees.cpp).
//  - A reused address: a thread's free has freed a buffer but not yet returned when another
//    thread's allocation gets the same address from the driver, and that thread frees its new
//    buffer. Plain CUDA frees it; the library once refused it (cudaErrorInvalidValue) because
//    the first free was still in flight, leaking the buffer. Through cudaMallocAsync, through
//    cudaMalloc of a size no pool of this test's configuration serves (passed to the driver and
//    charged to the budget: the first free's bookkeeping once ran after its real call and took
//    the second buffer's charge off the books, so that the budget shrank by one buffer for
//    good), and through cuMemAlloc and cuMemFree.
//  - A double free: two threads free one buffer at the same moment. Exactly one succeeds; the
//    other is answered cudaErrorInvalidValue, as plain CUDA answers one of them.
//  - With `slow` (the suite runs it where a free takes 6 s to return once it freed the memory):
//    a double free whose first free stays in the driver longer than the library's wait (5 s) is
//    answered cudaErrorInvalidValue once the wait is over, while the first is still under way.
//  - With `stopped` (the suite runs it where a free takes 1 s to return): the reused address
//    again, through cudaMallocAsync, with the whole process stopped (SIGSTOP from a child) for
//    6 s while the second free waits for the first. The wait's bound passes during the stop, in
//    which neither thread ran; on resume the first free returns at once, and the second must
//    free its live buffer, as plain CUDA does (the library once refused it as a double free).
// On the stand-in, each free takes 100 ms before it looks the pointer up and 200 ms to return
// once it freed the memory (SIMCUDA_FREE_DELAY_US, SIMCUDA_FREED_DELAY_US), and its first-fit
// placement gives a freed address to the next allocation of the same size, so the second free
// begins while the first is in flight (a round where it did not is made again). On a GPU, where
// the timings are not forced, the same calls must give the same answers.
#include <cuda.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "check.h"
#include "stop_process.h"

namespace {

constexpr std::size_t kSize = 3u << 20;

enum class Through { malloc_async, malloc, driver };

void* allocate(Through through) {
  void* p = nullptr;
  switch (through) {
    case Through::malloc_async:
      CHECK_CUDA(cudaMallocAsync(&p, kSize, cudaStreamLegacy));
      CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
      break;
    case Through::malloc:
      CHECK_CUDA(cudaMalloc(&p, kSize));
      break;
    case Through::driver: {
      CUdeviceptr d = 0;
      CHECK(cuMemAlloc(&d, kSize) == CUDA_SUCCESS);
      p = reinterpret_cast<void*>(d);
      break;
    }
  }
  return p;
}

// The free matching `through`, answered as a runtime error.
cudaError_t release(Through through, void* p) {
  if (through != Through::driver) return cudaFree(p);
  const CUresult result = cuMemFree(reinterpret_cast<CUdeviceptr>(p));
  return result == CUDA_SUCCESS               ? cudaSuccess
         : result == CUDA_ERROR_INVALID_VALUE ? cudaErrorInvalidValue
                                              : cudaErrorUnknown;
}

// Frees `p` on another thread: its answer goes to `result`, and `returned` is set once it has.
std::thread release_elsewhere(Through through, void* p, cudaError_t* result,
                              std::atomic<bool>* returned) {
  return std::thread([through, p, result, returned] {
    CHECK_CUDA(cudaSetDevice(0));  // the primary context, current for the driver's calls too
    *result = release(through, p);
    returned->store(true);
  });
}

std::size_t reported_free() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

// Waits (at most 2 s) until the stand-in's driver holds no more than `target` bytes, or the other
// thread's free has returned.
void wait_for_live_bytes(std::uint64_t target, const std::atomic<bool>& returned) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (preload_test::counter("live_bytes") > target && !returned.load()) {
    CHECK_MSG(std::chrono::steady_clock::now() < deadline,
              "the other thread's free did not reach the driver within 2 s");
    std::this_thread::yield();
  }
}

void reused_address_is_freed(Through through, const char* what) {
  const bool stand_in = preload_test::on_stand_in();
  for (int round = 0; round < 5; ++round) {
    const std::uint64_t before = stand_in ? preload_test::counter("live_bytes") : 0;
    const std::size_t free_before = reported_free();
    void* first = allocate(through);
    cudaError_t first_freed = cudaErrorUnknown;
    std::atomic<bool> returned{false};
    std::thread freer = release_elsewhere(through, first, &first_freed, &returned);
    if (stand_in) wait_for_live_bytes(before, returned);
    void* second = allocate(through);
    const bool racing = second == first && !returned.load();
    CHECK_MSG(release(through, second) == cudaSuccess,
              std::string(what) + ": a free of a live buffer failed while another thread's free "
                                  "of an earlier buffer at its address was returning");
    freer.join();
    CHECK_CUDA(first_freed);
    if (stand_in)
      CHECK_MSG(preload_test::counter("live_bytes") == before,
                std::string(what) + ": a freed buffer is still live");
    CHECK_MSG(reported_free() == free_before,
              std::string(what) + ": cudaMemGetInfo shows less free once both buffers were freed");
    if (racing || !stand_in) return;
  }
  CHECK_MSG(false, std::string(what) + ": in five rounds, the second free never began while "
                                       "the first was returning");
}

void double_free_succeeds_once() {
  for (int round = 0; round < 5; ++round) {
    void* p = allocate(Through::malloc_async);
    cudaError_t first = cudaErrorUnknown;
    std::atomic<bool> returned{false};
    std::thread freer = release_elsewhere(Through::malloc_async, p, &first, &returned);
    // The other thread's free is inside the driver by now (its look-up comes after 100 ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const bool racing = !returned.load();
    const cudaError_t second = cudaFree(p);
    freer.join();
    CHECK_MSG((first == cudaSuccess) != (second == cudaSuccess),
              "two frees of one buffer at once: " + preload_test::error_text(first) + " and " +
                  preload_test::error_text(second) + "; exactly one should succeed");
    CHECK_RESULT(first == cudaSuccess ? second : first, cudaErrorInvalidValue);
    if (racing || !preload_test::on_stand_in()) return;
  }
  CHECK_MSG(false, "in five rounds, the first free returned before the second began");
}

// The second free gives up on the first after the library's bound, before the first returns.
void double_free_past_the_wait() {
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's free delays");
  const std::uint64_t before = preload_test::counter("live_bytes");
  void* p = allocate(Through::malloc_async);
  cudaError_t first = cudaErrorUnknown;
  std::atomic<bool> returned{false};
  std::thread freer = release_elsewhere(Through::malloc_async, p, &first, &returned);
  // Once the driver freed it, the first free is inside it for 6 s (a fixed 20 ms, on a loaded
  // machine, let the second free reach the driver first).
  wait_for_live_bytes(before, returned);
  const auto began = std::chrono::steady_clock::now();
  CHECK_RESULT(cudaFree(p), cudaErrorInvalidValue);
  const auto waited = std::chrono::steady_clock::now() - began;
  // Not a wait for the first's return (6 s), nor no wait at all.
  CHECK_MSG(!returned.load(), "the first free returned before the second gave up");
  CHECK_MSG(waited >= std::chrono::seconds(4), "the second free did not wait for the first");
  freer.join();
  CHECK_CUDA(first);
}

void reused_address_across_a_stop() {
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's free delays");
  for (int round = 0; round < 5; ++round) {
    const std::uint64_t before = preload_test::counter("live_bytes");
    void* first = allocate(Through::malloc_async);
    cudaError_t first_freed = cudaErrorUnknown;
    std::atomic<bool> returned{false};
    std::thread freer = release_elsewhere(Through::malloc_async, first, &first_freed, &returned);
    wait_for_live_bytes(before, returned);
    void* second = allocate(Through::malloc_async);
    // The first free returns 1 s after it freed the memory: the stop begins well within that.
    const pid_t stopper = preload_test::stop_this_process(100, 6000);
    const bool racing = second == first && !returned.load();
    const auto began = std::chrono::steady_clock::now();
    const cudaError_t result = release(Through::malloc_async, second);
    const bool stopped_in_wait = std::chrono::steady_clock::now() - began > std::chrono::seconds(5);
    int status = 0;
    CHECK_MSG(waitpid(stopper, &status, 0) == stopper, "waitpid failed");
    freer.join();
    CHECK_CUDA(first_freed);
    CHECK_MSG(result == cudaSuccess,
              "a free of a live buffer failed (" + preload_test::error_text(result) +
                  ") after the process was stopped while it waited for another thread's free of "
                  "an earlier buffer at its address");
    CHECK_MSG(preload_test::counter("live_bytes") == before, "a freed buffer is still live");
    if (racing && stopped_in_wait) return;
  }
  CHECK_MSG(false, "in five rounds, the process was never stopped while the second free waited");
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  if (argc > 1 && std::string(argv[1]) == "slow") {
    double_free_past_the_wait();
    std::printf("a double free past the wait: refused while the first was under way\n");
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "stopped") {
    reused_address_across_a_stop();
    std::printf("a reused address freed across a stop of the process: freed\n");
    return 0;
  }
  reused_address_is_freed(Through::malloc_async, "cudaMallocAsync");
  reused_address_is_freed(Through::malloc, "cudaMalloc passed through, under a budget");
  reused_address_is_freed(Through::driver, "cuMemAlloc");
  double_free_succeeds_once();
  std::printf("two frees of one address at once: answered as plain CUDA answers them\n");
  return 0;
}
