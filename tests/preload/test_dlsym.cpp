// Preload test: the library's dlsym and the known traps of interposers that hook it.
//  - Self-lookup: dlsym finds the library's dlsym, which answers without recursing, also for
//    RTLD_NEXT through the pointer it handed out.
//  - RTLD_NEXT keeps its meaning: answers made from the program, from a library linked after the
//    preloaded one and from a plugin loaded with RTLD_LOCAL are the ones the same program gets
//    without the library (run as a child without it), except that the program's own
//    dlsym(RTLD_NEXT, "cudaMalloc") finds the preloaded library, which comes next after it.
//  - Repeated and concurrent lookups keep their answers (no guard answering NULL): handle-based
//    lookups of cuGetProcAddress_v2 and cudaMalloc give the hooks, from four threads, and through
//    cudaGetDriverEntryPoint, during which the runtime itself calls dlsym.
//  - The resolver passes what it does not own through untouched (the pointer, status and error
//    the same program gets without the library), recognizes each hooked variant exactly, and
//    passes the empty-name probe. Arguments outside the resolver's contract (bad flags, no
//    place for the pointer) are put only to the stand-in, which refuses them: what the real
//    driver does with them is not documented, and a program run without the library crashed
//    on an H200.
//  - A handle-based cudaMalloc is the hook, and allocates from the pools.
// Usage: test_dlsym PLUGIN (the RTLD_LOCAL plugin's path).
#include <cuda.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

extern "C" void* helper_next(const char* name);

namespace {

using Dlsym = void* (*)(void*, const char*);
using Resolver = decltype(&cuGetProcAddress_v2);

std::string where(void* fn) {
  Dl_info info{};
  if (fn == nullptr) return "null";
  if (::dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  std::string file = info.dli_fname;
  file = file.substr(file.rfind('/') + 1);
  return file + ":" + (info.dli_sname != nullptr ? info.dli_sname : "?");
}

bool from_library(void* fn) { return where(fn).find("poolcuda") != std::string::npos; }

// One line per RTLD_NEXT answer: "caller name -> file:symbol".
std::string next_answers(const char* plugin_path) {
  void* plugin = ::dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(plugin != nullptr, std::string("cannot load ") + plugin_path);
  auto plugin_next = reinterpret_cast<void* (*)(const char*)>(::dlsym(plugin, "helper_next"));
  CHECK(plugin_next != nullptr);
  std::string out;
  for (const char* name : {"strlen", "malloc", "cudaMalloc", "cuGetProcAddress_v2"}) {
    out += std::string("program ") + name + " -> " + where(::dlsym(RTLD_NEXT, name)) + "\n";
    out += std::string("library ") + name + " -> " + where(helper_next(name)) + "\n";
    out += std::string("plugin ") + name + " -> " + where(plugin_next(name)) + "\n";
  }
  return out;
}

void check_self_lookup() {
  auto self = reinterpret_cast<Dlsym>(::dlsym(RTLD_DEFAULT, "dlsym"));
  CHECK_MSG(from_library(reinterpret_cast<void*>(self)), where(reinterpret_cast<void*>(self)));
  CHECK(self(RTLD_DEFAULT, "strlen") == ::dlsym(RTLD_DEFAULT, "strlen"));
  auto next = reinterpret_cast<Dlsym>(::dlsym(RTLD_NEXT, "dlsym"));
  CHECK(next == self);  // the preloaded library comes next after the program
  CHECK(next(RTLD_NEXT, "strlen") == ::dlsym(RTLD_DEFAULT, "strlen"));
  CHECK(next(RTLD_DEFAULT, "dlsym") == reinterpret_cast<void*>(self));
}

void check_repeated_lookups() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW);
  void* runtime = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
  CHECK(driver != nullptr && runtime != nullptr);
  void* resolver = ::dlsym(driver, "cuGetProcAddress_v2");
  void* malloc_hook = ::dlsym(runtime, "cudaMalloc");
  CHECK_MSG(from_library(resolver), where(resolver));
  CHECK_MSG(from_library(malloc_hook), where(malloc_hook));
  CHECK(malloc_hook == ::dlsym(RTLD_DEFAULT, "cudaMalloc"));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        if (::dlsym(driver, "cuGetProcAddress_v2") != resolver) ++wrong;
        if (::dlsym(runtime, "cudaMalloc") != malloc_hook) ++wrong;
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult status;
        if (cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 3020, cudaEnableDefault,
                                             &status) != cudaSuccess ||
            !from_library(fn)) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK_MSG(wrong.load() == 0, std::to_string(wrong.load()) + " lookups answered wrongly");
}

struct Ask {
  const char* name;
  int version;
  cuuint64_t flags;
  const char* hook;  // the library's variant that must answer, or nullptr: passed through
  bool stand_in_only = false;  // outside the resolver's contract
};

constexpr cuuint64_t kPtds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

constexpr Ask kAsks[] = {
    {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
    {"cuMemAlloc", 2000, 0, nullptr},
    {"cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"},
    {"cuMemGetAddressRange", 3020, 0, "cuMemGetAddressRange_v2"},
    {"cuCtxSynchronize", 12090, 0, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
    {"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"},
    {"cuStreamBeginCapture", 10000, kPtds, "cuStreamBeginCapture_ptsz"},
    {"cuStreamBeginCapture", 13000, 0, "cuStreamBeginCapture_v2"},
    {"cuStreamBeginCapture", 13000, kPtds, "cuStreamBeginCapture_v2_ptsz"},
    {"cuStreamEndCapture", 13000, kPtds, "cuStreamEndCapture_ptsz"},
    {"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"},
    {"cuDevicePrimaryCtxReset", 13000, 0, "cuDevicePrimaryCtxReset_v2"},
    {"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2"},
    {"cuGraphLaunch", 13000, 0, "cuGraphLaunch"},
    {"cuGraphLaunch", 13000, kPtds, "cuGraphLaunch_ptsz"},
    {"cuStreamQuery", 13000, 0, nullptr},
    {"cuStreamQuery", 13000, kPtds, nullptr},
    {"cuLaunchKernel", 13000, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 13000, kPtds, "cuLaunchKernel_ptsz"},
    {"cuLaunchKernel", 3020, 0, nullptr},  // before the entry point existed
    {"cuLaunchKernelEx", 13000, kPtds, "cuLaunchKernelEx_ptsz"},
    {"cuModuleLoadData", 13000, 0, "cuModuleLoadData"},
    {"cuLibraryLoadData", 13000, 0, "cuLibraryLoadData"},
    {"cuKernelGetAttribute", 13000, 0, "cuKernelGetAttribute"},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 13000, 0,
     "cuOccupancyMaxActiveBlocksPerMultiprocessor"},
    {"cuModuleGetGlobal", 13000, 0, "cuModuleGetGlobal_v2"},
    {"cuModuleGetGlobal", 2000, 0, nullptr},  // the 32-bit variant is not hooked
    {"cuMemAllocAsync", 13000, 0, "cuMemAllocAsync"},
    {"cuMemAllocAsync", 13000, kPtds, "cuMemAllocAsync_ptsz"},
    {"cuMemFreeAsync", 13000, kPtds, "cuMemFreeAsync_ptsz"},
    {"cuMemPoolCreate", 13000, 0, nullptr},
    {"cuMemAllocFromPoolAsync", 13000, 0, "cuMemAllocFromPoolAsync"},
    {"cuMemAllocFromPoolAsync", 13000, kPtds, "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemCreate", 13000, 0, "cuMemCreate"},
    {"cuArrayCreate", 3020, 0, "cuArrayCreate_v2"},
    {"cuArray3DCreate", 13000, 0, "cuArray3DCreate_v2"},
    {"cuCtxGetCurrent", 13000, 0, nullptr},
    {"cuMemAllocAsync", 11000, 0, nullptr},  // version not sufficient
    {"cuNoSuchFunction", 13000, 0, nullptr},
    {"", 13000, 0, nullptr},             // the empty-name probe
    {"cuMemAlloc", 13000, 0x100, nullptr, true},  // bad flags
};

bool asked(const Ask& ask) { return !ask.stand_in_only || preload_test::on_stand_in(); }

// One line per ask: "resolver NAME VERSION FLAGS -> RESULT STATUS WHERE".
std::string resolver_answers() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW);
  CHECK(driver != nullptr);
  auto resolve = reinterpret_cast<Resolver>(::dlsym(driver, "cuGetProcAddress_v2"));
  CHECK(resolve != nullptr);
  std::string out;
  for (const Ask& ask : kAsks) {
    if (!asked(ask)) continue;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUresult result = resolve(ask.name, &fn, ask.version, ask.flags, &status);
    out += std::string("resolver \"") + ask.name + "\" " + std::to_string(ask.version) + " " +
           std::to_string(ask.flags) + " -> " + std::to_string(result) + " " +
           std::to_string(status) + " " + where(fn) + "\n";
  }
  if (preload_test::on_stand_in()) {
    CHECK(resolve("cuMemAlloc", nullptr, 13000, 0, nullptr) == CUDA_ERROR_INVALID_VALUE);
  }
  return out;
}

// The line for `ask` in `answers`, and where the answer came from (its last word).
std::string line_of(const std::string& answers, const Ask& ask, std::string* from) {
  const std::string key = std::string("resolver \"") + ask.name + "\" " +
                          std::to_string(ask.version) + " " + std::to_string(ask.flags) + " -> ";
  const std::size_t at = answers.find(key);
  CHECK_MSG(at != std::string::npos, key);
  const std::string line = answers.substr(at, answers.find('\n', at) - at);
  *from = line.substr(line.rfind(' ') + 1);
  return line.substr(0, line.rfind(' '));
}

// What the resolver answers with the library and without it: the same results and statuses,
// the same pointers for what the library does not hook, its hook for each hooked variant.
void compare_resolvers(const std::string& with, const std::string& without) {
  for (const Ask& ask : kAsks) {
    if (!asked(ask)) continue;
    std::string ours, theirs;
    const std::string mine = line_of(with, ask, &ours);
    const std::string real = line_of(without, ask, &theirs);
    CHECK_MSG(mine == real, mine + " (with the library) against " + real);
    if (ask.hook == nullptr) {
      CHECK_MSG(ours == theirs, mine + ": " + ours + " instead of " + theirs);
    } else {
      CHECK_MSG(ours == std::string("libpoolcuda.so:") + ask.hook,
                mine + ": " + ours + ", expected the hook " + ask.hook);
    }
  }
}

void check_handle_lookup() {
  void* runtime = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
  using Malloc = cudaError_t (*)(void**, std::size_t);
  using Free = cudaError_t (*)(void*);
  auto handle_malloc = reinterpret_cast<Malloc>(::dlsym(runtime, "cudaMalloc"));
  auto handle_free = reinterpret_cast<Free>(::dlsym(runtime, "cudaFree"));
  CHECK(from_library(reinterpret_cast<void*>(handle_malloc)));
  CHECK(from_library(reinterpret_cast<void*>(handle_free)));
  // Not hooked: the runtime's own.
  CHECK(!from_library(::dlsym(runtime, "cudaEventElapsedTime")));
  void* ptr = nullptr;
  CHECK_CUDA(handle_malloc(&ptr, 1 << 20));
  CHECK_CUDA(handle_free(ptr));
  if (!preload_test::on_stand_in()) return;
  // 100 pairs without the pools are 100 driver allocations; with them, a page or two.
  const std::uint64_t before = preload_test::counter("cudaMalloc");
  for (int i = 0; i < 100; ++i) {
    CHECK_CUDA(handle_malloc(&ptr, 4096));
    CHECK_CUDA(handle_free(ptr));
  }
  const std::uint64_t made = preload_test::counter("cudaMalloc") - before;
  CHECK_MSG(made <= 4, "handle-based cudaMalloc not pooled: " + std::to_string(made) +
                           " driver allocations for 100 pairs");
}

}  // namespace

int main(int argc, char** argv) {
  CHECK(argc > 1);
  if (std::string(argv[1]) == "answers") {  // the child, without the library
    std::printf("%s%s", next_answers(std::getenv("DLSYM_TEST_PLUGIN")).c_str(),
                resolver_answers().c_str());
    return 0;
  }
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  check_self_lookup();
  check_repeated_lookups();
  check_handle_lookup();

  // RTLD_NEXT answers, with the library and without it (LD_PRELOAD minus the library).
  const std::string without = preload_test::preload_without_library();
  const std::string plugin = argv[1];
  std::string with = next_answers(plugin.c_str());
  preload_test::ChildResult plain = preload_test::run_self(
      "answers", {"LD_PRELOAD=" + without, "DLSYM_TEST_PLUGIN=" + plugin});
  CHECK_MSG(plain.status == 0, plain.output);
  compare_resolvers(resolver_answers(), plain.output);
  plain.output.erase(plain.output.find("resolver \""));
  CHECK_MSG(with.find("program cudaMalloc -> libpoolcuda.so:cudaMalloc\n") != std::string::npos,
            with);
  // The program's own RTLD_NEXT lookups of names the library exports find the library: it is
  // the next object after the program. Those lines are the expected difference.
  for (const char* name : {"cudaMalloc", "cuGetProcAddress_v2"}) {
    const std::string prefix = std::string("program ") + name + " -> ";
    for (std::string* answers : {&with, &plain.output}) {
      const std::size_t at = answers->find(prefix);
      CHECK(at != std::string::npos);
      answers->erase(at, answers->find('\n', at) + 1 - at);
    }
  }
  CHECK_MSG(with == plain.output, "with the library:\n" + with + "without:\n" + plain.output);
  std::printf("%sok\n", with.c_str());
  return 0;
}
