// The report a child writes at exit, read back by the test that ran it: this same program runs
// again with report_at_exit:1 and a JSON report to a temporary file, and the test reads the
// totals that prove where allocations went.
#pragma once

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "json_check.h"

namespace preload_test {

struct ExitReport {
  ChildResult child;
  std::string json;
  // Over every device and pool.
  std::uint64_t reservations = 0;      // allocations the pools served
  std::uint64_t device_allocs = 0;     // real allocations the pools made for their pages
  std::uint64_t forwarded_mallocs = 0;  // allocations passed through (passed_through.cuda_malloc)
};

// Sum of every number that follows "key": in `json`.
inline std::uint64_t sum_of(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  std::uint64_t sum = 0;
  for (std::size_t at = json.find(needle); at != std::string::npos;
       at = json.find(needle, at + 1)) {
    sum += std::stoull(json.substr(at + needle.size()));
  }
  return sum;
}

// Runs this program with `argument` (and `env`), its exit report going to a temporary file.
// The child's output and the report's totals are printed; a child that failed fails the test.
inline ExitReport run_with_exit_report(const char* argument, std::vector<std::string> env = {}) {
  char path[] = "/tmp/poolcuda-exit-report-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) fail(__FILE__, __LINE__, "mkstemp");
  ::close(fd);
  env.push_back(std::string("POOLCUDA_CONF=report_at_exit:1,report_format:json,report_path:") +
                path);
  ExitReport report;
  report.child = run_self(argument, env);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  report.json = text.str();
  if (!valid_json(report.json)) {
    fail(__FILE__, __LINE__, "no valid exit report:\n" + report.json + "\n" + report.child.output);
  }
  report.reservations = sum_of(report.json, "reservations");
  report.device_allocs = sum_of(report.json, "device_allocs");
  report.forwarded_mallocs = sum_of(report.json, "cuda_malloc");
  std::printf("%s", report.child.output.c_str());
  if (report.child.status != 0) {
    fail(__FILE__, __LINE__, "the child exited with " + std::to_string(report.child.status));
  }
  std::printf("exit report: %llu pooled reservations, %llu page allocations, %llu passed through\n",
              static_cast<unsigned long long>(report.reservations),
              static_cast<unsigned long long>(report.device_allocs),
              static_cast<unsigned long long>(report.forwarded_mallocs));
  return report;
}

}  // namespace preload_test
