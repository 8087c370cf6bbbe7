// The C library's own dlsym, for the library's lookups: the exported dlsym (dlsym_hook.cpp)
// would hand the library its own hooks. Found once with dlvsym, never with dlsym.
//
// Depends on libdl only.
#pragma once

namespace poolcuda::dl {

// The C library's dlsym. RTLD_NEXT is relative to this library, as for any call made from it.
void* real_dlsym(void* handle, const char* name);

}  // namespace poolcuda::dl

extern "C" {
// The C library's dlsym once found (null before), read by the dlsym trampoline.
extern void* poolcuda_libc_dlsym;
// Finds it (idempotent, thread-safe) and returns it; never null: a dlsym that finds nothing
// stands in when no version of it can be found.
void* poolcuda_dlsym_bootstrap();
}
