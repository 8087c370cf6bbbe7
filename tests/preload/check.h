// Shared helpers of the preload suite: fatal checks with file:line, access to the CUDA
// stand-in's counters when the program runs on it (skipped on a real GPU), the real runtime's
// own functions (to compare with what the program sees through libpoolcuda.so), a check that
// the library really is preloaded, and running this same program again as a child with a
// different environment.
//
// Plain C++ against the CUDA runtime header: every program of the suite also runs on a GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <thread>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace preload_test {

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// meson's "skipped" exit status.
[[noreturn]] inline void skip(const char* why) {
  std::printf("skipped: %s\n", why);
  std::fflush(stdout);
  std::_Exit(77);
}

inline std::string error_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + " (" + std::to_string(static_cast<int>(error)) +
         ")";
}

#define CHECK(cond)                                                 \
  do {                                                              \
    if (!(cond)) ::preload_test::fail(__FILE__, __LINE__, #cond);   \
  } while (0)

#define CHECK_MSG(cond, message)                                                       \
  do {                                                                                 \
    if (!(cond)) ::preload_test::fail(__FILE__, __LINE__, std::string(#cond) + ": " + \
                                                              (message));              \
  } while (0)

// Expects `expr` to return `expected` (a cudaError_t).
#define CHECK_RESULT(expr, expected)                                                       \
  do {                                                                                     \
    cudaError_t check_result_ = (expr);                                                    \
    if (check_result_ != (expected))                                                       \
      ::preload_test::fail(__FILE__, __LINE__,                                             \
                           std::string(#expr) + " returned " +                            \
                               ::preload_test::error_text(check_result_) + ", expected " + \
                               ::preload_test::error_text(expected));                     \
  } while (0)

#define CHECK_CUDA(expr) CHECK_RESULT(expr, cudaSuccess)

// ---- The CUDA stand-in ------------------------------------------------------------------------

using CounterFn = std::uint64_t (*)(const char*);

inline CounterFn counter_function() {
  return reinterpret_cast<CounterFn>(::dlsym(RTLD_DEFAULT, "simcuda_counter"));
}

// True when the program runs on the CUDA stand-in (its counters are available).
inline bool on_stand_in() { return counter_function() != nullptr; }

// A stand-in counter ("cudaMalloc", "cudaFree", "races", "live_allocations", "live_bytes").
inline std::uint64_t counter(const char* name) {
  CounterFn fn = counter_function();
  if (fn == nullptr) fail(__FILE__, __LINE__, std::string("no stand-in counter ") + name);
  return fn(name);
}

// The stand-in's simcuda_launch_access (tests/simcuda/simcuda.h): enqueues on a stream an
// operation that declares it reads or writes a device range, like a kernel, and runs fn while it
// executes. nullptr on a real GPU.
using LaunchAccessFn = int (*)(void* stream, const void* ptr, std::size_t bytes, int is_write,
                               void (*fn)(void*), void* user_data);

inline LaunchAccessFn launch_access_function() {
  return reinterpret_cast<LaunchAccessFn>(::dlsym(RTLD_DEFAULT, "simcuda_launch_access"));
}

// ---- The library and the real runtime ---------------------------------------------------------

// Fails unless cudaMalloc resolves into libpoolcuda.so: a test that silently ran without the
// library would prove nothing.
inline void require_preloaded() {
  void* address = ::dlsym(RTLD_DEFAULT, "cudaMalloc");
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr ||
      std::strstr(info.dli_fname, "poolcuda") == nullptr) {
    fail(__FILE__, __LINE__,
         std::string("cudaMalloc does not come from libpoolcuda.so (from ") +
             (info.dli_fname != nullptr ? info.dli_fname : "nowhere") + "); set LD_PRELOAD");
  }
}

// The runtime's own definition of `name`, bypassing libpoolcuda.so: the library's dlsym would
// hand out its hook, so this asks dlvsym for the runtime's symbol version (named after its
// soname), which the library leaves alone. Only the function itself bypasses the library: the
// real runtime reaches the driver through the hooked cuGetProcAddress, so what it asks the
// driver goes through the library's driver hooks (the stand-in's runtime does not: see
// docs/stand-in.md). For the driver's own figures, see real_driver.
inline void* real_symbol(const char* name) {
  static constexpr const char* kSonames[] = {"libcudart.so.13", "libcudart.so.12"};
  for (const char* soname : kSonames) {
    if (void* handle = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) {
      if (void* address = ::dlvsym(handle, name, soname)) return address;
    }
  }
  fail(__FILE__, __LINE__, std::string("no real ") + name);
}

template <typename Fn>
Fn real(const char* name) {
  return reinterpret_cast<Fn>(real_symbol(name));
}

// The C library's own dlsym: the library's exported dlsym answers a handle lookup of a hooked
// name with the hook.
using DlsymFn = void* (*)(void*, const char*);
inline DlsymFn libc_dlsym() {
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) fail(__FILE__, __LINE__, "no libc.so.6");
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
    if (void* found = ::dlvsym(libc, "dlsym", version)) return reinterpret_cast<DlsymFn>(found);
  }
  fail(__FILE__, __LINE__, "no dlsym in the C library");
}

// The driver's own exported `name` (libcuda.so.1's, the exact variant named: "cuMemGetInfo_v2"),
// which no hook of the library wraps: what the driver itself answers.
template <typename Fn>
Fn real_driver(const char* name) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW);
  if (driver == nullptr) fail(__FILE__, __LINE__, "cannot open libcuda.so.1");
  void* address = libc_dlsym()(driver, name);
  if (address == nullptr) fail(__FILE__, __LINE__, std::string("no real ") + name);
  return reinterpret_cast<Fn>(address);
}

// A driver entry point as the runtime resolves it (the library's hook where it has one).
template <typename Fn>
Fn driver_entry(const char* name, unsigned int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &status));
  CHECK_MSG(status == cudaDriverEntryPointSuccess && fn != nullptr,
            std::string("no driver entry point ") + name);
  return reinterpret_cast<Fn>(fn);
}

// What the real runtime's refused cudaMalloc leaves in a pointer that held `before` (the stand-in
// sets it to NULL): a refusal of the library's must leave the same.
inline void* pointer_after_refusal(void* before) {
  using Malloc = cudaError_t (*)(void**, std::size_t);
  const auto real_malloc = reinterpret_cast<Malloc>(real_symbol("cudaMalloc"));
  void* ptr = before;
  if (real_malloc(&ptr, std::size_t{1} << 52) == cudaSuccess) fail(__FILE__, __LINE__, "2^52 B?");
  (void)cudaGetLastError();
  return ptr;
}

// ---- Children ---------------------------------------------------------------------------------

struct ChildResult {
  int status = -1;  // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
  bool timed_out = false;  // killed after the time limit
};

// LD_PRELOAD without libpoolcuda.so (a sanitizer runtime stays): the plain run of a program.
inline std::string preload_without_library() {
  const char* value = std::getenv("LD_PRELOAD");
  const std::string preload = value != nullptr ? value : "";
  std::string kept;
  for (std::size_t at = 0; at <= preload.size();) {
    std::size_t end = preload.find_first_of(": ", at);
    if (end == std::string::npos) end = preload.size();
    const std::string entry = preload.substr(at, end - at);
    if (!entry.empty() && entry.find("poolcuda") == std::string::npos) {
      kept += (kept.empty() ? "" : ":") + entry;
    }
    at = end + 1;
  }
  return kept;
}

// Runs this program again with `argument` as argv[1] and the environment changed by `env`
// ("NAME=value" sets, "NAME" alone unsets), capturing its output. With a time limit (seconds,
// 0 for none) a child still running after it is killed (SIGKILL) and marked timed_out.
inline ChildResult run_self(const char* argument, const std::vector<std::string>& env,
                            int time_limit = 0) {
  // Everything the child needs is made before the fork: a thread of this process (a sanitizer's,
  // the library's) may hold the heap's lock at the fork, and the child would wait for it forever.
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) fail(__FILE__, __LINE__, "readlink /proc/self/exe");
  self[length] = '\0';
  std::vector<std::string> entries;
  for (char** at = environ; *at != nullptr; ++at) entries.emplace_back(*at);
  for (const std::string& change : env) {
    const std::string name = change.substr(0, change.find('='));
    std::erase_if(entries, [&](const std::string& entry) {
      return entry.compare(0, name.size() + 1, name + "=") == 0;
    });
    if (change.find('=') != std::string::npos) entries.push_back(change);
  }
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  char* argv[] = {self, const_cast<char*>(argument), nullptr};
  int fds[2];
  if (::pipe(fds) != 0) fail(__FILE__, __LINE__, "pipe");
  // Room for a burst (the dynamic linker's trace of LD_DEBUG): the library drops a log line
  // rather than wait when its standard error is full, and on a loaded machine this process may
  // not read for a while.
  (void)::fcntl(fds[0], F_SETPIPE_SZ, 1 << 20);
  pid_t pid = ::fork();
  if (pid < 0) fail(__FILE__, __LINE__, "fork");
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execve(self, argv, envp.data());
    ::_exit(126);
  }
  ::close(fds[1]);
  ChildResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(time_limit);
  char buffer[4096];
  for (;;) {
    if (time_limit > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd readable{fds[0], POLLIN, 0};
      if (left.count() <= 0 || ::poll(&readable, 1, static_cast<int>(left.count())) == 0) {
        ::kill(pid, SIGKILL);  // the descendants it started share the pipe: read on to EOF
        result.timed_out = true;
        time_limit = 0;
        continue;
      }
    }
    ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// ---- Device data ------------------------------------------------------------------------------

// True when every one of the `size` bytes at device address `ptr` reads as `byte`.
inline bool device_bytes_equal(const void* ptr, std::size_t size, unsigned char byte) {
  std::vector<unsigned char> host(size);
  if (cudaMemcpy(host.data(), ptr, size, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  if (size == 0) return true;
  // Every byte equals the first when the buffer equals itself shifted by one. One memcmp: a
  // loop over the bytes costs a minute per test under ThreadSanitizer, which checks each read.
  return host[0] == byte && std::memcmp(host.data(), host.data() + 1, size - 1) == 0;
}

// Instantiates a captured graph, runs it once on `stream`, waits for it and destroys both.
inline void launch_once(cudaGraph_t graph, cudaStream_t stream) {
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
}

// Parks a stream (cudaLaunchHostFunc(stream, wait_at_gate, &gate)) until the test opens the
// gate: the stream's later work is then "in use" for as long as the test wants. At most
// `limit_seconds` (ten by default), so that a mistake cannot hang a real GPU forever.
struct Gate {
  std::atomic<bool> entered{false};  // the blocked stream reached the gate
  std::atomic<bool> open{false};
  int limit_seconds = 10;
};

inline void CUDART_CB wait_at_gate(void* data) {
  auto* gate = static_cast<Gate*>(data);
  gate->entered.store(true);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(gate->limit_seconds);
  while (!gate->open.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Skips the test (meson's "skipped") on a machine with fewer than `n` devices.
inline void require_devices(int n) {
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  if (count < n) skip(n == 2 ? "needs two devices" : "needs more devices");
}

// On the current device: keeps a 64 MiB buffer (*keep) and leaves an idle 256 MiB page in the
// pools (under free_fence:none it is idle at once). A growth of 320 MiB after it goes past the
// held bound (1.5 times the most in use), so the pools give that page back to the driver.
inline void hold_an_idle_page(void** keep) {
  constexpr std::size_t mib = std::size_t{1} << 20;
  void* idle = nullptr;
  CHECK_CUDA(cudaMalloc(keep, 64 * mib));
  CHECK_CUDA(cudaMalloc(&idle, 256 * mib));
  CHECK_CUDA(cudaFree(idle));
}

// Parks `stream` at `gate` and returns once the stream has reached it.
inline void park(cudaStream_t stream, Gate& gate) {
  CHECK_CUDA(cudaLaunchHostFunc(stream, &wait_at_gate, &gate));
  while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Runs each case of this program (`name` as argv[1]) in a child of its own, where it is the
// process's first use of what it tests; each must exit 0 having printed "case done".
inline void run_cases_in_children(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const ChildResult child = run_self(name, {}, 60);
    if (child.status != 0 || child.output.find("case done") == std::string::npos)
      fail(__FILE__, __LINE__, std::string(name) + ": " + child.output);
    std::printf("%s: ok\n", name);
  }
}

}  // namespace preload_test
