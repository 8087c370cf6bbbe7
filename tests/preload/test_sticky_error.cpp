// Preload test: the library's own calls under a sticky context error (stand-in only: it can
// raise one on demand; skipped on a real GPU).
// - "unreadable": a device whose memory size cannot be read (every call fails) is not pooled;
//   each cudaMalloc goes to the real call and gets the real answer, and the log says so once,
//   not once per call. Once the error is gone the device is pooled.
// - own calls on another device: with device 0 current, freeing device-1 buffers closes a
//   device-1 fence epoch, which needs device 1 current; cudaSetDevice fails under the sticky
//   error (the stand-in, like a failing runtime, may still switch), and the program's current
//   device must be device 0 again afterwards. A double free then answers the sticky error.
#include <string>
#include <vector>

#include "check.h"

namespace {

using SetSticky = void (*)(int);

SetSticky sticky_setter() {
  return reinterpret_cast<SetSticky>(::dlsym(RTLD_DEFAULT, "simcuda_set_sticky_error"));
}

std::size_t count_lines(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

int unreadable_child() {
  SetSticky set_sticky = sticky_setter();
  set_sticky(cudaErrorIllegalAddress);
  for (int i = 0; i < 20; ++i) {
    void* ptr = nullptr;
    CHECK_RESULT(cudaMalloc(&ptr, 4096), cudaErrorIllegalAddress);
  }
  set_sticky(0);
  (void)cudaGetLastError();
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 4096));
  CHECK_CUDA(cudaFree(ptr));
  std::printf("child ok\n");
  return 0;
}

void own_calls_restore_device() {
  SetSticky set_sticky = sticky_setter();
  CHECK_CUDA(cudaSetDevice(1));
  std::vector<void*> buffers(300);  // more frees than one fence epoch holds (256)
  for (void*& ptr : buffers) CHECK_CUDA(cudaMalloc(&ptr, 4096));
  CHECK_CUDA(cudaSetDevice(0));
  set_sticky(cudaErrorIllegalAddress);
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));  // pooled: no real call
  // A refused free answers the sticky error, as the plain call does, not cudaErrorInvalidValue.
  CHECK_RESULT(cudaFree(buffers.front()), cudaErrorIllegalAddress);
  int current = -1;
  CHECK_CUDA(cudaGetDevice(&current));
  set_sticky(0);
  (void)cudaGetLastError();
  CHECK_MSG(current == 0, "the current device changed to " + std::to_string(current));
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (sticky_setter() == nullptr) preload_test::skip("needs the stand-in's sticky errors");
  if (argc > 1 && std::string(argv[1]) == "unreadable") return unreadable_child();

  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  if (count >= 2) own_calls_restore_device();

  preload_test::ChildResult child = preload_test::run_self("unreadable", {"POOLCUDA_CONF"});
  std::printf("%s", child.output.c_str());
  CHECK_MSG(child.status == 0, "child exited with " + std::to_string(child.status));
  const std::size_t logged = count_lines(child.output, "cannot read its memory size");
  CHECK_MSG(logged == 1, "logged " + std::to_string(logged) + " times");
  if (count < 2) preload_test::skip("the device case needs two devices");
  std::printf("ok\n");
  return 0;
}
