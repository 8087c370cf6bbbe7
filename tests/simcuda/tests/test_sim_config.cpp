// The stand-in's environment variables: device count, capacity with suffixes, operation delay,
// stream handle reuse, a late destructor thread, and malformed values stopping the program with a
// message that names the variable. Each case runs this program again as a child with its own
// environment. Stand-in only.
#define DOCTEST_CONFIG_IMPLEMENT
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "sim_test.h"

using simtest::run_child;
using simtest::stand_in;

namespace {

// Child: prints "count=<n> rc=<code> total=<bytes> memset_ms=<ms> concurrent=<0|1> reused=<0|1>
// reset=<code>" on stderr; reset: cudaDeviceReset's answer with no device (-1 with one); reused: a
// stream created after one was destroyed got the destroyed one's handle (it works, and a stream
// created once the first is gone gets yet another handle).
int child_report() {
  int count = -1;
  cudaError_t rc = cudaGetDeviceCount(&count);
  size_t free_bytes = 0, total = 0;
  double ms = -1;
  int concurrent = -1;
  if (rc == cudaSuccess) {
    cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
    cudaMemGetInfo(&free_bytes, &total);
    void* p = nullptr;
    cudaMalloc(&p, 256);
    auto t0 = std::chrono::steady_clock::now();
    cudaMemset(p, 0, 256);
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    cudaFree(p);
  }
  int reused = -1;
  cudaStream_t first = nullptr, second = nullptr, third = nullptr;
  if (rc == cudaSuccess && cudaStreamCreate(&first) == cudaSuccess &&
      cudaStreamDestroy(first) == cudaSuccess && cudaStreamCreate(&second) == cudaSuccess &&
      cudaStreamSynchronize(second) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
      cudaStreamCreate(&third) == cudaSuccess && third != second &&
      cudaStreamDestroy(third) == cudaSuccess && cudaStreamDestroy(second) == cudaSuccess)
    reused = first == second ? 1 : 0;
  const int reset = rc == cudaSuccess ? -1 : static_cast<int>(cudaDeviceReset());
  std::fprintf(stderr,
               "count=%d rc=%d total=%zu memset_ms=%.1f concurrent=%d reused=%d reset=%d\n", count,
               static_cast<int>(rc), total, ms, concurrent, reused, reset);
  return 0;
}

std::string field(const std::string& out, const char* name) {
  size_t at = out.find(std::string(name) + "=");
  if (at == std::string::npos) return "";
  at += std::strlen(name) + 1;
  return out.substr(at, out.find_first_of(" \n", at) - at);
}

}  // namespace

TEST_CASE("device count and capacity come from the environment") {
  if (!stand_in()) return;
  int status = 0;
  std::string out = run_child("--child", {"SIMCUDA_DEVICES=3", "SIMCUDA_DEVICE_MEMORY=3M"}, &status);
  CHECK(WIFEXITED(status));
  CHECK_EQ(field(out, "count"), "3");
  CHECK_EQ(field(out, "total"), std::to_string(3 << 20));
  out = run_child("--child", {"SIMCUDA_DEVICE_MEMORY=2GiB"}, &status);
  CHECK_EQ(field(out, "total"), std::to_string(size_t{2} << 30));
  out = run_child("--child", {"SIMCUDA_DEVICE_MEMORY=12345"}, &status);
  CHECK_EQ(field(out, "total"), "12345");
  out = run_child("--child", {}, &status);
  CHECK_EQ(field(out, "count"), "1");
  CHECK_EQ(field(out, "total"), std::to_string(size_t{16} << 30));
  out = run_child("--child", {"SIMCUDA_DEVICES=0"}, &status);
  CHECK_EQ(field(out, "rc"), std::to_string(cudaErrorNoDevice));
  CHECK_EQ(field(out, "reset"), std::to_string(cudaErrorNoDevice));
}

TEST_CASE("SIMCUDA_CONCURRENT_MANAGED=0 takes concurrent managed access away") {
  if (!stand_in()) return;
  int status = 0;
  CHECK_EQ(field(run_child("--child", {}, &status), "concurrent"), "1");
  CHECK_EQ(field(run_child("--child", {"SIMCUDA_CONCURRENT_MANAGED=0"}, &status), "concurrent"),
           "0");
}

TEST_CASE("SIMCUDA_REUSE_STREAM_HANDLES=1 gives a destroyed stream's handle to the next stream") {
  if (!stand_in()) return;
  int status = 0;
  CHECK_EQ(field(run_child("--child", {}, &status), "reused"), "0");
  CHECK_EQ(field(run_child("--child", {"SIMCUDA_REUSE_STREAM_HANDLES=1"}, &status), "reused"),
           "1");
}

TEST_CASE("SIMCUDA_OP_DELAY_US slows every stream operation") {
  if (!stand_in()) return;
  int status = 0;
  std::string out = run_child("--child", {"SIMCUDA_OP_DELAY_US=30000"}, &status);
  CHECK(std::stod(field(out, "memset_ms")) >= 29.0);
}

TEST_CASE("malformed values stop the program with a message naming the variable") {
  if (!stand_in()) return;
  const char* bad[] = {"SIMCUDA_DEVICE_MEMORY=lots", "SIMCUDA_DEVICE_MEMORY=16X",
                       "SIMCUDA_DEVICE_MEMORY=0",    "SIMCUDA_DEVICE_MEMORY=-1G",
                       "SIMCUDA_DEVICES=two",        "SIMCUDA_DEVICES=-1",
                       "SIMCUDA_DEVICES=65",         "SIMCUDA_OP_DELAY_US=1ms",
                       "SIMCUDA_CODE_BYTES=4Q",      "SIMCUDA_CODE_BYTES=-1",
                       "CUDA_MODULE_LOADING=DEFAULT"};
  for (const char* env : bad) {
    CAPTURE(env);
    int status = 0;
    std::string out = run_child("--child", {env}, &status);
    CHECK(WIFSIGNALED(status));
    std::string name(env, std::strchr(env, '=') - env);
    CHECK(out.find(name) != std::string::npos);
    CHECK(out.find("count=") == std::string::npos);  // nothing ran
  }
}

namespace {

// Child: a graph holding a user object is destroyed; prints "late=<0|1> ran=<0|1>": whether the
// destructor had not run 50 ms after the destroy, and whether it ran within 5 s.
std::atomic<int> destructor_runs{0};
int child_destructor() {
  cudaUserObject_t object = nullptr;
  cudaGraph_t graph = nullptr;
  if (cudaUserObjectCreate(&object, nullptr, [](void*) { destructor_runs.fetch_add(1); }, 1,
                           cudaUserObjectNoDestructorSync) != cudaSuccess ||
      cudaGraphCreate(&graph, 0) != cudaSuccess ||
      cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove) != cudaSuccess ||
      cudaGraphDestroy(graph) != cudaSuccess)
    return 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int late = destructor_runs.load() == 0 ? 1 : 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (destructor_runs.load() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::fprintf(stderr, "late=%d ran=%d\n", late, destructor_runs.load());
  return 0;
}

}  // namespace

TEST_CASE("SIMCUDA_DESTRUCTOR_DELAY_US makes the internal thread run a destructor late") {
  if (!stand_in()) return;
  int status = 0;
  CHECK_EQ(field(run_child("--destructor", {}, &status), "ran"), "1");
  const std::string out =
      run_child("--destructor", {"SIMCUDA_DESTRUCTOR_DELAY_US=1000000"}, &status);
  CHECK_EQ(field(out, "late"), "1");
  CHECK_EQ(field(out, "ran"), "1");
}

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--child") == 0) return child_report();
  if (argc == 2 && std::strcmp(argv[1], "--destructor") == 0) return child_destructor();
  simtest::exit_77_without_stand_in("test_sim_config");
  doctest::Context context(argc, argv);
  return context.run();
}
