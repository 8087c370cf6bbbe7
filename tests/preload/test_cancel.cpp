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
// In a third child, a thread is cancelled inside a cudaDeviceReset that waits for a parked
// stream: the reset runs whole (the cancellation takes effect when it returns), and the pools
// serve the reset device again. The reset used to be cancelled between the pools forgetting the
// device's memory and taking it up again: the device stayed frozen, and a free of a buffer the
// driver still held freed its whole page under the others.
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

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

constexpr std::size_t kSlice = std::size_t{256} << 10;
std::atomic<int> reset_answer{-1};

void* reset_then_stop(void*) {
  calling = true;
  reset_answer = cudaDeviceReset();
  pthread_testcancel();
  return nullptr;
}

int reset_run() {
  CHECK_CUDA(cudaFree(nullptr));
  cudaStream_t parked = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  preload_test::Gate gate;
  preload_test::park(parked, gate);
  std::vector<void*> buffers(8);
  for (void*& buffer : buffers) CHECK_CUDA(cudaMalloc(&buffer, kSlice));

  pthread_t thread;
  CHECK(pthread_create(&thread, nullptr, &reset_then_stop, nullptr) == 0);
  while (!calling.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // waiting for the stream
  CHECK(reset_answer.load() == -1);
  CHECK(pthread_cancel(thread) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  gate.open = true;
  void* result = nullptr;
  CHECK(pthread_join(thread, &result) == 0);
  CHECK_MSG(result == PTHREAD_CANCELED, "the thread was not cancelled");
  CHECK_RESULT(static_cast<cudaError_t>(reset_answer.load()), cudaSuccess);

  // A new device: the pools serve it, from one page (of the sliced pool a 64 MiB device has).
  const bool counted = preload_test::on_stand_in();
  const std::uint64_t mallocs = counted ? preload_test::counter("cudaMalloc") : 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    CHECK_CUDA(cudaMalloc(&buffers[i], kSlice));
    CHECK_CUDA(cudaMemset(buffers[i], static_cast<int>(i), kSlice));
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    CHECK(preload_test::device_bytes_equal(buffers[i], kSlice, static_cast<unsigned char>(i)));
    CHECK_CUDA(cudaFree(buffers[i]));
  }
  if (counted) {
    const std::uint64_t made = preload_test::counter("cudaMalloc") - mallocs;
    CHECK_MSG(made <= 1, "the pools did not serve: " + std::to_string(made) + " driver calls");
  }
  std::printf("reset ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc == 2 && std::string(argv[1]) == "child") return run();
  if (argc == 2 && std::string(argv[1]) == "first") return first_call();
  if (argc == 2 && std::string(argv[1]) == "reset") return reset_run();
  const preload_test::ChildResult first = preload_test::run_self("first", {}, 60);
  std::printf("%s", first.output.c_str());
  CHECK_MSG(first.status == 0, "first-call child exited with " + std::to_string(first.status));
  const preload_test::ChildResult child = preload_test::run_self("child", {}, 60);
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "child exited with " + std::to_string(child.status));
  const preload_test::ChildResult reset = preload_test::run_self("reset", {}, 60);
  std::printf("%s", reset.output.c_str());
  CHECK_MSG(reset.status == 0, "reset child exited with " + std::to_string(reset.status));
  std::printf("ok\n");
  return 0;
}
