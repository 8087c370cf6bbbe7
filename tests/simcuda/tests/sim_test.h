// Helpers of the 'sim' test programs. The programs are plain CUDA runtime programs: run with
// LD_LIBRARY_PATH at the stand-in they test it, without it they run on a real GPU. Checks that
// only hold on the stand-in (counters, injected errors, the race detector) go through
// stand_in(), which is null on the real runtime, and are skipped there.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../simcuda.h"

#define CUDA_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

namespace simtest {

// The stand-in's own API, resolved at run time; every member is null on a real GPU.
struct StandIn {
  decltype(&simcuda_counter) counter = nullptr;
  decltype(&simcuda_reset_counters) reset_counters = nullptr;
  decltype(&simcuda_launch_access) launch_access = nullptr;
  decltype(&simcuda_set_sticky_error) set_sticky_error = nullptr;
};

inline const StandIn* stand_in() {
  static const StandIn api = [] {
    StandIn s;
    s.counter = SIMCUDA_LOOKUP(simcuda_counter);
    s.reset_counters = SIMCUDA_LOOKUP(simcuda_reset_counters);
    s.launch_access = SIMCUDA_LOOKUP(simcuda_launch_access);
    s.set_sticky_error = SIMCUDA_LOOKUP(simcuda_set_sticky_error);
    return s;
  }();
  return api.counter ? &api : nullptr;
}

inline uint64_t counter(const char* name) { return stand_in() ? stand_in()->counter(name) : 0; }

// Decorator of a test case whose every check holds only on the stand-in:
// TEST_CASE("..." * STAND_IN_ONLY). On a real GPU doctest reports the case as skipped instead of
// counting a pass that checked nothing.
#define STAND_IN_ONLY doctest::skip(simtest::stand_in() == nullptr)

// Ends a test case early, saying why, when the rest of it cannot run here (a second device, the
// stand-in's exact accounting). What ran before still counts.
#define SIM_SKIP_REST_UNLESS(cond, why)                 \
  do {                                                  \
    if (!(cond)) {                                      \
      MESSAGE("rest of this case skipped: " why);       \
      return;                                           \
    }                                                   \
  } while (0)

// The number of devices, 0 when CUDA reports none. Usable in a decorator (evaluated when the
// case registers, before main): TEST_CASE("..." * doctest::skip(simtest::device_count() < 2)).
inline int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// For a program whose every case needs the stand-in: on a real GPU it exits with meson's
// "skipped" status instead of reporting passes.
inline void exit_77_without_stand_in(const char* program) {
  if (stand_in()) return;
  std::printf("%s: skipped: needs the CUDA stand-in (no simcuda_counter: a real GPU)\n", program);
  std::fflush(stdout);
  std::exit(77);
}

// A gate a stream can be parked on: a host function waits until the test opens it. Lets a test
// hold a stream's queue deterministically.
//
// Both waits are bounded, and the destructor opens the gate and waits for the host function to
// leave: a check that fails while a stream is parked (an exception out of the case) must not
// leave CUDA's host-function thread blocked for ever, which on a real GPU would hang every later
// synchronization of the program until a test timeout kills it.
class Gate {
 public:
  static constexpr auto kLimit = std::chrono::seconds(30);

  static void CUDART_CB wait_fn(void* self) { static_cast<Gate*>(self)->wait(); }
  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() {
    std::unique_lock lock(m_);
    open_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, kLimit, [&] { return !inside_; });
  }
  void open() {
    std::lock_guard lock(m_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(m_);
    entered_ = true;
    inside_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, kLimit, [&] { return open_; });
    inside_ = false;
    cv_.notify_all();
  }
  // Waits until a stream has reached the gate (its earlier work is done).
  void wait_entered() {
    std::unique_lock lock(m_);
    bool reached = cv_.wait_for(lock, kLimit, [&] { return entered_; });
    lock.unlock();
    if (reached) return;
    if (doctest::is_running_in_test) FAIL("the stream never reached the gate");
    std::fprintf(stderr, "the stream never reached the gate\n");  // a child scenario
    std::abort();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
  bool entered_ = false;
  bool inside_ = false;
};

// Counts host-function executions, in order.
struct Recorder {
  std::mutex m;
  std::vector<int> order;
  void add(int v) {
    std::lock_guard lock(m);
    order.push_back(v);
  }
  std::vector<int> get() {
    std::lock_guard lock(m);
    return order;
  }
};

struct Tag {
  Recorder* rec;
  int value;
  static void CUDART_CB fn(void* self) {
    auto* t = static_cast<Tag*>(self);
    t->rec->add(t->value);
  }
};

// Polls `pred` for up to `seconds`; for effects that happen on CUDA's own threads.
template <class Pred>
bool eventually(Pred pred, double seconds = 5.0) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// Runs this program again as a child with `argument` and the extra environment entries `env`
// ("NAME=value"; the stand-in's knobs and CUDA_MODULE_LOADING are unset first); returns the
// child's stderr and sets its wait status.
inline std::string run_child(const char* argument, std::initializer_list<const char*> env,
                             int* status) {
  int fds[2];
  REQUIRE_EQ(pipe(fds), 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    for (const char* name : {"SIMCUDA_DEVICES", "SIMCUDA_DEVICE_MEMORY", "SIMCUDA_OP_DELAY_US",
                             "SIMCUDA_STRICT", "SIMCUDA_CONCURRENT_MANAGED", "SIMCUDA_CODE_BYTES",
                             "CUDA_MODULE_LOADING"})
      unsetenv(name);
    for (const char* e : env) putenv(const_cast<char*>(e));
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) _exit(127);
    self[n] = '\0';
    execl(self, self, argument, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char chunk[512];
  ssize_t n;
  while ((n = read(fds[0], chunk, sizeof chunk)) > 0) out.append(chunk, static_cast<size_t>(n));
  close(fds[0]);
  waitpid(pid, status, 0);
  return out;
}

}  // namespace simtest
