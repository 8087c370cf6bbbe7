// A library for the dlsym test: dlsym(RTLD_NEXT, name) made from here, to check that the answer
// is relative to this object (the caller), not to libpoolcuda.so. Built twice: linked into the
// test (after the preloaded library in the search order) and as a plugin loaded with
// dlopen(RTLD_LOCAL).
#include <dlfcn.h>

// Not a tail call: glibc takes the caller from dlsym's return address, which must lie here.
extern "C" __attribute__((visibility("default"), optimize("no-optimize-sibling-calls"))) void*
helper_next(const char* name) {
  void* volatile found = dlsym(RTLD_NEXT, name);
  return found;
}
