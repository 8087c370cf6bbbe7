// The stand-in's race detector: it reports two unordered streams touching one buffer (at least
// one writing) and stays silent when an event, the legacy stream or a single stream orders them.
// A parked stream (a Gate inside an operation that declares its access) makes each case
// deterministic. The report at exit and strict mode are checked in child processes of this
// program. Stand-in only: every case skips on a real GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstring>
#include <string>

#include "sim_test.h"

using simtest::counter;
using simtest::Gate;
using simtest::stand_in;

namespace {

struct Fixture {
  void* buf = nullptr;
  cudaStream_t a = nullptr;
  cudaStream_t b = nullptr;
  Fixture() {
    REQUIRE_EQ(cudaMalloc(&buf, 1 << 16), cudaSuccess);
    REQUIRE_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    REQUIRE_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    stand_in()->reset_counters();
  }
  ~Fixture() {
    cudaDeviceSynchronize();
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFree(buf);
  }
  // Parks stream `s` inside an operation that reads or writes [buf+off, buf+off+n).
  void park(cudaStream_t s, Gate& gate, size_t off, size_t n, bool write) {
    REQUIRE_EQ(stand_in()->launch_access(s, static_cast<char*>(buf) + off, n, write,
                                         Gate::wait_fn, &gate),
               cudaSuccess);
    gate.wait_entered();
  }
};

// Lets the other stream's operation reach its start (it cannot finish before the gate opens
// only if it is ordered; an unordered one runs now).
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

// Child-process scenarios: a race, then exit normally (report) or abort (strict mode).
int child_race() {
  void* buf = nullptr;
  cudaStream_t a, b;
  cudaMalloc(&buf, 4096);
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  Gate gate;
  SIMCUDA_LOOKUP(simcuda_launch_access)(a, buf, 4096, 1, Gate::wait_fn, &gate);
  gate.wait_entered();
  cudaMemsetAsync(buf, 1, 4096, b);
  cudaStreamSynchronize(b);
  gate.open();
  cudaDeviceSynchronize();
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFree(buf);
  return 0;
}

}  // namespace

TEST_CASE("two unordered streams writing one buffer: a race") {
  if (!stand_in()) return;
  Fixture f;
  Gate gate;
  f.park(f.a, gate, 0, 4096, true);
  CUDA_OK(cudaMemsetAsync(f.buf, 0, 4096, f.b));
  CUDA_OK(cudaStreamSynchronize(f.b));  // ran while stream a was inside its write
  gate.open();
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(counter("races"), 1u);
}

TEST_CASE("ordered by an event: no race") {
  if (!stand_in()) return;
  Fixture f;
  Gate gate;
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  f.park(f.a, gate, 0, 4096, true);
  CUDA_OK(cudaEventRecord(ev, f.a));
  CUDA_OK(cudaStreamWaitEvent(f.b, ev, 0));
  CUDA_OK(cudaMemsetAsync(f.buf, 0, 4096, f.b));
  settle();
  CHECK_EQ(cudaStreamQuery(f.b), cudaErrorNotReady);
  gate.open();
  CUDA_OK(cudaStreamSynchronize(f.b));
  CHECK_EQ(counter("races"), 0u);
  CUDA_OK(cudaEventDestroy(ev));
}

TEST_CASE("reads do not race with reads; disjoint ranges do not race") {
  if (!stand_in()) return;
  Fixture f;
  Gate gate;
  f.park(f.a, gate, 0, 4096, false);
  CUDA_OK(stand_in()->launch_access(f.b, f.buf, 4096, 0, nullptr, nullptr));
  CUDA_OK(cudaMemsetAsync(static_cast<char*>(f.buf) + 4096, 0, 4096, f.b));
  CUDA_OK(cudaStreamSynchronize(f.b));
  CHECK_EQ(counter("races"), 0u);
  // A copy reading the parked read's range is fine; one writing into it is a race.
  std::vector<char> host(256);
  CUDA_OK(cudaMemcpyAsync(host.data(), f.buf, 256, cudaMemcpyDeviceToHost, f.b));
  CUDA_OK(cudaStreamSynchronize(f.b));
  CHECK_EQ(counter("races"), 0u);
  CUDA_OK(cudaMemcpyAsync(f.buf, host.data(), 256, cudaMemcpyHostToDevice, f.b));
  CUDA_OK(cudaStreamSynchronize(f.b));
  CHECK_EQ(counter("races"), 1u);
  gate.open();
}

TEST_CASE("one stream, or the legacy stream after a blocking stream: no race") {
  if (!stand_in()) return;
  Fixture f;
  cudaStream_t blocking;
  CUDA_OK(cudaStreamCreate(&blocking));
  Gate gate;
  f.park(blocking, gate, 0, 4096, true);
  CUDA_OK(cudaMemsetAsync(f.buf, 0, 4096, blocking));  // same stream: ordered
  CUDA_OK(cudaMemsetAsync(f.buf, 0, 4096, 0));         // legacy stream: waits for `blocking`
  settle();
  CHECK_EQ(cudaStreamQuery(0), cudaErrorNotReady);
  gate.open();
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(counter("races"), 0u);
  CUDA_OK(cudaStreamDestroy(blocking));
}

TEST_CASE("a non-blocking stream is not ordered by the legacy stream: race") {
  if (!stand_in()) return;
  Fixture f;
  Gate gate;
  f.park(0, gate, 0, 4096, true);
  CUDA_OK(cudaMemsetAsync(f.buf, 0, 4096, f.a));
  CUDA_OK(cudaStreamSynchronize(f.a));
  gate.open();
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(counter("races"), 1u);
}

TEST_CASE("cudaFreeAsync on another stream while the buffer is in use: race") {
  if (!stand_in()) return;
  Fixture f;
  void* p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 4096, f.a));
  Gate gate;
  REQUIRE_EQ(stand_in()->launch_access(f.a, p, 4096, 0, Gate::wait_fn, &gate), cudaSuccess);
  gate.wait_entered();
  CUDA_OK(cudaFreeAsync(p, f.b));
  CUDA_OK(cudaStreamSynchronize(f.b));
  gate.open();
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(counter("races"), 1u);
}

TEST_CASE("races are reported at exit with both operations; strict mode aborts") {
  if (!stand_in()) return;
  int status = 0;
  std::string err = simtest::run_child("--child-race", {}, &status);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  CHECK(err.find("1 race(s) detected") != std::string::npos);
  CHECK(err.find("cudaMemsetAsync") != std::string::npos);
  CHECK(err.find("kernel writing") != std::string::npos);
  err = simtest::run_child("--child-race", {"SIMCUDA_STRICT=1"}, &status);
  CHECK(WIFSIGNALED(status));
  CHECK(err.find("SIMCUDA_STRICT") != std::string::npos);
}

int main(int argc, char** argv) {
  simtest::exit_77_without_stand_in("test_sim_race");
  if (argc == 2 && std::strcmp(argv[1], "--child-race") == 0) return child_race();
  doctest::Context context(argc, argv);
  return context.run();
}
