// The re-entry guard of every exported entry point, runtime and driver alike, and of the
// library's own CUDA calls. While it is set on a thread, a hooked call goes straight to the real
// function: the real runtime reaches the driver through the library's driver hooks (it resolves
// them through the hooked cuGetProcAddress), and a call made on the library's behalf, or by the
// real runtime while one of our hooks runs, must never enter the pools a second time.
//
// Depends on lifecycle.h only.
#pragma once

#include "interpose/lifecycle.h"

namespace poolcuda {

namespace detail {
// initial-exec: no allocation and no lock on first access, which matters inside a preloaded
// library (and inside dlsym, which sanitizer runtimes call before they are initialized).
__attribute__((tls_model("initial-exec"))) inline thread_local bool t_inside_hook = false;
}  // namespace detail

inline bool inside_hook() { return detail::t_inside_hook; }

// A hook that should call the real function: inside another hook, or in a forked child
// (Note [Fork] in lifecycle.cpp).
inline bool bypass() { return inside_hook() || passthrough(); }

// Sets the guard for a scope; nests (restores what it found).
class InsideHook {
 public:
  InsideHook() : outer_(detail::t_inside_hook) { detail::t_inside_hook = true; }
  ~InsideHook() { detail::t_inside_hook = outer_; }
  InsideHook(const InsideHook&) = delete;
  InsideHook& operator=(const InsideHook&) = delete;

 private:
  bool outer_;
};

}  // namespace poolcuda
