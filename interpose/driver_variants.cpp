// The hooked driver variants and the pointer map (see driver_variants.h).
//
// Note [Variants]
// A driver entry point has variants: cuMemAlloc (32-bit sizes, CUDA 2.0) and cuMemAlloc_v2
// (3.2), cuStreamBeginCapture without a mode (10.0) and with one (_v2, 10.1), and for calls that
// take a stream a per-thread-default-stream flavour (_ptsz). Each variant has its own signature
// and meaning, and code built for one must get exactly that one: a static cudart asks the
// resolver for ("cuMemAlloc", 3020, flags) and trusts the pointer to be cuMemAlloc_v2. So the
// library never picks a variant itself. Once, when a driver is loaded, every hooked variant is
// resolved through the real driver at the version that introduced it (and in its flavour), and
// its exported symbol is looked up too (the resolver may hand out internal addresses that differ
// from the exported ones); each address found maps to the hook of exactly that variant. The
// hooked resolver asks the real one first and only swaps a pointer this map recognizes. A
// variant the library does not know (a future cuMemAlloc_v3) is passed through untouched, never
// mistaken for its base name.
//
// The map is built under a mutex, at most once per process; a lookup that arrives while this
// thread builds it (the real resolver calling dlsym) gets the real pointer. A fork takes the
// mutex first: a child forked while another thread built the map would otherwise inherit the
// mutex held, by a thread the child does not have, and its first lookup would wait forever.
//
// Depends on the CUDA driver header and real_driver.h.
#include "interpose/driver_variants.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "interpose/real_driver.h"

namespace poolcuda::driver {

namespace {

constexpr int kVariants = static_cast<int>(Variant::count);

struct Row {
  const char* symbol;
  const char* base;
  int version;
  bool per_thread;
  void* hook;  // the library's exported function of the same name
};

const Row kRows[kVariants] = {
#define POOLCUDA_ROW(symbol, base, version, per_thread) \
  {#symbol, base, version, per_thread, reinterpret_cast<void*>(&::symbol)},
    POOLCUDA_DRIVER_VARIANTS(POOLCUDA_ROW)
#undef POOLCUDA_ROW
};

struct Mapping {
  void* real = nullptr;
  int variant = 0;
};

std::atomic<bool> g_built{false};
std::mutex g_build_mutex;
std::atomic<void*> g_real[kVariants];
Mapping g_map[2 * kVariants];  // written once, before g_built is set
int g_map_size = 0;
__attribute__((tls_model("initial-exec"))) thread_local bool t_building = false;
// Whether this thread's fork holds g_build_mutex (its prepare handler took it).
__attribute__((tls_model("initial-exec"))) thread_local bool t_fork_holds_build = false;

void add(void* real, int variant) {
  for (int i = 0; i < g_map_size; ++i) {
    if (g_map[i].real == real) return;  // one driver function serving two variants: the first
  }
  g_map[g_map_size++] = {real, variant};
}

bool built() {
  if (g_built.load(std::memory_order_acquire)) return true;
  if (t_building || real_driver::resolver() == nullptr) return false;
  std::lock_guard<std::mutex> hold(g_build_mutex);
  if (g_built.load(std::memory_order_relaxed)) return true;
  t_building = true;
  for (int i = 0; i < kVariants; ++i) {
    const Row& row = kRows[i];
    void* resolved = real_driver::resolve(row.base, row.version, row.per_thread);
    void* exported = real_driver::symbol(row.symbol);
    g_real[i].store(resolved != nullptr ? resolved : exported, std::memory_order_relaxed);
    if (resolved != nullptr) add(resolved, i);
    if (exported != nullptr) add(exported, i);
  }
  t_building = false;
  g_built.store(true, std::memory_order_release);
  return true;
}

}  // namespace

void* real(Variant variant) {
  if (!built()) return nullptr;
  return g_real[static_cast<int>(variant)].load(std::memory_order_relaxed);
}

void* hook_for(void* fn) {
  if (fn == nullptr || !built()) return fn;
  for (int i = 0; i < g_map_size; ++i) {
    if (g_map[i].real == fn) return kRows[g_map[i].variant].hook;
  }
  return fn;
}

void before_fork() {
  // A signal handler that forks in the middle of this thread's own build keeps out: the mutex is
  // this thread's already, and the child finishes the build where the handler returns.
  if (t_building) return;
  g_build_mutex.lock();
  t_fork_holds_build = true;
}

void after_fork() {
  if (!t_fork_holds_build) return;
  t_fork_holds_build = false;
  g_build_mutex.unlock();
}

void* hook_for_symbol(const char* name, void* found) {
  for (const Row& row : kRows) {
    if (std::strcmp(row.symbol, name) == 0) return hook_for(found);
  }
  return found;
}

}  // namespace poolcuda::driver
