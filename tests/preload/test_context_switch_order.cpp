// Preload test: a device made current by a switch of the driver context (cuCtxSetCurrent,
// cuCtxPushCurrent and cuCtxPopCurrent, or cuCtxCreate), then used through the runtime, ends
// stream-ordered reuse as cudaSetDevice does (free_fence:auto, docs/fences.md). Device 0 reads a buffer behind a
// 300 ms operation and the program frees it (plain cudaFree waits for device 0 there); the next
// allocation gets the same memory at once, as device 0 alone orders its reuse; then device 1's
// legacy stream, made current by the switch, writes the new buffer. The old owner's read must
// still see the old bytes: the switch went unseen, device 0 kept reusing memory at once, and the
// read got the new owner's bytes.
#include <cuda.h>
#include <unistd.h>

#include <vector>

#include "check.h"

#define CHECK_CU(expr) CHECK((expr) == CUDA_SUCCESS)

namespace {

constexpr std::size_t kBuffer = 1 << 20;

void sleep_300_ms(void*) { ::usleep(300000); }

// `switch_to` makes device 1's primary context current, `switch_back` device 0's.
template <typename To, typename Back>
int round(To&& switch_to, Back&& switch_back) {
  void* old_buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&old_buffer, kBuffer));
  CHECK_CUDA(cudaMemset(old_buffer, 0x11, kBuffer));
  std::vector<unsigned char> read(kBuffer, 0);
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  CHECK(launch(nullptr, old_buffer, 16, 0, &sleep_300_ms, nullptr) == 0);
  CHECK_CUDA(cudaMemcpyAsync(read.data(), old_buffer, kBuffer, cudaMemcpyDeviceToHost, nullptr));
  CHECK_CUDA(cudaFree(old_buffer));
  void* new_buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&new_buffer, kBuffer));
  switch_to();
  CHECK_CUDA(cudaMemsetAsync(new_buffer, 0x22, kBuffer, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  switch_back();
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(read[0] == 0x11 && read[kBuffer - 1] == 0x11, "the old owner read the new bytes");
  CHECK_CUDA(cudaFree(new_buffer));
  return 0;
}

int child(const std::string& how) {
  CHECK_CUDA(cudaFree(nullptr));
  CUcontext first = nullptr;
  CUcontext second = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&first, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&second, 1));
  if (how == "create") {  // cuCtxCreate makes its context current
    CUcontext made = nullptr;
    return round([&] { CHECK_CU(cuCtxCreate(&made, nullptr, 0, 1)); }, [&] {
      CUcontext popped = nullptr;
      CHECK_CU(cuCtxPopCurrent(&popped));
    });
  }
  if (how == "set") {
    return round([&] { CHECK_CU(cuCtxSetCurrent(second)); },
                 [&] { CHECK_CU(cuCtxSetCurrent(first)); });
  }
  return round([&] { CHECK_CU(cuCtxPushCurrent(second)); }, [&] {
    CUcontext popped = nullptr;
    CHECK_CU(cuCtxPopCurrent(&popped));
  });
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's timed operations");
  if (argc > 1 && std::string(argv[1]) == "child") return child(std::getenv("CHILD_SWITCH"));
  for (const char* how : {"set", "push", "create"}) {
    // A fresh process each: one that has used device 1 no longer reuses at once anywhere.
    const preload_test::ChildResult result =
        preload_test::run_self("child", {std::string("CHILD_SWITCH=") + how}, 60);
    CHECK_MSG(result.status == 0, std::string(how) + ": " + result.output);
    std::printf("%s: ok\n", how);
  }
  return 0;
}
