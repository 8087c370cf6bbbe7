// Preload test: a device's primary context replaced by a new one that the hooks never saw go
// (Note [Primary contexts replaced] in interpose/driver_context.cpp). A driver-only program
// retains the primary context, allocates and frees a buffer (the pools keep its page), and drops
// the last reference through the driver's own release, which no hook wraps: the context and its
// memory are gone, as after a last release that raced another thread's retain. It retains the
// primary context again (a new one) and allocates: the pools must not hand out the dead
// context's page, whose copies the driver refuses. Three rounds, each with its own context.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "check.h"

namespace {

#define CHECK_CU(expr) CHECK_MSG((expr) == CUDA_SUCCESS, #expr)

constexpr std::size_t kBytes = 4096;

// Allocates in the current context, writes and reads back: the buffer must hold its bytes.
void round_trip(unsigned char fill) {
  CUdeviceptr buffer = 0;
  CHECK_CU(cuMemAlloc(&buffer, kBytes));
  std::vector<unsigned char> out(kBytes, fill), back(kBytes, 0);
  CHECK_CU(cuMemcpyHtoD(buffer, out.data(), kBytes));
  CHECK_CU(cuMemcpyDtoH(back.data(), buffer, kBytes));
  CHECK_MSG(std::memcmp(out.data(), back.data(), kBytes) == 0, "the buffer lost its bytes");
  CHECK_CU(cuMemFree(buffer));
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  using ReleaseFn = CUresult (*)(CUdevice);
  const auto real_release = preload_test::real_driver<ReleaseFn>("cuDevicePrimaryCtxRelease_v2");
  CHECK_CU(cuInit(0));
  unsigned long long last_id = 0;
  for (int round = 0; round < 3; ++round) {
    CUcontext primary = nullptr;
    CHECK_CU(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK_CU(cuCtxSetCurrent(primary));
    unsigned long long id = 0;
    CHECK_CU(cuCtxGetId(primary, &id));
    CHECK_MSG(id != last_id, "the primary context was not made anew");
    last_id = id;
    round_trip(static_cast<unsigned char>(0x40 + round));
    CHECK_CU(real_release(0));  // the last reference: the context goes
    unsigned int flags = 0;
    int active = 1;
    CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
    CHECK_MSG(active == 0, "the primary context outlived its last release");
  }
  std::printf("ok\n");
  return 0;
}
