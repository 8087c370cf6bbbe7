// Preload test: a program built like nvcc's default (static cudart). It links the stand-in's
// static-runtime archive instead of libcudart.so.13: its cudaMalloc is its own and reaches the
// driver only through dlopen("libcuda.so.1") + dlsym + cuGetProcAddress_v2, so only the
// library's driver-level hooks can see it.
//  - The resolver this program gets the same way hands out the library's hooks for exactly the
//    variants asked for (cuMemAlloc at 3020 is the hook of cuMemAlloc_v2, at 2000 the real v1).
//  - 1,000 allocate/free pairs after cudaFree(0) are served by the pools: the stand-in's
//    counters show a handful of driver allocations, the exit report 1,000 pooled reservations and
//    nothing passed through, and data round-trips.
//  - Capture begun through the driver on a stream created through the driver: frees during it
//    record no fence (the library knows the stream), the capture ends valid and its graph runs.
//  - A global-mode capture whose cudaMalloc and cudaFree (the driver's, underneath) allocate and
//    free temporaries in the window: the library pins them to the graph with user objects made
//    through the driver (there is no runtime to make them), so memory freed in the window goes
//    to no later allocation while the graph or its exec can replay it, replays leave new
//    buffers intact, and the report shows the pins released once both are destroyed.
//  - cudaFreeAsync and cudaDeviceReset reach the library through the driver (cuMemFreeAsync,
//    cuDevicePrimaryCtxReset_v2): a stream-ordered free is the pools', and a reset leaves the
//    pools nothing of the memory it freed.
//  - A kernel's first launch, whose module takes device memory, finds the room the pools' idle
//    page took: the runtime launches through the driver's cuLaunchKernel, which the library hooks.
// Stand-in only (suite standin): the program is linked with the stand-in.
#include <cuda.h>

#include <cstring>
#include <string>
#include <vector>

#include "capture_check.h"
#include "check.h"
#include "exit_report.h"

namespace {

constexpr int kPairs = 1000;

// Where a pointer lives: "poolcuda" for the library's hooks.
std::string owner_of(void* fn, std::string* symbol = nullptr) {
  Dl_info info{};
  if (fn == nullptr || ::dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "nowhere";
  if (symbol != nullptr) *symbol = info.dli_sname != nullptr ? info.dli_sname : "";
  return info.dli_fname;
}

void* resolve(const char* name, int version, cuuint64_t flags) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(driver != nullptr);
  auto get_proc = reinterpret_cast<decltype(&cuGetProcAddress_v2)>(
      ::dlsym(driver, "cuGetProcAddress_v2"));
  CHECK(get_proc != nullptr);
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  CHECK(get_proc(name, &fn, version, flags, &status) == CUDA_SUCCESS);
  CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
  return fn;
}

void check_hooked(const char* name, int version, cuuint64_t flags, const char* variant) {
  std::string symbol;
  const std::string file = owner_of(resolve(name, version, flags), &symbol);
  CHECK_MSG(file.find("poolcuda") != std::string::npos && symbol == variant,
            std::string(name) + " at " + std::to_string(version) + " is " + symbol + " in " +
                file + ", expected the library's " + variant);
}

void check_resolver() {
  check_hooked("cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
  check_hooked("cuMemFree", 13000, 0, "cuMemFree_v2");
  check_hooked("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2");
  check_hooked("cuStreamBeginCapture", 10010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
               "cuStreamBeginCapture_v2_ptsz");
  check_hooked("cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture");
  // The 32-bit v1 is not hooked: the real one, untouched.
  const std::string v1 = owner_of(resolve("cuMemAlloc", 2000, 0));
  CHECK_MSG(v1.find("poolcuda") == std::string::npos, "cuMemAlloc v1 came from " + v1);
}

void churn() {
  std::vector<unsigned char> pattern(64 << 10);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7);
  std::vector<unsigned char> back(pattern.size());
  for (int i = 0; i < kPairs; ++i) {
    void* ptr = nullptr;
    const std::size_t size = 4096u << (i % 5);
    CHECK_CUDA(cudaMalloc(&ptr, size));
    if (i % 50 == 0) {
      const std::size_t n = std::min(size, pattern.size());
      CHECK_CUDA(cudaMemcpy(ptr, pattern.data(), n, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(back.data(), ptr, n, cudaMemcpyDeviceToHost));
      CHECK(std::memcmp(back.data(), pattern.data(), n) == 0);
    }
    CHECK_CUDA(cudaFree(ptr));
    if (i % 100 == 99) CHECK_CUDA(cudaDeviceSynchronize());
  }
}

void capture_with_frees() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* target = nullptr;
  CHECK_CUDA(cudaMalloc(&target, 4096));
  std::vector<void*> buffers(600);  // more frees than one fence epoch holds
  for (void*& ptr : buffers) CHECK_CUDA(cudaMalloc(&ptr, 1024));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  // Counted from here: the begin may record the window's fence before the capture begins.
  const std::uint64_t records = preload_test::counter("cudaEventRecord");
  CHECK_CUDA(cudaMemsetAsync(target, 0x6b, 4096, stream));
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_MSG(preload_test::counter("cudaEventRecord") == records,
            "an event was recorded during the capture");
  preload_test::launch_once(graph, stream);
  CHECK(preload_test::device_bytes_equal(target, 4096, 0x6b));
  CHECK_CUDA(cudaFree(target));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

// Run as its own child (capture_check.h), with SIMCUDA_STRICT=1: a race aborts it.
int capture_child() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t size = 256 << 10;
  void* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, size));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, size));  // illegal in a global-mode window without the library
  CHECK_CUDA(cudaMemsetAsync(first, 0x3d, size, stream));
  void* second = nullptr;
  CHECK_CUDA(cudaMalloc(&second, size));
  CHECK_CUDA(cudaMemcpyAsync(second, first, size, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaFree(first));
  CHECK_CUDA(cudaMemcpyAsync(out, second, size, cudaMemcpyDeviceToDevice, stream));
  CHECK_CUDA(cudaFree(second));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  preload_test::Held held = preload_test::held_by_graphs();
  CHECK_MSG(held.graphs == 1 && held.pinned_bytes >= 2 * size,
            "the window's memory is not pinned to the graph");
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphDestroy(graph));
  std::vector<void*> fresh(8);
  for (void*& ptr : fresh) {
    CHECK_CUDA(cudaMalloc(&ptr, size));
    CHECK_MSG(ptr != first && ptr != second, "a graph's memory went to a new allocation");
    CHECK_CUDA(cudaMemset(ptr, 0x5a, size));
  }
  for (int i = 0; i < 50; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(preload_test::device_bytes_equal(out, size, 0x3d));
  for (void* ptr : fresh) CHECK(preload_test::device_bytes_equal(ptr, size, 0x5a));
  for (void* ptr : fresh) CHECK_CUDA(cudaFree(ptr));
  CHECK(preload_test::held_by_graphs().graphs == 1);  // the exec still holds the memory
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_MSG(preload_test::graphs_released(), "the graph is gone but its memory stays pinned");
  CHECK(preload_test::held_by_graphs().pinned_bytes == 0);
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("capture child ok\n");
  return 0;
}

// Run with SIMCUDA_CODE_BYTES=64M on a 1 GiB device, memgetinfo:raw: a kernel's first launch,
// which this runtime makes through the driver's cuLaunchKernel, finds the room the pools' idle
// page took (Note [Launches short of memory] in interpose/hooks.cpp), and the runtime never sees
// a refusal: the launch ends as every stand-in launch does, refused as device code it cannot run.
int launch_child() {
  constexpr std::size_t kCode = 64u << 20;
  CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, (free_bytes - kCode / 2) & ~((std::size_t{1} << 20) - 1)));
  CHECK_CUDA(cudaFree(buffer));
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  CHECK_MSG(free_bytes < kCode, "the freed buffer's page did not stay with the pools");
  static const char kernel = 0;
  const cudaError_t result = cudaLaunchKernel(&kernel, dim3{1, 1, 1}, dim3{1, 1, 1}, nullptr, 0,
                                              nullptr);
  CHECK_MSG(result == cudaErrorNotSupported, preload_test::error_text(result));
  CHECK(cudaGetLastError() == cudaErrorNotSupported);
  CHECK(cudaGetLastError() == cudaSuccess);
  std::printf("launch child ok\n");
  return 0;
}

// cudaFreeAsync and cudaDeviceReset reach the library through the driver too: a stream-ordered
// free of pooled memory is the pools' (its second free is a double free), and after a reset the
// pools hand out none of the memory the reset freed (a new buffer keeps its bytes, and a free of
// a pointer from before the reset changes nothing of it).
void frees_and_reset() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* ordered = nullptr;
  CHECK_CUDA(cudaMalloc(&ordered, 4096));
  CHECK_CUDA(cudaFreeAsync(ordered, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(cudaFree(ordered) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_CUDA(cudaStreamDestroy(stream));
  void* before = nullptr;
  CHECK_CUDA(cudaMalloc(&before, 1000));
  CHECK_CUDA(cudaDeviceReset());
  void* after = nullptr;
  CHECK_CUDA(cudaMalloc(&after, 1000));
  CHECK_CUDA(cudaMemset(after, 0x33, 1000));
  std::vector<unsigned char> bytes(1000);
  CHECK_CUDA(cudaMemcpy(bytes.data(), after, 1000, cudaMemcpyDeviceToHost));
  CHECK(bytes[0] == 0x33 && bytes[999] == 0x33);
  if (before != after) {
    cudaFree(before);  // stale: whatever it answers, `after` stays
    cudaGetLastError();
  }
  CHECK_CUDA(cudaMemcpy(bytes.data(), after, 1000, cudaMemcpyDeviceToHost));
  CHECK(bytes[0] == 0x33);
  CHECK_CUDA(cudaFree(after));
}

int child() {
  CHECK(::dlsym(RTLD_DEFAULT, "cudaMalloc") != nullptr);  // the library's: nothing else exports it
  CHECK_CUDA(cudaFree(nullptr));
  check_resolver();
  const std::uint64_t mallocs = preload_test::counter("cudaMalloc");
  const std::uint64_t driver_allocs = preload_test::counter("cuMemAlloc");
  churn();
  const std::uint64_t made = preload_test::counter("cuMemAlloc") - driver_allocs;
  std::printf("%llu cudaMalloc, %llu driver allocations\n",
              static_cast<unsigned long long>(preload_test::counter("cudaMalloc") - mallocs),
              static_cast<unsigned long long>(made));
  CHECK(preload_test::counter("cudaMalloc") - mallocs == kPairs);
  CHECK_MSG(made <= 5, std::to_string(made) + " driver allocations for 1000 pairs");
  capture_with_frees();
  CHECK_CUDA(cudaGetLastError());
  std::printf("child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  if (argc > 1 && std::string(argv[1]) == "child:capture") return capture_child();
  if (argc > 1 && std::string(argv[1]) == "launch") return launch_child();
  if (argc > 1 && std::string(argv[1]) == "reset") {
    frees_and_reset();
    std::printf("reset ok\n");
    return 0;
  }
  preload_test::require_preloaded();
  CHECK(preload_test::on_stand_in());
  preload_test::ExitReport report = preload_test::run_with_exit_report("child");
  CHECK(report.reservations >= kPairs);
  CHECK(report.forwarded_mallocs == 0);
  CHECK(preload_test::run_capture_child("capture", {"SIMCUDA_STRICT=1"}) == 0);
  const preload_test::ChildResult launch = preload_test::run_self(
      "launch", {"SIMCUDA_CODE_BYTES=67108864", "SIMCUDA_DEVICE_MEMORY=1G",
                 "POOLCUDA_CONF=memgetinfo:raw"});
  CHECK_MSG(launch.status == 0, launch.output);
  const preload_test::ChildResult reset = preload_test::run_self("reset", {});
  CHECK_MSG(reset.status == 0, reset.output);
  std::printf("ok\n");
  return 0;
}
