// Helpers of the capture tests. What graphs hold, read from the library's own report (its
// per-device "capture" section): the program runs itself as a child (run_capture_child) with
// reports in JSON into a folder of its own, and the child raises the report signal whenever it
// wants the numbers (held_by_graphs). And two threads capturing beside one that churns
// (capture_on_two_threads). Plain C++: no CUDA call, so runtime and driver programs share it.
#pragma once

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "signal_report.h"

namespace preload_test {

// The library's capture numbers (the first device's section).
struct Held {
  std::uint64_t open_captures = 0;
  std::uint64_t graphs = 0;
  std::uint64_t pinned_bytes = 0;
  std::uint64_t captures = 0;  // ended with a graph
  std::uint64_t failed_captures = 0;
  std::uint64_t window_allocations = 0;  // allocations served inside capture windows
  std::uint64_t from_driver = 0;         // of which grew a pool (reached the driver)
};

inline std::uint64_t json_number(const std::string& text, std::size_t from,
                                 const std::string& key) {
  const std::size_t at = text.find("\"" + key + "\":", from);
  if (at == std::string::npos) return 0;
  return std::strtoull(text.c_str() + at + key.size() + 3, nullptr, 10);
}

// Asks the library for a report (SIGUSR1) and reads its capture section.
inline Held held_by_graphs() {
  const std::string text = signal_report("CAPTURE_REPORT_DIR");
  const std::size_t capture = text.find("\"capture\":{");
  if (capture == std::string::npos) return {};
  return Held{json_number(text, capture, "open_captures"), json_number(text, capture, "graphs"),
              json_number(text, capture, "pinned_bytes"), json_number(text, capture, "captures"),
              json_number(text, capture, "failed_captures"),
              json_number(text, capture, "window_allocations"),
              json_number(text, capture, "from_driver")};
}

// Waits (a second at most) until no graph holds memory: their destructors run on CUDA's thread.
inline bool graphs_released() {
  for (int i = 0; i < 100; ++i) {
    if (held_by_graphs().graphs == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Runs this program again with "child:<which>", its reports going as JSON to a fresh folder
// (POOLCUDA_CONF from the environment is kept, after the report settings); `env` as run_self's.
// Prints the child's output and returns its exit status.
inline int run_capture_child(const std::string& which, std::vector<std::string> env = {}) {
  char dir[] = "/tmp/poolcuda-capture-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  std::string conf = "report_format:json,report_path:" + std::string(dir) + "/r-%n.json";
  if (const char* extra = std::getenv("POOLCUDA_CONF"); extra != nullptr && *extra != '\0') {
    conf += ',';
    conf += extra;
  }
  env.push_back("POOLCUDA_CONF=" + conf);
  env.push_back("CAPTURE_REPORT_DIR=" + std::string(dir));
  const ChildResult child = run_self(("child:" + which).c_str(), env);
  std::printf("%s", child.output.c_str());
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
  return child.status;
}

// Runs `capture(value)` on two threads at once (values 0x21 and 0x42) while a third repeats
// `churn()` until both are done.
template <typename Churn, typename Capture>
void capture_on_two_threads(Churn churn, Capture capture) {
  std::atomic<bool> stop{false};
  std::thread churner([&] {
    while (!stop.load()) {
      churn();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  std::thread first(capture, 0x21);
  std::thread second(capture, 0x42);
  first.join();
  second.join();
  stop.store(true);
  churner.join();
}

}  // namespace preload_test
