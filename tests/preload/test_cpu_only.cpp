// Preload test: a program that only uses the CPU, and calls dlsym the ways programs do
// (RTLD_DEFAULT, RTLD_NEXT, a handle, names that start with "cu" like the C library's cuserid),
// runs under the library without loading or initializing CUDA, and without hanging (the test's
// timeout). It is not linked with any CUDA library.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "check failed: %s\n", what);
  ++failures;
}

}  // namespace

int main() {
  void* self = ::dlsym(RTLD_DEFAULT, "dlsym");
  Dl_info info{};
  expect(self != nullptr && ::dladdr(self, &info) != 0 &&
             std::strstr(info.dli_fname, "poolcuda") != nullptr,
         "dlsym is the library's (LD_PRELOAD set?)");
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  expect(libc != nullptr, "libc is loaded");
  for (int i = 0; i < 1000; ++i) {
    expect(::dlsym(RTLD_DEFAULT, "strlen") != nullptr, "RTLD_DEFAULT strlen");
    // The program defines no malloc: the next one after it is the first one there is.
    expect(::dlsym(RTLD_NEXT, "malloc") == ::dlsym(RTLD_DEFAULT, "malloc"), "RTLD_NEXT malloc");
    expect(::dlsym(libc, "cuserid") == ::dlsym(RTLD_DEFAULT, "cuserid"), "cuserid by handle");
    expect(::dlsym(libc, "cuMemAlloc_v2") == nullptr, "no cuMemAlloc_v2 in libc");
    expect(::dlsym(libc, "no_such_symbol") == nullptr, "an unknown name");
  }
  void* m = ::dlopen("libm.so.6", RTLD_NOW);
  using Cos = double (*)(double);
  auto cosine = m != nullptr ? reinterpret_cast<Cos>(::dlsym(m, "cos")) : nullptr;
  expect(cosine != nullptr && cosine(0.0) == 1.0, "cos from libm");
  expect(::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == nullptr, "libcuda was loaded");
  expect(::dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD) == nullptr, "libcudart was loaded");
  if (failures != 0) return 1;
  std::printf("ok\n");
  return 0;
}
