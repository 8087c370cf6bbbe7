// Preload test: processes that never make a CUDA call through the library hear nothing from it,
// and one that loaded CUDA but whose calls never arrived is told why, once, at exit.
//   quiet:     no CUDA at all, report_at_exit:1, SIGUSR1 ignored at load (a note the library
//              would otherwise print): no output whatsoever.
//   versioned: loads the runtime and allocates through dlvsym(handle, "cudaMalloc", version),
//              the runtime's own function. The real runtime reaches the driver through the
//              hooked cuGetProcAddress, so the pools serve the allocation all the same: one exit
//              report, no warning. The stand-in's runtime does not go through the driver
//              (docs/stand-in.md): there the library sees nothing, says so once at exit, and
//              writes no exit report.
//   handle:    the same through dlsym(handle, "cudaMalloc"), as ctypes does. When that lookup
//              yields the library's hook, the pools serve it and no warning appears; when it
//              yields the runtime's own function, as for versioned.
//   direct:    the same through the global lookup: pooled, no warning, one exit report.
//
// Not linked with the runtime (it dlopens it, like an interpreter); runs itself as children.
#include <dlfcn.h>
#include <signal.h>

#include <string>

#include "check.h"

namespace {

using MallocFn = cudaError_t (*)(void**, std::size_t);
using FreeFn = cudaError_t (*)(void*);

enum class Lookup { handle, versioned, global };

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t count = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

constexpr const char* kWarning = "none of its CUDA calls reached the library";

// Allocates and frees once through the runtime's functions as `lookup` finds them; says whether
// the cudaMalloc it found is the library's.
int allocate_through(Lookup lookup) {
  void* runtime = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  CHECK(runtime != nullptr);
  auto find = [&](const char* name) {
    switch (lookup) {
      case Lookup::handle: return ::dlsym(runtime, name);
      case Lookup::versioned: return ::dlvsym(runtime, name, "libcudart.so.13");
      case Lookup::global: return ::dlsym(RTLD_DEFAULT, name);
    }
    return static_cast<void*>(nullptr);
  };
  const auto malloc_fn = reinterpret_cast<MallocFn>(find("cudaMalloc"));
  const auto free_fn = reinterpret_cast<FreeFn>(find("cudaFree"));
  CHECK(malloc_fn != nullptr && free_fn != nullptr);
  void* ptr = nullptr;
  CHECK(malloc_fn(&ptr, 1 << 20) == cudaSuccess);
  CHECK(free_fn(ptr) == cudaSuccess);
  Dl_info info{};
  const bool hooked = ::dladdr(reinterpret_cast<void*>(malloc_fn), &info) != 0 &&
                      std::string(info.dli_fname).find("poolcuda") != std::string::npos;
  std::printf("lookup gave %s\n", hooked ? "the hook" : "the runtime");
  // Through the handle: the runtime is loaded RTLD_LOCAL, out of the global scope.
  if (::dlsym(runtime, "simcuda_counter") != nullptr) std::printf("runtime: the stand-in\n");
  return 0;
}

// Either the exit warning, exactly once, and no exit report; or one exit report and no warning.
void check_warning(const preload_test::ChildResult& child, bool expected) {
  std::printf("%s", child.output.c_str());
  CHECK(child.status == 0);
  if (expected) {
    CHECK_MSG(occurrences(child.output, kWarning) == 1, "no single warning at exit");
    CHECK(child.output.find("dlvsym") != std::string::npos);
    CHECK(child.output.find("docs/reports.md") != std::string::npos);
    CHECK(child.output.find("poolcuda report #") == std::string::npos);
  } else {
    CHECK(occurrences(child.output, kWarning) == 0);
    CHECK(occurrences(child.output, "poolcuda report #1 (pid") == 1);
  }
}

// Whether a call of the runtime's own cudaMalloc stays unseen: on the stand-in it does; the real
// runtime's allocation reaches the library through the driver hooks, and then the exit report
// shows it. Anything between those (a report and the warning, or neither) fails check_warning.
bool unseen_runtime_call(const preload_test::ChildResult& child) {
  const bool stand_in = child.output.find("runtime: the stand-in") != std::string::npos;
  const bool reported = child.output.find("poolcuda report #") != std::string::npos;
  CHECK_MSG(!(stand_in && reported), "the stand-in's runtime reached the library:\n" + child.output);
  return !reported;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "quiet") return 0;
  if (role == "versioned") return allocate_through(Lookup::versioned);
  if (role == "handle") return allocate_through(Lookup::handle);
  if (role == "direct") return allocate_through(Lookup::global);

  const std::string conf = "POOLCUDA_CONF=report_at_exit:1,log:basic";
  struct sigaction ignore {};
  struct sigaction saved {};
  ignore.sa_handler = SIG_IGN;
  CHECK(::sigaction(SIGUSR1, &ignore, &saved) == 0);
  preload_test::ChildResult quiet = preload_test::run_self("quiet", {conf});
  CHECK(::sigaction(SIGUSR1, &saved, nullptr) == 0);
  CHECK_MSG(quiet.status == 0 && quiet.output.empty(),
            "a process without CUDA said: " + quiet.output);

  preload_test::ChildResult versioned = preload_test::run_self("versioned", {conf});
  CHECK(versioned.output.find("lookup gave the runtime") != std::string::npos);
  check_warning(versioned, unseen_runtime_call(versioned));

  preload_test::ChildResult handle = preload_test::run_self("handle", {conf});
  check_warning(handle, handle.output.find("lookup gave the runtime") != std::string::npos &&
                            unseen_runtime_call(handle));

  preload_test::ChildResult direct = preload_test::run_self("direct", {conf});
  CHECK(direct.output.find("lookup gave the hook") != std::string::npos);
  check_warning(direct, false);
  std::printf("ok\n");
  return 0;
}
