// Preload test 8: reports. A SIGUSR1 while four threads allocate produces a complete JSON report
// (written to report_path, %n numbering each); a burst of 1,000 signals neither deadlocks nor
// crashes, and the reporter still answers afterwards. When SIGUSR1 already has a disposition at
// load (here: ignored, inherited from the parent), the library leaves it alone, says so, and
// report_at_exit:1 still writes a report when the program ends. A program that closes every
// descriptor it did not open (as daemons and closefrom do) and reuses the numbers for a pipe of
// its own keeps its data whole: the signal's path uses no descriptor.
//
// The program runs itself as children with POOLCUDA_CONF set (the configuration is read when
// the library loads, before main).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "json_check.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_threads_allocating{0};  // threads past their first allocation

void allocate_until_stopped(int id) {
  std::vector<void*> live;
  unsigned step = 0;
  while (!g_stop.load()) {
    void* ptr = nullptr;
    CHECK_CUDA(cudaMalloc(&ptr, 256 + (step * 7919u + static_cast<unsigned>(id)) % 200000));
    if (step == 0) ++g_threads_allocating;
    live.push_back(ptr);
    if (live.size() > 16) {
      CHECK_CUDA(cudaFree(live.front()));
      live.erase(live.begin());
    }
    ++step;
  }
  for (void* ptr : live) CHECK_CUDA(cudaFree(ptr));
}

std::vector<std::string> report_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      std::string name = entry->d_name;
      if (name.rfind("report-", 0) == 0 && name.size() > 5 &&
          name.compare(name.size() - 5, 5, ".json") == 0) {
        out.push_back(dir + "/" + name);
      }
    }
    ::closedir(d);
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits up to ten seconds for at least `count` report files.
std::size_t wait_for_reports(const std::string& dir, std::size_t count) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (report_files(dir).size() < count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return report_files(dir).size();
}

void check_reports(const std::string& dir) {
  for (const std::string& path : report_files(dir)) {
    std::string text = read_file(path);
    CHECK_MSG(preload_test::valid_json(text), path + " is not one complete JSON value:\n" + text);
    CHECK_MSG(text.find("\"device\"") != std::string::npos, path + " names no device");
    CHECK_MSG(text.find("\"passed_through\":{\"cuda_malloc\"") != std::string::npos,
              path + ": no pass-through count");
  }
}

int signal_child() {
  const char* dir_env = std::getenv("REPORT_TEST_DIR");
  CHECK(dir_env != nullptr);
  const std::string dir = dir_env;
  CHECK_CUDA(cudaFree(nullptr));
  std::vector<std::thread> threads;
  for (int id = 0; id < 4; ++id) threads.emplace_back(allocate_until_stopped, id);
  // The device's pools are in the report from its first allocation on (cudaFree(NULL) only
  // prepares them): a fixed 50 ms was not always enough on a loaded machine.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g_threads_allocating.load() < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_MSG(g_threads_allocating.load() == 4, "the threads did not allocate within 10 s");

  CHECK(::kill(::getpid(), SIGUSR1) == 0);
  CHECK_MSG(wait_for_reports(dir, 1) >= 1, "no report after SIGUSR1");
  check_reports(dir);

  for (int i = 0; i < 1000; ++i) CHECK(::kill(::getpid(), SIGUSR1) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  g_stop.store(true);
  for (auto& thread : threads) thread.join();

  // The reporter survived the burst: one more signal, one more report.
  std::size_t before = wait_for_reports(dir, 2);
  CHECK(before >= 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  before = report_files(dir).size();
  CHECK(::kill(::getpid(), SIGUSR1) == 0);
  CHECK_MSG(wait_for_reports(dir, before + 1) >= before + 1, "the reporter stopped answering");
  check_reports(dir);
  std::printf("ok: %zu reports\n", report_files(dir).size());
  return 0;
}

int closefrom_child() {
  // Before anything else: every descriptor above the standard three goes, and the lowest
  // numbers are reused at once, for a pipe of the program's own.
  CHECK(::syscall(SYS_close_range, 3u, ~0u, 0u) == 0);
  int fds[2];
  CHECK(::pipe2(fds, O_NONBLOCK) == 0);
  const std::string data = "the program's own bytes";
  CHECK(::write(fds[1], data.data(), data.size()) == static_cast<ssize_t>(data.size()));

  const std::string dir = std::getenv("REPORT_TEST_DIR");
  CHECK_CUDA(cudaFree(nullptr));
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 1 << 20));
  for (std::size_t round = 1; round <= 3; ++round) {
    CHECK(::kill(::getpid(), SIGUSR1) == 0);
    CHECK_MSG(wait_for_reports(dir, round) >= round, "the reporter stopped answering");
  }
  check_reports(dir);
  char buffer[256];
  const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
  CHECK_MSG(n == static_cast<ssize_t>(data.size()) && std::string(buffer, n) == data,
            "the program's pipe holds " + std::to_string(n) + " bytes, not its own");
  CHECK_CUDA(cudaFree(ptr));
  std::printf("ok: pipe intact\n");
  return 0;
}

int ignored_child() {
  CHECK_CUDA(cudaFree(nullptr));
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 1 << 20));
  CHECK(::kill(::getpid(), SIGUSR1) == 0);  // ignored: the program's choice stands
  CHECK_CUDA(cudaFree(ptr));
  std::printf("child done\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "signal") return signal_child();
  if (role == "ignored") return ignored_child();
  if (role == "closefrom") return closefrom_child();

  char dir_template[] = "/tmp/poolcuda-report-test-XXXXXX";
  CHECK(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  preload_test::ChildResult child = preload_test::run_self(
      "signal", {"POOLCUDA_CONF=report_format:json,report_path:" + dir + "/report-%n.json",
                 "REPORT_TEST_DIR=" + dir});
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "signal child exited with " + std::to_string(child.status));
  for (const std::string& path : report_files(dir)) ::unlink(path.c_str());

  child = preload_test::run_self(
      "closefrom", {"POOLCUDA_CONF=report_format:json,report_path:" + dir + "/report-%n.json",
                    "REPORT_TEST_DIR=" + dir});
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "closefrom child exited with " + std::to_string(child.status));
  for (const std::string& path : report_files(dir)) ::unlink(path.c_str());
  ::rmdir(dir.c_str());

  // SIGUSR1 ignored at load: left alone, and the exit report comes instead.
  struct sigaction ignore = {};
  struct sigaction saved = {};
  ignore.sa_handler = SIG_IGN;
  CHECK(::sigaction(SIGUSR1, &ignore, &saved) == 0);
  child = preload_test::run_self("ignored", {"POOLCUDA_CONF=report_at_exit:1"});
  CHECK(::sigaction(SIGUSR1, &saved, nullptr) == 0);
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "ignored child exited with " + std::to_string(child.status));
  CHECK(child.output.find("SIGUSR1 is ignored; leaving it alone") != std::string::npos);
  CHECK(child.output.find("child done") != std::string::npos);
  // The exit report comes after the program's own last words.
  CHECK_MSG(child.output.find("device", child.output.find("child done")) != std::string::npos,
            "no exit report");
  std::printf("ok\n");
  return 0;
}
