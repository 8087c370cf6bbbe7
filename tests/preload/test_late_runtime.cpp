// Preload test: a runtime that the program loads late, unloads, or finds under another name
// (Note [Missing functions] and Note [The runtime stays loaded] in interpose/real_cuda.cpp).
// Not linked with the runtime: like a plugin host or an interpreter, it dlopens it. Each case
// runs in a child of its own, and 32 buffers of 64 KiB share a pooled page; freeing one must
// leave the other 31 readable, with their bytes.
//   reload:  the runtime opened RTLD_LOCAL, the buffers allocated, the runtime dlclose()d and
//            opened again, one buffer freed through the new handle. The library kept the old
//            runtime's addresses: once the runtime was unloaded and mapped elsewhere, the new
//            handle's cudaFree was not the one the library wraps, went to the runtime unhooked,
//            and freed the whole page. Now the runtime stays loaded through the dlclose().
//   probe:   dlsym(dlopen(NULL), "cudaFree") before the runtime is loaded (ctypes.CDLL(None)
//            asks so whether CUDA is loaded): the library found no runtime and recorded
//            cudaFree as missing for good, so the handle's cudaFree went unhooked later.
//   renamed: a copy of the runtime whose SONAME is libcudart-a1.so (how a Python wheel bundles
//            one), opened RTLD_LOCAL: neither RTLD_NEXT nor the runtime's usual names find it,
//            and every call of the library's exports failed (cudaErrorSharedObjectSymbolNotFound).
//   shim:    a second interposer that wraps cudaFree only, preloaded after the library (the
//            test's argument): the library's real cudaFree is then the shim's, and a handle's
//            lookup of the runtime's own cudaFree was handed out unhooked (while its cudaMalloc
//            was hooked), so a pooled buffer's free freed the whole page.
#include <dlfcn.h>
#include <elf.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "check.h"

namespace {

using MallocFn = cudaError_t (*)(void**, std::size_t);
using FreeFn = cudaError_t (*)(void*);
using MemcpyFn = cudaError_t (*)(void*, const void*, std::size_t, cudaMemcpyKind);
using MemsetFn = cudaError_t (*)(void*, int, std::size_t);

constexpr int kBuffers = 32;
constexpr std::size_t kSize = 64 * 1024;

struct Runtime {
  MallocFn malloc_fn;
  FreeFn free_fn;
  MemcpyFn memcpy_fn;
  MemsetFn memset_fn;
};

Runtime functions(void* handle) {
  Runtime r{reinterpret_cast<MallocFn>(::dlsym(handle, "cudaMalloc")),
            reinterpret_cast<FreeFn>(::dlsym(handle, "cudaFree")),
            reinterpret_cast<MemcpyFn>(::dlsym(handle, "cudaMemcpy")),
            reinterpret_cast<MemsetFn>(::dlsym(handle, "cudaMemset"))};
  CHECK(r.malloc_fn != nullptr && r.free_fn != nullptr && r.memcpy_fn != nullptr &&
        r.memset_fn != nullptr);
  return r;
}

std::vector<void*> allocate(const Runtime& r) {
  std::vector<void*> buffers(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    CHECK(r.malloc_fn(&buffers[i], kSize) == cudaSuccess);
    CHECK(r.memset_fn(buffers[i], i + 1, kSize) == cudaSuccess);
  }
  return buffers;
}

// Frees the last buffer, then reads every other one back and frees it.
void free_one_then_check(const Runtime& r, const std::vector<void*>& buffers) {
  CHECK(r.free_fn(buffers[kBuffers - 1]) == cudaSuccess);
  std::vector<unsigned char> host(kSize);
  for (int i = 0; i < kBuffers - 1; ++i) {
    const cudaError_t read = r.memcpy_fn(host.data(), buffers[i], kSize, cudaMemcpyDeviceToHost);
    CHECK_MSG(read == cudaSuccess, "buffer " + std::to_string(i) + " lost after a neighbour's "
                                   "free: CUDA error " + std::to_string(read));
    CHECK_MSG(host[0] == i + 1 && host[kSize - 1] == i + 1,
              "buffer " + std::to_string(i) + " changed");
    CHECK(r.free_fn(buffers[i]) == cudaSuccess);
  }
}

void reload_case() {
  void* first = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  CHECK(first != nullptr);
  const std::vector<void*> buffers = allocate(functions(first));
  CHECK(::dlclose(first) == 0);
  CHECK_MSG(::dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD) != nullptr,
            "the runtime was unloaded while the library held its functions");
  void* again = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  CHECK(again != nullptr);
  free_one_then_check(functions(again), buffers);
}

void probe_case() {
  void* self = ::dlopen(nullptr, RTLD_NOW);
  CHECK(::dlsym(self, "cudaFree") != nullptr);  // the library's export: no runtime yet
  void* runtime = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  CHECK(runtime != nullptr);
  const Runtime r = functions(runtime);
  free_one_then_check(r, allocate(r));
}

// The runtime the loader finds first: the first directory of LD_LIBRARY_PATH that holds one.
std::string runtime_path() {
  const char* paths = std::getenv("LD_LIBRARY_PATH");
  CHECK(paths != nullptr);
  const std::string list = paths;
  for (std::size_t at = 0; at <= list.size();) {
    std::size_t end = list.find(':', at);
    if (end == std::string::npos) end = list.size();
    const std::string candidate = list.substr(at, end - at) + "/libcudart.so.13";
    if (::access(candidate.c_str(), R_OK) == 0) return candidate;
    at = end + 1;
  }
  preload_test::fail(__FILE__, __LINE__, "no libcudart.so.13 in LD_LIBRARY_PATH");
  return {};
}

// A copy of the runtime whose SONAME (and every string it shares) reads libcudart-a1.so: the
// name has the same length, so the string is overwritten in place.
std::string renamed_copy() {
  std::ifstream in(runtime_path(), std::ios::binary);
  CHECK(in.good());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* header = reinterpret_cast<const Elf64_Ehdr*>(bytes.data());
  const auto* sections = reinterpret_cast<const Elf64_Shdr*>(bytes.data() + header->e_shoff);
  int renamed = 0;
  for (int i = 0; i < header->e_shnum; ++i) {
    if (sections[i].sh_type != SHT_STRTAB) continue;
    char* table = bytes.data() + sections[i].sh_offset;
    for (std::size_t at = 0; at + 16 <= sections[i].sh_size; ++at) {
      if (std::memcmp(table + at, "libcudart.so.13", 16) == 0) {
        std::memcpy(table + at, "libcudart-a1.so", 16);
        ++renamed;
      }
    }
  }
  CHECK_MSG(renamed > 0, "no SONAME string in " + runtime_path());
  char dir[] = "/tmp/poolcuda-late-runtime-XXXXXX";
  CHECK(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/libcudart-a1.so";
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

void renamed_case() {
  const std::string path = renamed_copy();
  void* runtime = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(runtime != nullptr, std::string("dlopen: ") + ::dlerror());
  // The library's exports, as a plugin linked against that runtime binds them.
  const Runtime exports = functions(RTLD_DEFAULT);
  const std::vector<void*> buffers = allocate(exports);
  free_one_then_check(exports, buffers);
  ::unlink(path.c_str());
  ::rmdir(path.substr(0, path.rfind('/')).c_str());
}

void shim_case() {
  void* runtime = ::dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  CHECK(runtime != nullptr);
  const Runtime r = functions(runtime);
  free_one_then_check(r, allocate(r));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "";
  if (name == "reload" || name == "probe" || name == "renamed" || name == "shim") {
    if (name == "reload") reload_case();
    if (name == "probe") probe_case();
    if (name == "renamed") renamed_case();
    if (name == "shim") shim_case();
    std::printf("case done\n");
    return 0;
  }
  CHECK(argc == 2);  // the shim's path
  preload_test::require_preloaded();
  preload_test::run_cases_in_children({"reload", "probe", "renamed"});
  const char* preload = std::getenv("LD_PRELOAD");
  CHECK(preload != nullptr);
  const preload_test::ChildResult child =
      preload_test::run_self("shim", {std::string("LD_PRELOAD=") + preload + ":" + argv[1]}, 60);
  CHECK_MSG(child.status == 0 && child.output.find("case done") != std::string::npos,
            "shim: " + child.output);
  std::printf("shim: ok\n");
  std::printf("ok\n");
  return 0;
}
