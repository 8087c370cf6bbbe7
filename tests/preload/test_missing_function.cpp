// Preload test: a runtime function the library needs is missing (an older runtime than the
// headers). This program defines dlsym itself, so the library's lookups come here first, and
// hides cudaMemGetInfo: every lookup of it finds nothing. The miss must be remembered (the
// number of lookups does not grow with the number of calls), logged once, and answered with a
// CUDA error; allocations still work (the device, whose size cannot be read, is passed through).
// Not built with sanitizers (their runtimes resolve their own functions through dlsym).
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <string>

#include "check.h"

namespace {

constexpr const char* kHidden = "cudaMemGetInfo";
std::atomic<int> g_hidden_lookups{0};

using DlsymFn = void* (*)(void*, const char*);

DlsymFn real_dlsym() {
  static const DlsymFn fn = [] {
    auto found = reinterpret_cast<DlsymFn>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (found == nullptr) {
      found = reinterpret_cast<DlsymFn>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    }
    return found;
  }();
  return fn;
}

std::size_t count_lines(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

int child() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaErrorSharedObjectSymbolNotFound);
  const int after_first = g_hidden_lookups.load();
  CHECK(after_first >= 1);
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaErrorSharedObjectSymbolNotFound);
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));
    CHECK_CUDA(cudaMemset(ptr, 0x5a, 4096));
    CHECK(preload_test::device_bytes_equal(ptr, 4096, 0x5a));
    CHECK_CUDA(cudaFree(ptr));
  }
  const int lookups = g_hidden_lookups.load();
  std::printf("%d lookups of %s after 21 calls (%d after the first)\n", lookups, kHidden,
              after_first);
  CHECK_MSG(lookups == after_first, "the miss was not remembered");
  (void)cudaGetLastError();
  std::printf("child ok\n");
  return 0;
}

}  // namespace

// Every dlsym of the process. A lookup relative to the caller (RTLD_NEXT) would be relative to
// this program here, so the library's lookups of runtime functions are sent to the runtime.
extern "C" void* dlsym(void* __restrict handle, const char* __restrict name) noexcept {
  if (std::strcmp(name, kHidden) == 0) {
    g_hidden_lookups.fetch_add(1);
    return nullptr;
  }
  if (handle == RTLD_NEXT && std::strncmp(name, "cuda", 4) == 0) {
    for (const char* soname : {"libcudart.so.13", "libcudart.so.12"}) {
      if (void* runtime = ::dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) {
        void* address = real_dlsym()(runtime, name);
        ::dlclose(runtime);
        return address;
      }
    }
    return nullptr;
  }
  return real_dlsym()(handle, name);
}

int main(int argc, char** argv) {
  CHECK(real_dlsym() != nullptr);
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "child") return child();

  preload_test::ChildResult result = preload_test::run_self("child", {"POOLCUDA_CONF"});
  std::printf("%s", result.output.c_str());
  CHECK_MSG(result.status == 0, "child exited with " + std::to_string(result.status));
  const std::size_t logged = count_lines(result.output, "cudaMemGetInfo is not in the CUDA runtime");
  CHECK_MSG(logged == 1, "logged " + std::to_string(logged) + " times");
  std::printf("ok\n");
  return 0;
}
