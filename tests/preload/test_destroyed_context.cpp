// Preload test: driver calls made where no live context is current. CUDA leaves a context that
// one thread destroyed current on the threads that had it, and every driver call they make in it
// answers CUDA_ERROR_CONTEXT_IS_DESTROYED; a thread with no context at all gets
// CUDA_ERROR_INVALID_CONTEXT. Under the library a free there gave the program's live pooled
// buffer back to the pools (handed out again over its bytes), after a device reset the old
// primary context's calls reached the new one's pools, and a thread without a context that made
// the program's first direct driver call (cuMemFree of a pooled buffer) was bound to the primary
// context by the library's own calls, whose driver then freed the pools' page under them. Each
// case runs in a child of its own, where its first driver call is the program's first. Checked
// here, each with the plain answer:
//  - a thread with no context: its cuMemFree of a pooled buffer; it stays without a context;
//  - a context of cuCtxCreate, destroyed by the main thread while current on a worker: the
//    worker's cuMemFree, cuMemFreeAsync and cuMemAlloc;
//  - the primary context, reset by cudaDeviceReset on the main thread while current on a worker:
//    the worker's cuStreamCreate (the program's first direct driver call), cuMemAlloc and
//    cuMemFree of a buffer the main thread allocated after the reset; the worker's context
//    stays the dead one.
// In every case the buffer keeps its bytes and the program's own cudaFree of it succeeds.
#include <cuda.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

constexpr std::size_t kBytes = 4096;
constexpr unsigned char kFill = 0x42;

void* filled_buffer() {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, kBytes) == cudaSuccess);
  CHECK(cudaMemset(p, kFill, kBytes) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  return p;
}

// The buffer still holds its bytes after the program allocated and wrote another of its size
// (a buffer the pools took back would be that one), and the program's free of it succeeds.
void check_still_live(void* p) {
  void* other = filled_buffer();
  CHECK(cudaMemset(other, 0x17, kBytes) == cudaSuccess);
  std::vector<unsigned char> back(kBytes, 0);
  CHECK(cudaMemcpy(back.data(), p, kBytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (unsigned char byte : back) CHECK(byte == kFill);
  CHECK(cudaFree(other) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
}

// Runs `in_dead_context` on a worker thread whose context of its own the main thread destroyed.
template <typename Call>
void in_destroyed_own_context(Call&& in_dead_context) {
  CUdevice device = 0;
  CHECK_CU(cuDeviceGet(&device, 0));
  CUcontext own = nullptr;
  std::atomic<int> step{0};
  std::thread worker([&] {
    CHECK_CU(cuCtxCreate(&own, nullptr, 0, device));
    step = 1;
    while (step.load() < 2) std::this_thread::yield();
    in_dead_context();
  });
  while (step.load() < 1) std::this_thread::yield();
  CHECK_CU(cuCtxDestroy(own));
  step = 2;
  worker.join();
}

void own_context_destroyed() {
  void* p = filled_buffer();
  const CUdeviceptr d = reinterpret_cast<CUdeviceptr>(p);
  in_destroyed_own_context([&] {
    CHECK(cuMemFree(d) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK(cuMemFreeAsync(d, nullptr) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CUdeviceptr fresh = 0;
    CHECK(cuMemAlloc(&fresh, kBytes) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  });
  check_still_live(p);
}

void no_context() {
  void* p = filled_buffer();
  std::thread([&] {
    CUcontext current = nullptr;
    CHECK_CU(cuCtxGetCurrent(&current));
    CHECK(current == nullptr);
    CHECK(cuMemFree(reinterpret_cast<CUdeviceptr>(p)) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuCtxGetCurrent(&current));
    CHECK(current == nullptr);
  }).join();
  check_still_live(p);
}

void primary_context_reset() {
  CHECK(cudaFree(nullptr) == cudaSuccess);
  void* p = nullptr;
  CUcontext dead = nullptr;
  std::atomic<int> step{0};
  std::thread worker([&] {
    CHECK(cudaFree(nullptr) == cudaSuccess);  // the primary context, current here
    CHECK_CU(cuCtxGetCurrent(&dead));
    step = 1;
    while (step.load() < 2) std::this_thread::yield();
    // A driver may keep the primary context through a reset: then there is nothing to check.
    CUdevice on = 0;
    using GetDevice = CUresult (*)(CUdevice*);
    if (preload_test::real_driver<GetDevice>("cuCtxGetDevice")(&on) !=
        CUDA_ERROR_CONTEXT_IS_DESTROYED) {
      std::printf("the driver kept the primary context through the reset: not checked\n");
      return;
    }
    // The program's first direct driver calls: the library's own calls that the first one
    // makes elsewhere must not move this thread to the new primary context.
    CUstream stream = nullptr;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CUdeviceptr fresh = 0;
    CHECK(cuMemAlloc(&fresh, kBytes) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK(cuMemFree(reinterpret_cast<CUdeviceptr>(p)) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CUcontext now = nullptr;
    CHECK_CU(cuCtxGetCurrent(&now));
    CHECK(now == dead);
  });
  while (step.load() < 1) std::this_thread::yield();
  CHECK(cudaDeviceReset() == cudaSuccess);
  p = filled_buffer();  // in the new primary context
  step = 2;
  worker.join();
  check_still_live(p);
}

int run_case(const std::string& name) {
  CHECK_CU(cuInit(0));
  CHECK(cudaFree(nullptr) == cudaSuccess);
  if (name == "no-context") no_context();
  if (name == "reset") primary_context_reset();
  if (name == "own-context") own_context_destroyed();
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  preload_test::run_cases_in_children({"no-context", "reset", "own-context"});
  std::printf("ok\n");
  return 0;
}
