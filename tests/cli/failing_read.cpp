// Preloaded into the CLI by one case of cli_test.sh (report-target-exits): read(2) of the file
// named by POOLCUDA_CLI_TEST_FAIL_READ fails with ESRCH, as a read of /proc/PID/... does when
// the process exits between the open and the read. That race is rare in a real run; this makes
// it happen on every run. Without the variable, read is the C library's.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" __attribute__((visibility("default"))) ssize_t read(int fd, void* buffer,
                                                                size_t size) {
  using ReadFn = ssize_t (*)(int, void*, size_t);
  static const ReadFn real = reinterpret_cast<ReadFn>(::dlsym(RTLD_NEXT, "read"));
  if (const char* failing = std::getenv("POOLCUDA_CLI_TEST_FAIL_READ")) {
    char link[64];
    char name[4096];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t length = ::readlink(link, name, sizeof name - 1);
    if (length > 0) {
      name[length] = '\0';
      if (std::strcmp(name, failing) == 0) {
        errno = ESRCH;
        return -1;
      }
    }
  }
  return real(fd, buffer, size);
}
