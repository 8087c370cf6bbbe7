// The library's own report, asked for by the test program itself: it raises the report signal
// and reads the JSON report the library writes into a folder the test chose (report_path with
// %n, so each report gets a file of its own). Shared by the tests that read the library's
// numbers (capture, stream order).
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "check.h"

namespace preload_test {

// Raises SIGUSR1 and returns the report written as $<dir_variable>/r-<n>.json (n counts from 1
// in this process), waiting up to about five seconds for it.
inline std::string signal_report(const char* dir_variable) {
  static int reports = 0;
  const char* dir = std::getenv(dir_variable);
  CHECK(dir != nullptr);
  const std::string path = std::string(dir) + "/r-" + std::to_string(++reports) + ".json";
  CHECK(raise(SIGUSR1) == 0);
  std::string text;
  for (int i = 0; i < 5000 && text.empty(); ++i) {
    std::ifstream in(path);
    if (in) text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (text.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK_MSG(!text.empty(), "no report at " + path);
  return text;
}

}  // namespace preload_test
