// Preload test: custom pool layouts that do not cover every request.
// - "uncovered" (pools:[sliced(page=1M)]): sizes no pool accepts are not refused. They go to
//   the real cudaMalloc (so the memory works like any other), come back through the real
//   cudaFree, are counted as passed through in the report, and the log warns once per device.
// - "capped" (pools:[sliced(page=1M,slice=1M,cap=2M)]): a capped pool that is full with nothing
//   behind it is a budget: cudaErrorMemoryAllocation, also in cudaGetLastError, and the exit
//   report counts the refusal.
// - "over-budget" (the uncovered layout under limit:16M): such a request that the budget refuses
//   never reaches CUDA and is not counted as passed through.
#include <string>
#include <vector>

#include "check.h"

namespace {

std::size_t count_lines(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

int uncovered_child() {
  const bool counted = preload_test::on_stand_in();
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 4096));  // pooled; creates the device's pools
  const std::uint64_t mallocs = counted ? preload_test::counter("cudaMalloc") : 0;
  const std::uint64_t frees = counted ? preload_test::counter("cudaFree") : 0;
  const std::size_t sizes[] = {4 << 20, 8 << 20, (1 << 20) + 1};
  std::vector<void*> big;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, sizes[i]));
    CHECK(ptr != nullptr);
    CHECK_CUDA(cudaMemset(ptr, static_cast<int>(0x30 + i), sizes[i]));
    big.push_back(ptr);
  }
  for (std::size_t i = 0; i < big.size(); ++i) {
    CHECK(preload_test::device_bytes_equal(big[i], sizes[i], static_cast<unsigned char>(0x30 + i)));
  }
  if (counted) CHECK(preload_test::counter("cudaMalloc") - mallocs == std::size(sizes));
  for (void* ptr : big) CHECK_CUDA(cudaFree(ptr));
  if (counted) CHECK(preload_test::counter("cudaFree") - frees == std::size(sizes));
  CHECK_CUDA(cudaFree(small));
  CHECK_CUDA(cudaGetLastError());
  std::printf("child ok\n");
  return 0;
}

int capped_child() {
  std::vector<void*> taken;
  for (int i = 0; i < 2; ++i) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 1 << 20));
    taken.push_back(ptr);
  }
  void* ptr = nullptr;
  CHECK_RESULT(cudaMalloc(&ptr, 1 << 20), cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaErrorMemoryAllocation);
  for (void* p : taken) CHECK_CUDA(cudaFree(p));
  std::printf("child ok\n");
  return 0;
}

// Under a 16 MiB budget: a request no pool accepts that the budget refuses never reaches CUDA,
// and is not counted as passed through; one that fits is.
int over_budget_child() {
  void* small = nullptr;
  CHECK_CUDA(cudaMalloc(&small, 4096));
  void* big = nullptr;
  CHECK_RESULT(cudaMalloc(&big, 32 << 20), cudaErrorMemoryAllocation);
  CHECK_RESULT(cudaGetLastError(), cudaErrorMemoryAllocation);
  void* fits = nullptr;
  CHECK_CUDA(cudaMalloc(&fits, 4 << 20));
  CHECK_CUDA(cudaFree(fits));
  CHECK_CUDA(cudaFree(small));
  std::printf("child ok\n");
  return 0;
}

preload_test::ChildResult run(const char* mode, const std::string& conf) {
  preload_test::ChildResult child = preload_test::run_self(mode, {"POOLCUDA_CONF=" + conf});
  std::printf("--- %s (%s)\n%s", mode, conf.c_str(), child.output.c_str());
  CHECK_MSG(child.status == 0, std::string(mode) + ": child exited with " +
                                   std::to_string(child.status));
  return child;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "uncovered") return uncovered_child();
  if (argc > 1 && std::string(argv[1]) == "capped") return capped_child();
  if (argc > 1 && std::string(argv[1]) == "over-budget") return over_budget_child();

  preload_test::ChildResult uncovered =
      run("uncovered", "pools:[sliced(page=1M)],report_at_exit:1,free_fence:none");
  const std::size_t warned = count_lines(uncovered.output, "no pool accepts");
  CHECK_MSG(warned == 1, "warned " + std::to_string(warned) + " times");
  CHECK(uncovered.output.find("passed through to CUDA: cudaMalloc 3, cudaFree 3") != std::string::npos);

  preload_test::ChildResult over_budget =
      run("over-budget", "pools:[sliced(page=1M)],limit:16M,report_at_exit:1,free_fence:none");
  CHECK(over_budget.output.find("passed through to CUDA: cudaMalloc 1, cudaFree 1") !=
        std::string::npos);

  // log:off silences the warning.
  preload_test::ChildResult quiet = run("uncovered", "pools:[sliced(page=1M)],log:off");
  CHECK(count_lines(quiet.output, "no pool accepts") == 0);

  preload_test::ChildResult capped =
      run("capped", "pools:[sliced(page=1M,slice=1M,cap=2M)],report_at_exit:1");
  CHECK(capped.output.find("capacity") != std::string::npos);
  // The exit report counts the refusal, which never reached CUDA.
  CHECK(capped.output.find("failed 0, growths waited 0, refused at a cap 1") != std::string::npos);
  CHECK(capped.output.find("passed through to CUDA: cudaMalloc 0") != std::string::npos);
  std::printf("ok\n");
  return 0;
}
