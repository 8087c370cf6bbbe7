// Preload test: two copies of the library at different paths in one process do not stack their
// pools. The copy first in LD_PRELOAD serves the program; the second passes every call straight
// to the runtime (on the stand-in, each call it gets is one real call) and says so in exactly
// one log line naming both copies.
//
// The program runs itself as a child with a copy of libpoolcuda.so appended to LD_PRELOAD.
#include <dlfcn.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "check.h"

namespace {

std::string library_path() {
  Dl_info info{};
  CHECK(::dladdr(::dlsym(RTLD_DEFAULT, "cudaMalloc"), &info) != 0);
  return info.dli_fname;
}

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t count = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

int child(const std::string& copy) {
  using MallocFn = cudaError_t (*)(void**, std::size_t);
  using FreeFn = cudaError_t (*)(void*);
  void* second = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_NOLOAD);
  CHECK_MSG(second != nullptr, "the copy is not loaded");
  const preload_test::DlsymFn lookup = preload_test::libc_dlsym();
  const auto second_malloc = reinterpret_cast<MallocFn>(lookup(second, "cudaMalloc"));
  const auto second_free = reinterpret_cast<FreeFn>(lookup(second, "cudaFree"));
  CHECK(second_malloc != nullptr && second_free != nullptr);
  CHECK(reinterpret_cast<void*>(second_malloc) != ::dlsym(RTLD_DEFAULT, "cudaMalloc"));

  // The program's calls: pooled by the first copy (one page for both).
  const bool counted = preload_test::on_stand_in();
  std::uint64_t before = counted ? preload_test::counter("cudaMalloc") : 0;
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 4096));
  CHECK_CUDA(cudaMalloc(&b, 4096));
  if (counted) CHECK(preload_test::counter("cudaMalloc") - before <= 1);

  // Calls that reach the second copy (as the first copy's real calls do): passed through.
  before = counted ? preload_test::counter("cudaMalloc") : 0;
  const std::uint64_t frees = counted ? preload_test::counter("cudaFree") : 0;
  void* c = nullptr;
  void* d = nullptr;
  CHECK_CUDA(second_malloc(&c, 4096));
  CHECK_CUDA(second_malloc(&d, 4096));
  CHECK_CUDA(second_free(c));
  CHECK_CUDA(second_free(d));
  if (counted) {
    CHECK_MSG(preload_test::counter("cudaMalloc") - before == 2, "the second copy pooled");
    CHECK(preload_test::counter("cudaFree") - frees == 2);
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  std::printf("child done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const char* copy_env = std::getenv("SECOND_COPY");
  if (argc > 1 && std::string(argv[1]) == "child" && copy_env != nullptr) return child(copy_env);

  const std::string original = library_path();
  char dir_template[] = "/tmp/poolcuda-two-copies-XXXXXX";
  CHECK(::mkdtemp(dir_template) != nullptr);
  const std::string copy = std::string(dir_template) + "/libpoolcuda.so";
  {
    std::ifstream in(original, std::ios::binary);
    std::ofstream out(copy, std::ios::binary);
    out << in.rdbuf();
  }
  preload_test::ChildResult result = preload_test::run_self(
      "child", {"LD_PRELOAD=" + std::string(std::getenv("LD_PRELOAD")) + ":" + copy,
                "SECOND_COPY=" + copy, "POOLCUDA_CONF=log:basic"});
  ::unlink(copy.c_str());
  ::rmdir(dir_template);
  std::printf("%s", result.output.c_str());
  CHECK_MSG(result.status == 0, "the child exited with " + std::to_string(result.status));
  CHECK_MSG(occurrences(result.output, "is loaded before this copy") == 1,
            "not exactly one line from the second copy");
  CHECK(result.output.find(original + " is loaded before this copy (" + copy +
                           "): this copy passes every call through") != std::string::npos);
  std::printf("ok\n");
  return 0;
}
