// Process-wide state of the stand-in: configuration from the environment, call counters, the
// per-thread current device and last error, the sticky error and error names.
// Depends only on core.h; knows nothing about streams or memory internals.
#include "core.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <thread>

namespace poolcuda::sim {
namespace {

// A delay in microseconds from the environment variable `name` (0 when unset); a malformed or
// too large value stops the process with a message naming the variable.
unsigned delay_from_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 0;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (end == v || *end != '\0' || n > 60'000'000) {
    std::fprintf(stderr, "simcuda: %s=%s: expected microseconds (0..6e7)\n", name, v);
    std::abort();
  }
  return static_cast<unsigned>(n);
}

Config load_config() {
  Config c;
  if (const char* v = std::getenv("SIMCUDA_DEVICES")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 64) {
      std::fprintf(stderr, "simcuda: SIMCUDA_DEVICES=%s: expected a count from 0 to 64\n", v);
      std::abort();
    }
    c.devices = static_cast<int>(n);
  }
  if (const char* v = std::getenv("SIMCUDA_DEVICE_MEMORY")) {
    if (!parse_size(v, &c.memory) || c.memory == 0) {
      std::fprintf(stderr,
                   "simcuda: SIMCUDA_DEVICE_MEMORY=%s: expected a byte count such as 512M or 16G\n",
                   v);
      std::abort();
    }
  }
  if (const char* v = std::getenv("SIMCUDA_CODE_BYTES")) {
    if (!parse_size(v, &c.code_bytes)) {
      std::fprintf(stderr,
                   "simcuda: SIMCUDA_CODE_BYTES=%s: expected a byte count such as 0 or 2M\n", v);
      std::abort();
    }
  }
  // CUDA's own variable. CUDA also takes DEFAULT (lazy since 12.2); the stand-in refuses it, as
  // its default is eager.
  if (const char* v = std::getenv("CUDA_MODULE_LOADING")) {
    if (std::strcmp(v, "LAZY") == 0) {
      c.lazy_loading = true;
    } else if (std::strcmp(v, "EAGER") != 0) {
      std::fprintf(stderr, "simcuda: CUDA_MODULE_LOADING=%s: expected LAZY or EAGER\n", v);
      std::abort();
    }
  }
  c.op_delay_us = delay_from_env("SIMCUDA_OP_DELAY_US");
  c.free_delay_us = delay_from_env("SIMCUDA_FREE_DELAY_US");
  c.freed_delay_us = delay_from_env("SIMCUDA_FREED_DELAY_US");
  c.lookup_delay_us = delay_from_env("SIMCUDA_LOOKUP_DELAY_US");
  c.refusal_delay_us = delay_from_env("SIMCUDA_REFUSAL_DELAY_US");
  c.destructor_delay_us = delay_from_env("SIMCUDA_DESTRUCTOR_DELAY_US");
  if (const char* v = std::getenv("SIMCUDA_STRICT")) c.strict = std::strcmp(v, "0") != 0 && *v;
  if (const char* v = std::getenv("SIMCUDA_REUSE_STREAM_HANDLES"))
    c.reuse_stream_handles = std::strcmp(v, "0") != 0 && *v;
  if (const char* v = std::getenv("SIMCUDA_GET_DEVICE_BINDS"))
    c.get_device_binds = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("SIMCUDA_CONCURRENT_MANAGED")) {
    c.concurrent_managed = std::strcmp(v, "0") != 0;
  }
  return c;
}

constexpr std::array<const char*, static_cast<size_t>(Counter::count_)> kCounterNames = {
    "races",         "cudaMalloc",      "cudaFree",
    "cudaMallocManaged", "cuMemAlloc",  "cuMemFree",
    "cudaEventRecord", "cudaStreamSynchronize", "cudaDeviceSynchronize",
    "cudaMemPrefetchBatchAsync", "cudaMemDiscardBatchAsync",
    "cudaMemDiscardAndPrefetchBatchAsync", "cuMemCreate", "cuMemRelease", "cuArrayCreate",
    "cuArrayDestroy", "cuMemAllocFromPoolAsync", "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy", "cuCtxSetLimit", "cuCtxGetLimit", "cuLaunchKernel", "cudaMemGetInfo"};

std::array<std::atomic<uint64_t>, static_cast<size_t>(Counter::count_)> g_counters{};
std::atomic<int> g_sticky{0};

struct ErrorRow {
  int code;
  const char* name;
};
constexpr ErrorRow kErrorNames[] = {
#include "error_names.inc"
};

struct ErrorText {
  int code;
  const char* text;
};
// The messages programs most often print; other codes fall back to their name.
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "no error"},
    {cudaErrorInvalidValue, "invalid argument"},
    {cudaErrorMemoryAllocation, "out of memory"},
    {cudaErrorInitializationError, "initialization error"},
    {cudaErrorInvalidDevice, "invalid device ordinal"},
    {cudaErrorInvalidDevicePointer, "invalid device pointer"},
    {cudaErrorInvalidResourceHandle, "invalid resource handle"},
    {cudaErrorIllegalState, "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "device not ready"},
    {cudaErrorIllegalAddress, "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "unspecified launch failure"},
    {cudaErrorNotSupported, "operation not supported"},
    {cudaErrorNoDevice, "no CUDA-capable device is detected"},
    {cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated,
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit,
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread,
     "attempt to terminate a thread-local capture sequence from another thread"},
};

}  // namespace

bool parse_size(const char* text, size_t* out) {
  if (!text || !*text) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(text, &end, 10);
  if (end == text || errno != 0 || text[0] == '-') return false;
  unsigned shift = 0;
  if (*end) {
    switch (*end) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      case 'T': case 't': shift = 40; break;
      default: return false;
    }
    ++end;
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'B' || *end == 'b') ++end;
    if (*end) return false;
  }
  if (shift && n > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(n << shift);
  return true;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

void free_latency() {
  if (config().free_delay_us)
    std::this_thread::sleep_for(std::chrono::microseconds(config().free_delay_us));
}

cudaError_t after_free(cudaError_t err) {
  if (err == cudaSuccess && config().freed_delay_us)
    std::this_thread::sleep_for(std::chrono::microseconds(config().freed_delay_us));
  return err;
}

void lookup_latency() {
  if (config().lookup_delay_us)
    std::this_thread::sleep_for(std::chrono::microseconds(config().lookup_delay_us));
}

cudaError_t after_refusal(cudaError_t err) {
  if (err == cudaErrorMemoryAllocation && config().refusal_delay_us)
    std::this_thread::sleep_for(std::chrono::microseconds(config().refusal_delay_us));
  return err;
}

void bump(Counter c) { g_counters[static_cast<size_t>(c)].fetch_add(1, std::memory_order_relaxed); }

uint64_t counter_value(const char* name) {
  if (!name) return UINT64_MAX;
  if (std::strcmp(name, "live_allocations") == 0) return mem_live_allocations();
  if (std::strcmp(name, "live_bytes") == 0) return mem_live_bytes();
  if (std::strcmp(name, "live_bytes_peak") == 0) return mem_live_bytes_peak();
  for (size_t i = 0; i < kCounterNames.size(); ++i)
    if (std::strcmp(name, kCounterNames[i]) == 0) return g_counters[i].load();
  return UINT64_MAX;
}

void reset_counters() {
  for (auto& c : g_counters) c.store(0);
  mem_reset_live_bytes_peak();
}

std::mutex& state_mutex() {
  static auto* m = new std::mutex;  // never destroyed: worker threads outlive static destructors
  return *m;
}

int& current_device() {
  thread_local int device = 0;
  return device;
}

cudaError_t sticky_error() { return static_cast<cudaError_t>(g_sticky.load()); }
void set_sticky_error(cudaError_t e) { g_sticky.store(e); }

cudaError_t& last_error() {
  thread_local cudaError_t e = cudaSuccess;
  return e;
}

cudaError_t record_error(cudaError_t e) {
  // cudaErrorNotReady is a status, not an error: it never becomes the last error.
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error() = e;
  return e;
}

const char* error_name(int code) {
  for (const auto& row : kErrorNames)
    if (row.code == code) return row.name;
  return nullptr;
}

const char* error_string(int code) {
  for (const auto& row : kErrorTexts)
    if (row.code == code) return row.text;
  return error_name(code);
}

bool valid_device(int device) { return device >= 0 && device < config().devices; }

}  // namespace poolcuda::sim

extern "C" __attribute__((visibility("default"))) int simcuda_unsupported(const char* name) {
  std::fprintf(stderr, "simcuda: %s is not supported by the CUDA stand-in\n", name);
  return 801;  // cudaErrorNotSupported == CUDA_ERROR_NOT_SUPPORTED
}

// The runtime's fallbacks: a failing runtime call also leaves its error in the thread's slot.
extern "C" __attribute__((visibility("default"))) int simcuda_runtime_unsupported(
    const char* name) {
  poolcuda::sim::record_error(cudaErrorNotSupported);
  return simcuda_unsupported(name);
}

namespace {
__attribute__((destructor)) void simcuda_at_exit() { poolcuda::sim::race_report_at_exit(); }
}  // namespace
