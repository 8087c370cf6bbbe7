// Preload test: a cudaMalloc refused in a destructor that runs at thread exit, in a thread whose
// earlier request was refused too. The library kept the pools' account of a refusal in a
// thread_local std::string, which glibc destroys at thread exit before destructors the program
// registered earlier; the second refusal wrote into the destroyed string and freed it again
// (glibc aborted the process, "unaligned tcache chunk detected"; the log line came out garbled).
// Each case runs in a child on the 64 MiB device (meson.build), three threads one after the
// other, each filling the device with 1 MiB buffers until refused:
//  - key: a pthread key's destructor asks for 1 MiB more (refused), then frees the buffers;
//  - thread-local: a thread_local object's destructor does the same;
//  - exit: the main thread fills the device, and a static object's destructor asks at exit.
// Every refusal must be said in whole lines, each naming the request.
#include <pthread.h>

#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Fills the device with 1 MiB buffers until the driver refuses one.
std::vector<void*>* fill_device() {
  auto* held = new std::vector<void*>;
  void* p = nullptr;
  while (cudaMalloc(&p, kMiB) == cudaSuccess) held->push_back(p);
  (void)cudaGetLastError();
  return held;
}

// Asks for one more buffer (refused: the device is full), then frees the buffers.
void refuse_then_free(std::vector<void*>* held) {
  void* p = nullptr;
  const cudaError_t answer = cudaMalloc(&p, kMiB);
  if (answer == cudaSuccess) (void)cudaFree(p);
  (void)cudaGetLastError();
  std::printf("destructor: %s\n", preload_test::error_text(answer).c_str());
  for (void* q : *held) (void)cudaFree(q);
  delete held;
}

pthread_key_t g_key;

struct ThreadHolder {
  std::vector<void*>* held = nullptr;
  ~ThreadHolder() {
    if (held != nullptr) refuse_then_free(held);
  }
};
thread_local ThreadHolder t_holder;

struct ExitHolder {
  std::vector<void*>* held = nullptr;
  ~ExitHolder() {
    if (held != nullptr) refuse_then_free(held);
    std::fflush(stdout);
  }
};
ExitHolder g_exit_holder;

int run_case(const std::string& name) {
  CHECK_CUDA(cudaFree(nullptr));
  if (name == "key") {
    CHECK(pthread_key_create(&g_key, [](void* held) {
            refuse_then_free(static_cast<std::vector<void*>*>(held));
          }) == 0);
    for (int i = 0; i < 3; ++i)
      std::thread([] { pthread_setspecific(g_key, fill_device()); }).join();
  } else if (name == "thread-local") {
    for (int i = 0; i < 3; ++i)
      std::thread([] {
        t_holder.held = nullptr;  // registers its destructor before the first refusal
        t_holder.held = fill_device();
      }).join();
  } else if (name == "exit") {
    g_exit_holder.held = fill_device();
  }
  std::printf("case done\n");
  return 0;
}

// Every "out of device memory" line of the child's output is whole: it names the request.
void check_lines(const std::string& name, const std::string& output) {
  std::size_t lines = 0;
  for (std::size_t at = output.find("out of device memory"); at != std::string::npos;
       at = output.find("out of device memory", at + 1)) {
    ++lines;
    const std::size_t end = output.find('\n', at);
    const std::string whole = "out of device memory: requested 1048576 B";
    CHECK_MSG(output.compare(at, whole.size(), whole) == 0,
              name + ": a garbled line: " + output.substr(at, end - at));
  }
  CHECK_MSG(lines > 0, name + ": no refusal was said:\n" + output);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return run_case(argv[1]);
  preload_test::require_preloaded();
  for (const char* name : {"key", "thread-local", "exit"}) {
    const preload_test::ChildResult child = preload_test::run_self(name, {}, 60);
    CHECK_MSG(child.status == 0 && child.output.find("case done") != std::string::npos,
              std::string(name) + ": exit " + std::to_string(child.status) + "\n" +
                  child.output);
    check_lines(name, child.output);
    std::printf("%s: ok\n", name);
  }
  std::printf("ok\n");
  return 0;
}
