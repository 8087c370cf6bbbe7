// Preload test: report files. A report name as long as a file name may be (250 characters) is
// written. A link planted at the final name, or at the temporary name earlier versions used
// ("<name>.tmp<pid>"), is never followed: the file it points to keeps its bytes, the report
// lands as a regular file of its own, and no temporary is left behind.
//
// The program runs itself as children with POOLCUDA_CONF set (read when the library loads).
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
  }
  return out;
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// Waits up to ten seconds for `path` to be a regular file holding a report.
bool wait_for_report(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (is_regular_file(path) && read_file(path).find("poolcuda report #") != std::string::npos) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The child: plants links where the report and its old temporary would go, asks for a report.
int child() {
  const std::string path = std::getenv("REPORT_FILE");
  const std::string victim = std::getenv("VICTIM_FILE");
  if (!path.ends_with("long")) {
    CHECK(::symlink(victim.c_str(), path.c_str()) == 0);
    const std::string old_temporary = path + ".tmp" + std::to_string(::getpid());
    CHECK(::symlink(victim.c_str(), old_temporary.c_str()) == 0);
  }
  CHECK_CUDA(cudaFree(nullptr));
  CHECK(::kill(::getpid(), SIGUSR1) == 0);
  CHECK_MSG(wait_for_report(path), "no report at " + path);
  std::printf("child done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "child") return child();

  char dir_template[] = "/tmp/poolcuda-report-files-XXXXXX";
  CHECK(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string victim = dir + "/victim";
  write_file(victim, "not a report");

  // A 250-character name (the longest a file name may be is 255).
  const std::string long_name = std::string(246, 'r') + "long";
  const std::string long_path = dir + "/" + long_name;
  preload_test::ChildResult result = preload_test::run_self(
      "child", {"POOLCUDA_CONF=report_path:" + long_path, "REPORT_FILE=" + long_path,
                "VICTIM_FILE=" + victim});
  std::printf("%s", result.output.c_str());
  CHECK_MSG(result.status == 0, "long-name child exited with " + std::to_string(result.status));
  CHECK(is_regular_file(long_path));

  // Links planted at the report's name and at the old temporary name.
  const std::string path = dir + "/report.txt";
  result = preload_test::run_self(
      "child", {"POOLCUDA_CONF=report_path:" + path, "REPORT_FILE=" + path,
                "VICTIM_FILE=" + victim});
  std::printf("%s", result.output.c_str());
  CHECK_MSG(result.status == 0, "link child exited with " + std::to_string(result.status));
  CHECK_MSG(read_file(victim) == "not a report", "a planted link was followed");
  CHECK_MSG(is_regular_file(path), "the report is not a file of its own");

  // Only the reports, the victim and the planted old-temporary link remain: no temporaries.
  for (const std::string& name : entries(dir)) {
    CHECK_MSG(name == long_name || name == "report.txt" || name == "victim" ||
                  name.starts_with("report.txt.tmp"),
              "left behind: " + name);
    ::unlink((dir + "/" + name).c_str());
  }
  ::rmdir(dir.c_str());
  std::printf("ok\n");
  return 0;
}
