// Preload test: a program whose global operator new serves objects from cudaMallocManaged, as
// unified-memory codes do so that the device can reach any host object. The library's own
// allocations reach that operator new too, the first of them while its constructor parses the
// configuration, before main: the hook of that cudaMallocManaged asked for the configuration
// being parsed, and the process ended with recursive_init_error before main. Only the main
// thread takes managed memory here, a call made inside the operator itself takes malloc, and
// main makes no other CUDA call: the stand-in is C++, and its own threads and calls would
// otherwise come back into it (a real libcudart is C).
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "check.h"

namespace {

thread_local int t_depth = 0;
int g_managed_live = 0;
int g_managed_total = 0;

bool on_main_thread() { return ::syscall(SYS_gettid) == ::getpid(); }

// The managed pointers operator new handed out (main thread only, so no lock).
constexpr int kMostManaged = 4096;
void* g_managed[kMostManaged];

}  // namespace

void* operator new(std::size_t size) {
  if (t_depth == 0 && on_main_thread() && g_managed_live < kMostManaged) {
    ++t_depth;
    void* ptr = nullptr;
    const cudaError_t result = cudaMallocManaged(&ptr, size != 0 ? size : 1);
    --t_depth;
    if (result == cudaSuccess) {
      g_managed[g_managed_live++] = ptr;
      ++g_managed_total;
      return ptr;
    }
  }
  void* ptr = std::malloc(size != 0 ? size : 1);
  if (ptr == nullptr) throw std::bad_alloc();
  return ptr;
}

void operator delete(void* ptr) noexcept {
  if (ptr == nullptr) return;
  if (on_main_thread()) {
    for (int i = 0; i < g_managed_live; ++i) {
      if (g_managed[i] != ptr) continue;
      g_managed[i] = g_managed[--g_managed_live];
      ++t_depth;
      (void)cudaFree(ptr);
      --t_depth;
      return;
    }
  }
  std::free(ptr);
}

void operator delete(void* ptr, std::size_t) noexcept { operator delete(ptr); }

int main() {
  preload_test::require_preloaded();
  const int before = g_managed_total;
  {
    std::vector<std::string> words;
    for (int i = 0; i < 100; ++i) words.emplace_back(64 + i, static_cast<char>('a' + i % 26));
    for (int i = 0; i < 100; ++i) {
      CHECK(words[i].size() == static_cast<std::size_t>(64 + i));
      CHECK(words[i].front() == 'a' + i % 26 && words[i].back() == 'a' + i % 26);
    }
    CHECK_MSG(g_managed_total - before >= 100,
              "only " + std::to_string(g_managed_total - before) + " objects in managed memory");
  }
  std::printf("ok\n");
  return 0;
}
