// Preload test: frees made by a signal handler while the thread it interrupted is inside one of
// the library's calls (Note [Frees from inside a call] in interpose/deferred_frees.cpp). A SIGINT
// handler frees a 256 KiB buffer, the first slice of its 2 MiB page, while the main thread waits
// in cudaDeviceSynchronize behind a 300 ms "kernel"; the program then allocates and clears a
// 4 MiB buffer. The seven buffers it kept must keep their bytes, and the freed memory must come
// back to the pools. It used to reach the real cudaFree, which gave the whole page to the driver,
// and the next growth got it over the seven live buffers. In a child, a handler that calls
// exit(130) there, with static destructors freeing four buffers and aborting on any error (a
// usual CUDA_CHECK), must exit with 130, as the plain program does; it aborted on
// cudaErrorInvalidValue.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kBuffer = 256 << 10;

void sleep_300_ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// A 300 ms operation on the legacy stream, and SIGINT to the process 50 ms into it while this
// thread waits in cudaDeviceSynchronize.
void interrupt_device_synchronize(void* buffer) {
  const preload_test::LaunchAccessFn launch = preload_test::launch_access_function();
  CHECK(launch(nullptr, buffer, 16, 0, &sleep_300_ms, nullptr) == 0);
  std::thread sender([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(::getpid(), SIGINT);
  });
  CHECK_CUDA(cudaDeviceSynchronize());
  sender.join();
}

void* g_freed_by_handler = nullptr;
volatile cudaError_t g_handler_result = cudaErrorUnknown;
void free_on_sigint(int) { g_handler_result = cudaFree(g_freed_by_handler); }

struct Buffers {
  std::vector<void*> held;
  ~Buffers() {
    for (void* p : held) {
      if (cudaFree(p) != cudaSuccess) std::abort();
    }
    std::printf("freed %zu buffers\n", held.size());
    std::fflush(stdout);
  }
};
Buffers g_buffers;

void exit_on_sigint(int) { std::exit(130); }

int exit_child() {
  for (int i = 0; i < 4; ++i) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    g_buffers.held.push_back(p);
  }
  ::signal(SIGINT, exit_on_sigint);
  interrupt_device_synchronize(g_buffers.held[0]);
  return 0;  // not reached: the handler exits
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's timed operations");
  if (argc > 1 && std::string(argv[1]) == "exit") return exit_child();

  std::vector<void*> buffers(8);
  for (void*& p : buffers) {
    CHECK_CUDA(cudaMalloc(&p, kBuffer));
    CHECK_CUDA(cudaMemset(p, 0x5a, kBuffer));
  }
  // The lowest starts the page the others share.
  std::size_t lowest = 0;
  for (std::size_t i = 1; i < buffers.size(); ++i)
    if (buffers[i] < buffers[lowest]) lowest = i;
  g_freed_by_handler = buffers[lowest];
  buffers.erase(buffers.begin() + static_cast<std::ptrdiff_t>(lowest));
  struct sigaction action {};
  action.sa_handler = free_on_sigint;
  CHECK(::sigaction(SIGINT, &action, nullptr) == 0);
  interrupt_device_synchronize(buffers[0]);
  CHECK(g_handler_result == cudaSuccess);

  void* work = nullptr;
  CHECK_CUDA(cudaMalloc(&work, 4 << 20));
  CHECK_CUDA(cudaMemset(work, 0, 4 << 20));
  std::vector<unsigned char> bytes(kBuffer);
  for (void* p : buffers) {
    CHECK_CUDA(cudaMemcpy(bytes.data(), p, kBuffer, cudaMemcpyDeviceToHost));
    std::size_t changed = 0;
    for (unsigned char b : bytes) changed += b != 0x5a;
    CHECK_MSG(changed == 0, std::to_string(changed) + " bytes of a kept buffer changed");
  }
  // The handler's free came back to the pools: freeing it again is a double free.
  CHECK_RESULT(cudaFree(g_freed_by_handler), cudaErrorInvalidValue);
  CHECK_CUDA(cudaFree(work));
  for (void* p : buffers) CHECK_CUDA(cudaFree(p));

  const preload_test::ChildResult exited = preload_test::run_self("exit", {}, 30);
  CHECK_MSG(exited.status == 130 && exited.output.find("freed 4 buffers") != std::string::npos,
            "status " + std::to_string(exited.status) + ":\n" + exited.output);
  std::printf("ok\n");
  return 0;
}
