// Preload test: a thread cancelled (pthread_cancel, deferred) while its cudaMalloc waits inside
// the library. A non-blocking stream parked on a host function still writes a freed 40 MiB
// buffer, so on a 64 MiB device the next 40 MiB request waits for that write's fence. The
// thread is cancelled during the wait: the wait must not be a cancellation point (Note
// [Cancellation] in pools/no_cancel.h). Before, the cancellation unwound into the entry point's
// catch-all and the C library aborted the process. Now the call completes once the stream goes
// on, the thread ends at its next cancellation point, and the process carries on with its
// memory intact. Runs in a child, so an abort fails the test with a message. The budget
// (limit:64M in meson.build) gives a GPU the stand-in's 64 MiB.
// In a second child, a thread with a cancellation pending makes the process's first CUDA call,
// which starts the library's reporter: the call must complete (the cancellation takes effect at
// the thread's next cancellation point, as without the library), and the reporter must be ready.
// The start used to be cancelled half-way, in the cudaMalloc, leaving a handler without its
// thread.
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <string>
#include <thread>

#include "check.h"

namespace {

constexpr std::size_t kSize = std::size_t{40} << 20;

std::atomic<bool> calling{false};
std::atomic<int> answer{-1};

void* allocate_then_stop(void*) {
  void* ptr = nullptr;
  calling = true;
  answer = cudaMalloc(&ptr, kSize);
  if (answer.load() == cudaSuccess) (void)cudaFree(ptr);
  pthread_testcancel();  // the cancellation asked for during the call takes effect here
  return nullptr;
}

int run() {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t parked = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  preload_test::Gate gate;
  CHECK_CUDA(cudaLaunchHostFunc(parked, &preload_test::wait_at_gate, &gate));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, kSize));
  CHECK_CUDA(cudaMemsetAsync(buffer, 1, kSize, parked));
  CHECK_CUDA(cudaFree(buffer));  // its fence waits for the parked stream

  pthread_t thread;
  CHECK(pthread_create(&thread, nullptr, &allocate_then_stop, nullptr) == 0);
  while (!calling.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // inside the wait by now
  CHECK(answer.load() == -1);
  CHECK(pthread_cancel(thread) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  gate.open = true;
  void* result = nullptr;
  CHECK(pthread_join(thread, &result) == 0);
  CHECK_MSG(result == PTHREAD_CANCELED, "the thread was not cancelled");
  CHECK_RESULT(static_cast<cudaError_t>(answer.load()), cudaSuccess);

  // The pools still work and keep their bytes.
  void* again = nullptr;
  CHECK_CUDA(cudaMalloc(&again, kSize));
  CHECK_CUDA(cudaMemset(again, 7, kSize));
  CHECK(preload_test::device_bytes_equal(again, kSize, 7));
  CHECK_CUDA(cudaFree(again));
  CHECK_CUDA(cudaStreamDestroy(parked));
  std::printf("child ok\n");
  return 0;
}

std::atomic<int> first_stage{0};

// Everything but the cancellation point in a frame of its own: the cancellation unwinds the
// thread's function without its epilogue, and AddressSanitizer then finds, at the thread's end,
// the guard bytes of the address-taken locals it left poisoned there.
[[gnu::noinline]] void first_call_after_cancel() {
  ::pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
  first_stage = 1;
  while (first_stage.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, nullptr);
  void* ptr = nullptr;
  answer = cudaMalloc(&ptr, 1 << 20);  // the process's first CUDA call
}

void* first_call_with_cancellation_pending(void*) {
  first_call_after_cancel();
  pthread_testcancel();
  return nullptr;
}

bool ready_mark() {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  char line[512];
  bool found = false;
  while (maps != nullptr && !found && std::fgets(line, sizeof line, maps) != nullptr)
    found = std::strstr(line, "poolcuda-ready.") != nullptr;
  if (maps != nullptr) std::fclose(maps);
  return found;
}

int first_call() {
  pthread_t thread;
  CHECK(pthread_create(&thread, nullptr, &first_call_with_cancellation_pending, nullptr) == 0);
  while (first_stage.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(pthread_cancel(thread) == 0);
  first_stage = 2;
  void* result = nullptr;
  CHECK(pthread_join(thread, &result) == 0);
  CHECK_MSG(result == PTHREAD_CANCELED, "the thread was not cancelled");
  CHECK_MSG(answer.load() == cudaSuccess, "cancelled inside cudaMalloc");
  CHECK_MSG(ready_mark(), "the reporter did not start");
  std::printf("first call ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc == 2 && std::string(argv[1]) == "child") return run();
  if (argc == 2 && std::string(argv[1]) == "first") return first_call();
  const preload_test::ChildResult first = preload_test::run_self("first", {}, 60);
  std::printf("%s", first.output.c_str());
  CHECK_MSG(first.status == 0, "first-call child exited with " + std::to_string(first.status));
  const preload_test::ChildResult child = preload_test::run_self("child", {}, 60);
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "child exited with " + std::to_string(child.status));
  std::printf("ok\n");
  return 0;
}
