// Preload test 11: POOLCUDA_CONF is read when the library loads. A malformed value stops the
// program with status 2 before main, with one message naming the key, quoting the text and
// saying what was expected; confirm:1 prints the effective configuration and the program runs;
// the log level is honoured.
#include <string>

#include "check.h"

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "double-free") {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 4096));
    CHECK_CUDA(cudaFree(ptr));
    CHECK_RESULT(cudaFree(ptr), cudaErrorInvalidValue);
    return 0;
  }
  if (!role.empty()) {
    std::printf("main reached\n");
    std::fflush(stdout);
    return 0;
  }
  preload_test::require_preloaded();

  struct Case {
    const char* conf;
    const char* key;
    const char* text;
  };
  const Case cases[] = {
      {"free_fence:fast", "free_fence", "fast"},
      {"log:basic,report_format:xml", "report_format", "xml"},
      {"managed_slab:lots", "managed_slab", "lots"},
      {"managed_slab:100", "managed_slab", "100"},
  };
  for (const Case& c : cases) {
    preload_test::ChildResult child =
        preload_test::run_self("child", {std::string("POOLCUDA_CONF=") + c.conf});
    std::printf("POOLCUDA_CONF=%s -> status %d: %s", c.conf, child.status, child.output.c_str());
    CHECK(child.status == 2);
    CHECK_MSG(child.output.find("main reached") == std::string::npos, "main ran");
    CHECK(child.output.find(std::string("'") + c.key + "'") != std::string::npos);
    CHECK(child.output.find(std::string("'") + c.text + "'") != std::string::npos);
    CHECK(child.output.find("expected") != std::string::npos);
  }

  preload_test::ChildResult confirmed =
      preload_test::run_self("child", {"POOLCUDA_CONF=confirm:1,free_fence:sync"});
  std::printf("confirm:1 -> status %d: %s", confirmed.status, confirmed.output.c_str());
  CHECK(confirmed.status == 0);
  CHECK(confirmed.output.find("main reached") != std::string::npos);
  CHECK(confirmed.output.find("free_fence:sync") != std::string::npos);
  CHECK(confirmed.output.find("report_signal:") != std::string::npos);  // every key spelled out

  // The log level is honoured: a double free is logged under log:basic (the default) and not
  // under log:off.
  preload_test::ChildResult logged = preload_test::run_self("double-free", {"POOLCUDA_CONF"});
  CHECK(logged.status == 0);
  CHECK_MSG(logged.output.find("poolcuda: ") != std::string::npos &&
                logged.output.find("double free") != std::string::npos,
            "no log line: " + logged.output);
  preload_test::ChildResult quiet =
      preload_test::run_self("double-free", {"POOLCUDA_CONF=log:off"});
  CHECK(quiet.status == 0);
  CHECK_MSG(quiet.output.find("poolcuda") == std::string::npos,
            "logged under log:off: " + quiet.output);
  std::printf("ok\n");
  return 0;
}
