// Preload test: report files. A report name as long as a file name may be (250 characters) is
// written. A link planted at the final name, or at the temporary name earlier versions used
// ("<name>.tmp<pid>"), is never followed: the file it points to keeps its bytes, the report
// lands as a regular file of its own, and no temporary is left behind.
//
// Names that are not files (Note [Reports into devices and FIFOs]) are written into, never
// replaced: a FIFO with a reader gets the report; a FIFO without one, or whose reader goes away
// mid-report, loses it with a log line and neither blocks nor kills the program; a socket loses
// it; a link to /dev/null or to the program's standard error (a pipe, or a regular file) stays a
// link and the report goes through it (one to a closed descriptor gets nothing), but a link
// another user owns is replaced, not followed.
// The stderr keyword is recognised in any case (report_path:STDERR).
//
// The program runs itself as children with POOLCUDA_CONF set (read when the library loads).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
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

mode_t kind_of(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 ? info.st_mode & S_IFMT : 0;
}

bool is_regular_file(const std::string& path) { return kind_of(path) == S_IFREG; }

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

// The child of the cases below: touches CUDA (so report_at_exit:1 writes a report) from the
// directory CHILD_DIR, and exits.
int exit_child() {
  CHECK(::chdir(std::getenv("CHILD_DIR")) == 0);
  // CHILD_DATA_ON_2=FILE: the child starts again with descriptor 2 closed (as under 2>&-), and
  // its own data file, opened first, takes that number.
  if (const char* data = std::getenv("CHILD_DATA_ON_2")) {
    if (::fcntl(2, F_GETFD) != -1) {
      ::close(2);
      char* const again[] = {const_cast<char*>("test_report_files"),
                             const_cast<char*>("exit-child"), nullptr};
      ::execv("/proc/self/exe", again);
      return 3;
    }
    const int fd = ::open(data, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd == 2 && ::write(fd, "DATA\n", 5) == 5);
  }
  if (const char* file = std::getenv("CHILD_STDERR")) {  // as 2>FILE does (no O_APPEND)
    const int fd = ::open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(fd >= 0 && ::dup2(fd, 2) == 2);
  }
  // CHILD_FULL_PIPE: descriptor 9 is a pipe already full, whose reader (kept open for the life
  // of the process) never reads.
  if (std::getenv("CHILD_FULL_PIPE") != nullptr) {
    int ends[2];
    CHECK(::pipe(ends) == 0 && ::dup2(ends[1], 9) == 9);
    CHECK(::fcntl(9, F_SETFL, O_NONBLOCK) == 0);
    const std::string block(4096, 'x');
    while (::write(9, block.data(), block.size()) > 0) {
    }
    CHECK(::fcntl(9, F_SETFL, 0) == 0);  // blocking again, as the program's own would be
  }
  CHECK_CUDA(cudaFree(nullptr));
  // CHILD_SIGNALS=N: N report signals first, a millisecond apart.
  if (const char* signals = std::getenv("CHILD_SIGNALS")) {
    for (int i = std::atoi(signals); i > 0; --i) {
      CHECK(::raise(SIGUSR1) == 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return 0;
}

// Runs exit_child with report_path `report_path` and a report at exit; it must exit at once
// and with status 0 (not blocked, not killed by SIGPIPE).
preload_test::ChildResult run_exit_child(const std::string& dir, const std::string& report_path,
                                        const std::string& stderr_file = "") {
  const preload_test::ChildResult result = preload_test::run_self(
      "exit-child",
      {"POOLCUDA_CONF=report_at_exit:1,report_path:" + report_path, "CHILD_DIR=" + dir,
       stderr_file.empty() ? "CHILD_STDERR" : "CHILD_STDERR=" + stderr_file},
      20);
  std::printf("report_path:%s:\n%s", report_path.c_str(), result.output.c_str());
  CHECK_MSG(result.status == 0 && !result.timed_out,
            report_path + ": the child exited with " + std::to_string(result.status));
  return result;
}

// What is waiting in the pipe behind `fd` (non-blocking).
std::string drain(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) {
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return text;
}

// Note [Reports into devices and FIFOs], from the outside.
void check_nodes(const std::string& dir) {
  const std::string fifo = dir + "/fifo";
  CHECK(::mkfifo(fifo.c_str(), 0600) == 0);

  // A reader (held open here: O_RDWR never waits for a writer) gets the whole report.
  int reader = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  CHECK(reader >= 0);
  auto result = run_exit_child(dir, fifo);
  CHECK(result.output.find("report 1 written to " + fifo) != std::string::npos);
  const std::string report = drain(reader);
  CHECK_MSG(report.find("poolcuda report #1 (pid ") != std::string::npos, "FIFO got: " + report);
  CHECK(report.ends_with("\n"));
  ::close(reader);
  CHECK(kind_of(fifo) == S_IFIFO);

  // Nobody reads: the report is dropped at once.
  result = run_exit_child(dir, fifo);
  CHECK(result.output.find("cannot write report 1 to " + fifo +
                           ": no process has the FIFO open for reading") != std::string::npos);
  CHECK(kind_of(fifo) == S_IFIFO);

  // The reader goes away while the report waits for room (the pipe is full): the write fails
  // with EPIPE, and the SIGPIPE it raises on the exiting thread must not kill the program. (If
  // the reader is gone before the child opens the FIFO, the report is dropped as above.)
  reader = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  CHECK(reader >= 0);
  ::fcntl(reader, F_SETPIPE_SZ, 4096);
  const std::string filler(4096, 'x');
  while (::write(reader, filler.data(), filler.size()) > 0) {
  }
  std::thread closer([reader] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::close(reader);
  });
  result = run_exit_child(dir, fifo);
  closer.join();
  CHECK(result.output.find("cannot write report 1 to " + fifo) != std::string::npos);
  CHECK(kind_of(fifo) == S_IFIFO);

  // A socket cannot be opened: the report is lost, the socket stays.
  const std::string socket_path = dir + "/socket";
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  CHECK(socket_path.size() < sizeof address.sun_path);
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  CHECK(::bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  result = run_exit_child(dir, socket_path);
  CHECK(result.output.find("cannot write report 1 to " + socket_path + ": it is a socket") !=
        std::string::npos);
  CHECK(kind_of(socket_path) == S_IFSOCK);
  ::close(listener);

  // Links to character devices and pipes are followed, and stay links. (Should this regress,
  // a rename replaces the link, never /dev/null itself.)
  const std::string null_link = dir + "/null-link";
  CHECK(::symlink("/dev/null", null_link.c_str()) == 0);
  result = run_exit_child(dir, null_link);
  CHECK(result.output.find("report 1 written to " + null_link) != std::string::npos);
  CHECK(kind_of(null_link) == S_IFLNK);
  CHECK(kind_of("/dev/null") == S_IFCHR);
  const std::string stderr_link = dir + "/stderr-link";  // the child's stderr: run_self's pipe
  CHECK(::symlink("/proc/self/fd/2", stderr_link.c_str()) == 0);
  result = run_exit_child(dir, stderr_link);
  CHECK(result.output.find("poolcuda report #1 (pid ") != std::string::npos);
  CHECK(result.output.find("report 1 written to " + stderr_link) != std::string::npos);
  CHECK(kind_of(stderr_link) == S_IFLNK);
  // Through a link into /proc, a regular file too is written in place: renaming would replace
  // the link (as root, /dev/stderr itself). /proc/self/fd/2 is descriptor 2 itself, so the log
  // line written after the report, at descriptor 2's offset, does not overwrite it.
  const std::string stderr_file = dir + "/stderr.txt";
  run_exit_child(dir, stderr_link, stderr_file);
  const std::string appended = read_file(stderr_file);
  CHECK_MSG(appended.find("poolcuda report #1 (pid ") != std::string::npos &&
                appended.find("report 1 written to " + stderr_link) != std::string::npos,
            "standard error got: " + appended);
  CHECK(kind_of(stderr_link) == S_IFLNK);
  // A relative link there, and a link to the link, lead there too: each link on the way is
  // followed (they were taken for links elsewhere and replaced by a file).
  std::string up;
  for (char c : dir) up += c == '/' ? "../" : "";
  const std::string relative_link = dir + "/relative-link";
  CHECK(::symlink((up + "proc/self/fd/2").c_str(), relative_link.c_str()) == 0);
  const std::string chained_link = dir + "/chained-link";
  CHECK(::symlink(stderr_link.c_str(), chained_link.c_str()) == 0);
  for (const std::string& link : {relative_link, chained_link}) {
    run_exit_child(dir, link, stderr_file);
    const std::string written = read_file(stderr_file);
    CHECK_MSG(written.find("poolcuda report #1 (pid ") != std::string::npos,
              link + ": standard error got: " + written);
    CHECK(kind_of(link) == S_IFLNK);
  }
  // Standard error closed as the process started: /dev/stderr leads to the program's own file
  // that took descriptor 2, which gets nothing, as under report_path:stderr.
  {
    const std::string data = dir + "/data.txt";
    const preload_test::ChildResult closed = preload_test::run_self(
        "exit-child",
        {"POOLCUDA_CONF=report_at_exit:1,report_path:/dev/stderr", "CHILD_DIR=" + dir,
         "CHILD_DATA_ON_2=" + data, "CHILD_STDERR"},
        20);
    CHECK_MSG(closed.status == 0 && !closed.timed_out, closed.output);
    CHECK_MSG(read_file(data) == "DATA\n", "the program's file got: " + read_file(data));
  }
  // So is a name in a descriptor directory itself (/dev/fd is a link to /proc/self/fd): no
  // temporary file can be made beside it.
  for (const char* name : {"/dev/fd/2", "/proc/self/fd/2"}) {
    run_exit_child(dir, name, stderr_file);
    const std::string written = read_file(stderr_file);
    CHECK_MSG(written.find("poolcuda report #1 (pid ") != std::string::npos &&
                  written.find(std::string("report 1 written to ") + name) != std::string::npos,
              std::string(name) + ": standard error got: " + written);
  }

  // A full pipe named through /dev/fd is opened anew, non-blocking, as a FIFO is: its
  // descriptor, which blocks, would hold the exit for good.
  {
    const preload_test::ChildResult full = preload_test::run_self(
        "exit-child",
        {"POOLCUDA_CONF=report_at_exit:1,report_path:/dev/fd/9", "CHILD_DIR=" + dir,
         "CHILD_FULL_PIPE=1", "CHILD_STDERR"},
        20);
    CHECK_MSG(full.status == 0 && !full.timed_out &&
                  full.output.find("its reader did not take the whole report") !=
                      std::string::npos,
              "a full pipe: " + full.output);
  }

  // A path of thousands of bytes: the log line says it whole, and why after it (a line cut at
  // 1 KiB lost the reason).
  {
    std::string long_path = dir;
    while (long_path.size() < 3000) long_path += "/" + std::string(200, 'd');
    long_path += "/report.txt";
    result = run_exit_child(dir, long_path);
    CHECK_MSG(result.output.find("cannot write report 1 to " + long_path + ": ") !=
                  std::string::npos,
              "no whole line with the reason: " + result.output.substr(0, 200));
  }

  // A terminal nobody reads (a pty whose reader stopped): report signals fill it, and the exit,
  // with its own report, still comes within its bounds. The writes blocked for good, and the
  // exit waited for them.
  {
    const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
    CHECK(terminal >= 0 && ::grantpt(terminal) == 0 && ::unlockpt(terminal) == 0);
    const std::string name = ::ptsname(terminal);
    const auto started = std::chrono::steady_clock::now();
    const preload_test::ChildResult stalled = preload_test::run_self(
        "exit-child",
        {"POOLCUDA_CONF=report_at_exit:1,report_path:" + name, "CHILD_DIR=" + dir,
         "CHILD_SIGNALS=300", "CHILD_STDERR"},
        30);
    const auto took = std::chrono::steady_clock::now() - started;
    ::close(terminal);
    CHECK_MSG(stalled.status == 0 && !stalled.timed_out && took < std::chrono::seconds(20),
              "an unread terminal held the exit: " + stalled.output.substr(0, 400));
  }

  // A link into /proc to nothing (a closed descriptor) is refused, not replaced.
  const std::string closed_link = dir + "/closed-link";
  CHECK(::symlink("/proc/self/fd/987", closed_link.c_str()) == 0);
  result = run_exit_child(dir, closed_link);
  CHECK(result.output.find("cannot write report 1 to " + closed_link +
                           ": it is a link into /proc to nothing") != std::string::npos);
  CHECK(kind_of(closed_link) == S_IFLNK);

  // A link another user owns may have been planted: replaced by the report, never followed.
  // (Only root can give a link away.)
  const std::string others_link = dir + "/others-link";
  if (::geteuid() == 0) {
    CHECK(::symlink("/dev/null", others_link.c_str()) == 0);
    CHECK(::lchown(others_link.c_str(), 65534, 65534) == 0);
    run_exit_child(dir, others_link);
    CHECK_MSG(is_regular_file(others_link) &&
                  read_file(others_link).find("poolcuda report #1") != std::string::npos,
              "a link of another user's was followed");
    CHECK(kind_of("/dev/null") == S_IFCHR);
    // A FIFO another user made gets nothing, although a reader waits on it.
    const std::string others_fifo = dir + "/others-fifo";
    CHECK(::mkfifo(others_fifo.c_str(), 0666) == 0);
    CHECK(::chown(others_fifo.c_str(), 65534, 65534) == 0);
    const int reader = ::open(others_fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    CHECK(reader >= 0);
    const auto refused = run_exit_child(dir, others_fifo);
    CHECK_MSG(refused.output.find("cannot write report 1 to " + others_fifo +
                                  ": it is a FIFO or socket another user owns") !=
                  std::string::npos,
              refused.output);
    char byte = 0;
    CHECK_MSG(::read(reader, &byte, 1) < 0, "a report went into another user's FIFO");
    ::close(reader);
    CHECK(kind_of(others_fifo) == S_IFIFO);
  }

  // The stderr keyword in another case is still the keyword, not a file in the working
  // directory.
  for (const std::string keyword : {"STDERR", "Stderr"}) {
    result = run_exit_child(dir, keyword);
    CHECK_MSG(result.output.find("poolcuda report #1 (pid ") != std::string::npos,
              keyword + ": no report on stderr");
    CHECK_MSG(kind_of(dir + "/" + keyword) == 0, keyword + " was written as a file");
  }

  // The stdout keyword writes to descriptor 1 (the test's pipe), in any case, with nothing on
  // standard error and no file named after it; ./stdout is a file.
  for (const std::string keyword : {"stdout", "STDOUT"}) {
    result = run_exit_child(dir, keyword, stderr_file);
    CHECK_MSG(result.output.find("poolcuda report #1 (pid ") != std::string::npos,
              keyword + ": no report on stdout");
    const std::string on_stderr = read_file(stderr_file);
    CHECK_MSG(on_stderr.find("poolcuda report #") == std::string::npos,
              keyword + ": standard error had:\n" + on_stderr);
    CHECK_MSG(kind_of(dir + "/" + keyword) == 0, keyword + " was written as a file");
  }
  run_exit_child(dir, "./stdout");
  CHECK(read_file(dir + "/stdout").find("poolcuda report #1 (pid ") != std::string::npos);

  for (const char* name : {"fifo", "socket", "null-link", "stderr-link", "stderr.txt", "stdout",
                           "closed-link", "others-link", "others-fifo", "relative-link",
                           "chained-link", "data.txt"}) {
    ::unlink((dir + "/" + name).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  if (argc > 1 && std::string(argv[1]) == "exit-child") return exit_child();

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

  check_nodes(dir);

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
