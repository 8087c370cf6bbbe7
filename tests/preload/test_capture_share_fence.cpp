// Preload test, run under capture_share:on: a buffer freed inside a capture while a kernel on
// another stream still writes it is not handed to the next capture before that kernel is done
// (MemoryManager::reissue, Note [Releases inside a window] in pools/manager_api.cpp). The kernel
// (a stand-in kernel of 20 ms) fills the buffer with 0x44 on a stream that is not capturing; the
// buffer is freed in a relaxed capture; a second capture allocates the same size and sets it to
// 0x33; only that graph is launched. Plain, cudaFree waited for the kernel. Shared capture memory
// used to hand the freed buffer out at once: the graph's memset raced the kernel, and the new
// buffer ended with the kernel's bytes. Stand-in only (its kernels and race detector).
#include <cstring>
#include <utility>

#include "check.h"

namespace {

std::pair<void*, std::size_t> g_target;
void fill(void*) { std::memset(g_target.first, 0x44, g_target.second); }

}  // namespace

int main() {
  preload_test::require_preloaded();
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  if (launch == nullptr) preload_test::skip("needs the stand-in's kernels");
  CHECK_CUDA(cudaFree(nullptr));
  constexpr std::size_t kSize = std::size_t{32} << 20;
  cudaStream_t worker = nullptr;
  cudaStream_t capturing = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&worker, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, kSize));
  g_target = {buffer, kSize};
  const std::uint64_t races = preload_test::counter("races");

  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  CHECK(launch(worker, buffer, kSize, 1, fill, nullptr) == 0);  // not captured
  CHECK_CUDA(cudaFree(buffer));
  cudaGraph_t first = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &first));

  CHECK_CUDA(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
  void* reused = nullptr;
  CHECK_CUDA(cudaMalloc(&reused, kSize));
  CHECK_CUDA(cudaMemsetAsync(reused, 0x33, kSize, capturing));
  cudaGraph_t second = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(capturing, &second));
  preload_test::launch_once(second, capturing);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(preload_test::device_bytes_equal(reused, kSize, 0x33),
            "the new buffer holds the kernel's bytes");
  CHECK(preload_test::counter("races") == races);
  CHECK_CUDA(cudaGraphDestroy(first));
  CHECK_CUDA(cudaFree(reused));
  CHECK_CUDA(cudaStreamDestroy(worker));
  CHECK_CUDA(cudaStreamDestroy(capturing));
  std::printf("ok\n");
  return 0;
}
