// poolcuda_replay_cuda: replays a trace through the CUDA runtime, linked to libcudart.so.13 by
// SONAME so LD_LIBRARY_PATH picks the stand-in or a GPU, and LD_PRELOAD may put libpoolcuda.so
// in front. Allocators:
//   cuda     cudaMalloc / cudaFree (whatever answers those symbols)
//   cub      CUB's CachingDeviceAllocator, default configuration
//   cub-bg2  CachingDeviceAllocator(2): bin growth 2, every size binned, no cache limit
//   async    cudaMallocAsync / cudaFreeAsync on the legacy stream, default pool's release
//            threshold at its maximum
// Meters come from the stand-in's counters (found with dlsym, absent on a GPU); on a GPU only
// `async` reports its pool's reserved bytes (cudaMemPoolAttrReservedMem*).
//
//   poolcuda_replay_cuda [--allocator NAME] [--label TEXT] TRACE_FILE
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <string>

#if POOLCUDA_BENCH_HAVE_CUB
#include <cub/util_allocator.cuh>
#endif

#include "tools/bench/replay_cli.h"

namespace poolcuda::bench {
namespace {

thread_local std::string t_failure;

bool check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  t_failure = std::string(what) + ": " + cudaGetErrorName(err);
  return false;
}

// The stand-in's counters, or nothing on a real runtime.
class StandInCounters {
 public:
  StandInCounters()
      : counter_(reinterpret_cast<Counter>(dlsym(RTLD_DEFAULT, "simcuda_counter"))),
        reset_(reinterpret_cast<Reset>(dlsym(RTLD_DEFAULT, "simcuda_reset_counters"))) {}

  bool present() const { return counter_ != nullptr && reset_ != nullptr; }
  void reset() const {
    if (present()) reset_();
  }
  void fill(Meters& m) const {
    if (!present()) return;
    m.reserved_now = counter_("live_bytes");
    m.reserved_peak = counter_("live_bytes_peak");
    m.driver_allocs = counter_("cudaMalloc") + counter_("cuMemAlloc");
    m.driver_frees = counter_("cudaFree") + counter_("cuMemFree");
    m.event_records = counter_("cudaEventRecord");
  }

 private:
  using Counter = std::uint64_t (*)(const char*);
  using Reset = void (*)();
  Counter counter_;
  Reset reset_;
};

class CudaBase : public ReplayAllocator {
 public:
  std::string failure() override { return t_failure; }
  // As make() does for the main thread before a single-thread replay; a failure shows at the
  // thread's first allocation, and leaves no error behind for it.
  void prepare_thread() override {
    if (cudaFree(nullptr) != cudaSuccess) cudaGetLastError();
  }
  void reset_meters() override {
    cudaDeviceSynchronize();
    counters_.reset();
  }
  Meters meters() override {
    cudaDeviceSynchronize();
    Meters m;
    counters_.fill(m);
    return m;
  }

 protected:
  StandInCounters counters_;
};

class PlainCuda final : public CudaBase {
 public:
  void* allocate(std::uint64_t size) override {
    void* p = nullptr;
    return check(cudaMalloc(&p, size), "cudaMalloc") ? p : nullptr;
  }
  bool release(void* p, std::uint64_t) override { return check(cudaFree(p), "cudaFree"); }
};

class AsyncCuda final : public CudaBase {
 public:
  bool setup(std::string& error) {
    int device = 0;
    std::uint64_t threshold = UINT64_MAX;
    if (!check(cudaGetDevice(&device), "cudaGetDevice") ||
        !check(cudaDeviceGetDefaultMemPool(&pool_, device), "cudaDeviceGetDefaultMemPool") ||
        !check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)")) {
      error = t_failure;
      return false;
    }
    return true;
  }
  void* allocate(std::uint64_t size) override {
    void* p = nullptr;
    return check(cudaMallocAsync(&p, size, nullptr), "cudaMallocAsync") ? p : nullptr;
  }
  bool release(void* p, std::uint64_t) override {
    return check(cudaFreeAsync(p, nullptr), "cudaFreeAsync");
  }
  void reset_meters() override {
    CudaBase::reset_meters();
    std::uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero);
  }
  Meters meters() override {
    Meters m = CudaBase::meters();
    std::uint64_t now = 0, high = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &now) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high) == cudaSuccess &&
        !m.reserved_peak) {
      m.reserved_now = now;
      m.reserved_peak = high;
    }
    cudaGetLastError();
    return m;
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

#if POOLCUDA_BENCH_HAVE_CUB
class Cub final : public CudaBase {
 public:
  explicit Cub(bool bin_growth_2)
      : cub_(bin_growth_2 ? std::make_unique<cub::CachingDeviceAllocator>(2u)
                          : std::make_unique<cub::CachingDeviceAllocator>()) {}
  // Left alive on purpose (still reachable, so no leak checker objects): its destructor returns
  // every cached block with one cudaFree each, seconds after a million-slice trace, outside
  // every figure; the process is ending anyway.
  ~Cub() override {
    [[maybe_unused]] static cub::CachingDeviceAllocator* volatile abandoned = nullptr;
    abandoned = cub_.release();
  }
  void* allocate(std::uint64_t size) override {
    void* p = nullptr;
    return check(cub_->DeviceAllocate(&p, size), "CachingDeviceAllocator::DeviceAllocate")
               ? p
               : nullptr;
  }
  bool release(void* p, std::uint64_t) override {
    return check(cub_->DeviceFree(p), "CachingDeviceAllocator::DeviceFree");
  }

 private:
  std::unique_ptr<cub::CachingDeviceAllocator> cub_;
};
#endif

std::unique_ptr<ReplayAllocator> make(const ReplayArgs& args, std::string& error) {
  // Context creation stays out of the figures.
  if (!check(cudaFree(nullptr), "cudaFree(NULL)")) {
    error = t_failure;
    return nullptr;
  }
  if (args.allocator == "cuda") return std::make_unique<PlainCuda>();
  if (args.allocator == "async") {
    auto async = std::make_unique<AsyncCuda>();
    if (!async->setup(error)) return nullptr;
    return async;
  }
#if POOLCUDA_BENCH_HAVE_CUB
  return std::make_unique<Cub>(args.allocator == "cub-bg2");
#else
  error = "this build has no CUB header (cub/util_allocator.cuh)";
  return nullptr;
#endif
}

}  // namespace
}  // namespace poolcuda::bench

int main(int argc, char** argv) {
  using namespace poolcuda::bench;
  return replay_main(argc, argv, "poolcuda_replay_cuda", {"cuda", "cub", "cub-bg2", "async"},
                     make);
}
