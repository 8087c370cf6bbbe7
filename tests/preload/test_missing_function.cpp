// Preload test: a runtime function the library needs is missing (an older runtime than the
// headers). The stand-in's libcudart.so.13 without cudaMemGetInfo (its folder is the argument)
// comes first in the library path of the child that runs the checks. The miss must be
// remembered, logged once, and answered with a CUDA error; allocations still work (the device,
// whose size cannot be read, is passed through).
// "Remembered" is counted with the dynamic linker's own trace (LD_DEBUG=symbols): no lookup of
// cudaMemGetInfo may happen after the first call. Stand-in only (suite standin): a real
// runtime has the function.
#include <string>

#include "check.h"

namespace {

constexpr const char* kFirstDone = "[first call done]";
constexpr const char* kAllDone = "[all calls done]";

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// stderr is unbuffered, like the dynamic linker's trace on the same descriptor: the markers
// land in order with it.
void mark(const char* what) { std::fprintf(stderr, "%s\n", what); }

int child() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaErrorSharedObjectSymbolNotFound);
  mark(kFirstDone);
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaErrorSharedObjectSymbolNotFound);
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));
    CHECK_CUDA(cudaMemset(ptr, 0x5a, 4096));
    CHECK(preload_test::device_bytes_equal(ptr, 4096, 0x5a));
    CHECK_CUDA(cudaFree(ptr));
  }
  mark(kAllDone);
  (void)cudaGetLastError();
  std::printf("child ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK(argc > 1);
  if (std::string(argv[1]) == "child") return child();

  const char* path = std::getenv("LD_LIBRARY_PATH");
  const std::string old_first =
      std::string(argv[1]) + (path != nullptr ? std::string(":") + path : "");
  preload_test::ChildResult result = preload_test::run_self(
      "child", {"POOLCUDA_CONF", "LD_DEBUG=symbols", "LD_LIBRARY_PATH=" + old_first});
  CHECK_MSG(result.status == 0, "child exited with " + std::to_string(result.status) + ":\n" +
                                    result.output.substr(result.output.rfind(kFirstDone) ==
                                                                 std::string::npos
                                                             ? 0
                                                             : result.output.rfind(kFirstDone)));
  const std::string lookup = "symbol=cudaMemGetInfo;";
  const std::size_t first = result.output.find(kFirstDone);
  const std::size_t all = result.output.find(kAllDone);
  CHECK(first != std::string::npos && all != std::string::npos && first < all);
  const std::size_t before = count(result.output.substr(0, first), lookup);
  const std::size_t after = count(result.output.substr(first, all - first), lookup);
  std::printf("dynamic-linker lookups of cudaMemGetInfo: %zu during the first call, %zu during "
              "the next 20\n",
              before, after);
  CHECK_MSG(before >= 1, "the first call never looked the function up");
  CHECK_MSG(after == 0, "the miss was not remembered");
  const std::size_t logged = count(result.output, "cudaMemGetInfo is not in the CUDA runtime");
  CHECK_MSG(logged == 1, "logged " + std::to_string(logged) + " times");
  std::printf("ok\n");
  return 0;
}
