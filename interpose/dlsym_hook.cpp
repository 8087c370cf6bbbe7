// The exported dlsym (Note [dlsym]).
//
// Note [dlsym]
// A program built with nvcc's default static cudart reaches the driver with
// dlopen("libcuda.so.1") + dlsym(handle, "cuGetProcAddress_v2"), and a program that looks
// runtime functions up through a handle (dlsym(dlopen("libcudart.so.13"), "cudaMalloc"), as
// Python's ctypes and plugin loaders do) bypasses LD_PRELOAD. So the library exports dlsym. A
// handle-based lookup of a name the library hooks, whose answer is the very function the hook
// wraps (the real resolver, a hooked driver variant, the real runtime function), gets the hook;
// every other lookup gets the C library's answer unchanged, and names that do not start with "cu"
// never reach anything but the C library (a program that only uses the CPU never touches CUDA).
// RTLD_DEFAULT lookups are left alone: they already find the library first, unless something the
// program chose (its own definition, an earlier preload) comes before it.
//
// dlsym(RTLD_NEXT, name) must keep its meaning: the next definition after the *caller's* object.
// glibc finds the caller from dlsym's return address, so the RTLD_NEXT case jumps (never calls)
// to the C library's dlsym: a tail jump leaves the caller's return address in place, and glibc
// answers exactly as if the library were not there. The jump is a few instructions of assembly
// per architecture (x86-64, aarch64); C++ cannot promise a tail call. Before the C library's
// dlsym is known (the first dlsym of the process, possibly from a sanitizer runtime that is still
// initializing) the trampoline finds it first, keeping the caller's arguments and return address.
// The bootstrap and the lookup's fast path are not instrumented by sanitizers for that reason
// (Note [Finding dlsym] in dl_real.cpp).
//
// Depends on dl_real.h, hooks.h (runtime hook names), real_cuda.h and driver_variants.h.
#include <dlfcn.h>

#include "interpose/dl_real.h"
#include "interpose/driver_variants.h"
#include "interpose/hooks.h"
#include "interpose/real_cuda.h"

namespace {

// A handle-based lookup found `found` for `name`: the hook when it wraps exactly that function,
// or when `found` is the hooked runtime's own (another interposer preloaded after this library
// may be what the hook calls: the runtime's function, handed out unhooked, then freed pooled
// memory). Another copy of the runtime keeps its own functions.
void* substitute(const char* name, void* found) {
  if (void* hook = poolcuda::runtime_hook(name)) {
    return found == poolcuda::real::resolve_by_name(name) ||
                   poolcuda::real::in_hooked_runtime(found)
               ? hook
               : found;
  }
  return poolcuda::driver::hook_for_symbol(name, found);
}

}  // namespace

// Every dlsym but RTLD_NEXT, reached by a jump from the trampoline below.
extern "C" __attribute__((visibility("hidden"), no_sanitize("address", "thread", "undefined")))
void* poolcuda_dlsym_lookup(void* handle, const char* name) {
  void* found = poolcuda::dl::real_dlsym(handle, name);
  if (found == nullptr || handle == RTLD_DEFAULT || name[0] != 'c' || name[1] != 'u') return found;
  return substitute(name, found);
}

#if defined(__x86_64__)
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  endbr64
  cmpq $-1, %rdi
  jne poolcuda_dlsym_lookup
  movq poolcuda_libc_dlsym(%rip), %rax
  testq %rax, %rax
  jz 1f
  jmp *%rax
1:
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  call poolcuda_dlsym_bootstrap
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  jmp *%rax
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
asm(R"(
  .text
  .globl dlsym
  .type dlsym, %function
  .p2align 2
dlsym:
  .cfi_startproc
  hint #34
  cmn x0, #1
  b.eq 1f
  b poolcuda_dlsym_lookup
1:
  adrp x16, poolcuda_libc_dlsym
  ldr x16, [x16, :lo12:poolcuda_libc_dlsym]
  cbz x16, 2f
  br x16
2:
  stp x29, x30, [sp, #-32]!
  .cfi_def_cfa_offset 32
  .cfi_offset 29, -32
  .cfi_offset 30, -24
  mov x29, sp
  stp x0, x1, [sp, #16]
  bl poolcuda_dlsym_bootstrap
  mov x16, x0
  ldp x0, x1, [sp, #16]
  ldp x29, x30, [sp], #32
  .cfi_def_cfa_offset 0
  .cfi_restore 29
  .cfi_restore 30
  br x16
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#else
#error "the dlsym trampoline exists for x86-64 and aarch64 only"
#endif
