// Preload test: cudaMallocManaged from slabs (run with managed_slab:1M, so slabs fill and
// rewind quickly). Mixed sizes written from the host and from a stream keep their contents;
// every fresh allocation reads zero, recycled memory included; eight threads get disjoint
// memory; thousands of allocations reach the real cudaMallocManaged a handful of times;
// cudaMemAttachHost, oversize requests and managed:off reach the real call; a double free and
// an interior pointer are refused and change nothing; cudaDeviceReset forgets the slabs; the
// report has a managed section; a system without concurrent managed access is not pooled; a
// cudaMalloc short of memory gets it back from empty slabs. With the default slab size (a child),
// slabs turn over in windows (Note [Managed windows]) while freed memory is still being written
// by a lagging stream: no allocation ever sees those writes, and the stand-in sees no race.
// Under free_fence:sync (a child), a managed cudaFree is the barrier the real one is.
// cuMemGetAddressRange names a slab allocation's own bytes, not its slab's.
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "json_check.h"

namespace {

bool host_bytes(const void* ptr, std::size_t size, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(ptr);
  return std::all_of(bytes, bytes + size, [&](unsigned char b) { return b == value; });
}

std::uint64_t real_managed_calls() {
  return preload_test::on_stand_in() ? preload_test::counter("cudaMallocManaged") : 0;
}

void* managed(std::size_t size, unsigned int flags = cudaMemAttachGlobal) {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMallocManaged(&ptr, size, flags));
  CHECK(ptr != nullptr);
  CHECK_MSG(reinterpret_cast<std::uintptr_t>(ptr) % 256 == 0, "not 256-byte aligned");
  return ptr;
}

void contents_and_zero() {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t sizes[] = {1, 255, 512, 513, 4096, 10000, 65536, 300000};
  for (int round = 0; round < 20; ++round) {
    std::vector<void*> buffers;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      void* ptr = managed(sizes[i]);
      CHECK_MSG(host_bytes(ptr, sizes[i], 0), "a fresh allocation is not zero");
      const auto value = static_cast<unsigned char>(0x20 + i);
      if (i % 2 == 0) {
        std::memset(ptr, value, sizes[i]);  // from the host
      } else {
        CHECK_CUDA(cudaMemsetAsync(ptr, value, sizes[i], stream));  // from a stream
      }
      buffers.push_back(ptr);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      CHECK(host_bytes(buffers[i], sizes[i], static_cast<unsigned char>(0x20 + i)));
      CHECK(preload_test::device_bytes_equal(buffers[i], sizes[i],
                                             static_cast<unsigned char>(0x20 + i)));
    }
    for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
}

void threads_disjoint() {
  constexpr int kThreads = 8;
  std::vector<std::vector<std::pair<void*, std::size_t>>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const std::size_t size = 1 + (static_cast<std::size_t>(i) * 7919u + t) % 20000;
        void* ptr = managed(size);
        CHECK(host_bytes(ptr, size, 0));
        std::memset(ptr, t + 1, size);
        got[t].emplace_back(ptr, size);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<std::pair<std::uintptr_t, std::size_t>> all;
  for (int t = 0; t < kThreads; ++t) {
    for (auto [ptr, size] : got[t]) {
      CHECK_MSG(host_bytes(ptr, size, static_cast<unsigned char>(t + 1)), "overwritten");
      all.emplace_back(reinterpret_cast<std::uintptr_t>(ptr), size);
    }
  }
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) {
    CHECK_MSG(all[i - 1].first + all[i - 1].second <= all[i].first, "overlapping allocations");
  }
  for (auto& list : got) {
    for (auto [ptr, size] : list) CHECK_CUDA(cudaFree(ptr));
  }
}

void few_real_calls() {
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::uint64_t before = real_managed_calls();
  for (int i = 0; i < 5000; ++i) {
    void* ptr = managed(1 + (static_cast<std::size_t>(i) * 104729u) % 65536);
    CHECK_CUDA(cudaFree(ptr));
    if (i % 100 == 99) CHECK_CUDA(cudaDeviceSynchronize());  // a program's steps
  }
  if (preload_test::on_stand_in()) {
    // A slab rewinds once its fence passed, waited for at most kManagedFenceWaitMicros (2 ms);
    // under ThreadSanitizer on a loaded machine the stand-in's events passed later than that
    // now and then (7 slabs once in a CI-like run), and each such wait that ran out takes a new
    // slab. Either bound is far from the call per pair it guards against.
#if defined(__SANITIZE_THREAD__)
    constexpr std::uint64_t kMost = 16;
#else
    constexpr std::uint64_t kMost = 4;
#endif
    const std::uint64_t made = real_managed_calls() - before;
    CHECK_MSG(made <= kMost, std::to_string(made) + " real cudaMallocManaged for 5000 pairs");
  }
}

void passes_through() {
  if (!preload_test::on_stand_in()) return;
  std::uint64_t before = real_managed_calls();
  void* host = managed(4096, cudaMemAttachHost);
  CHECK(real_managed_calls() == before + 1);
  void* big = managed((1u << 20) + 1);  // larger than a slab
  CHECK(real_managed_calls() == before + 2);
  void* ptr = nullptr;
  ptr = host;
  CHECK_CUDA(cudaMallocManaged(&ptr, 0, cudaMemAttachGlobal));  // success with NULL, as in CUDA
  CHECK(ptr == nullptr);
  CHECK_RESULT(cudaMallocManaged(&ptr, 64, 0x40), cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(real_managed_calls() == before + 4);
  CHECK_CUDA(cudaFree(host));
  CHECK_CUDA(cudaFree(big));
}

void refused_frees() {
  char* a = static_cast<char*>(managed(3000));
  char* b = static_cast<char*>(managed(100));
  std::memset(a, 0x5a, 3000);
  std::memset(b, 0x6b, 100);
  CHECK_RESULT(cudaFree(a + 1), cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK_RESULT(cudaFree(a + 512), cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(host_bytes(a, 3000, 0x5a));
  CHECK_CUDA(cudaFree(a));
  CHECK_RESULT(cudaFree(a), cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(host_bytes(b, 100, 0x6b));
  CHECK_CUDA(cudaFree(b));
}

void device_reset_forgets() {
  void* old = managed(1000);
  CHECK_CUDA(cudaDeviceReset());
  void* fresh = managed(1000);
  CHECK(host_bytes(fresh, 1000, 0));
  std::memset(fresh, 1, 1000);
  CHECK_CUDA(cudaFree(fresh));
  (void)old;  // freed by the reset: its address may be handed out again
}

// Child: empty managed slabs hold most of a 64 MiB device; a cudaMalloc that needs their memory
// gets it (the slabs but the current one go back to the driver).
int child_out_of_memory() {
  std::vector<void*> buffers;
  for (int i = 0; i < 12; ++i) buffers.push_back(managed(4u << 20));  // three 16 MiB slabs
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  void* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, 40u << 20));
  CHECK_CUDA(cudaFree(device));
  std::printf("out of memory recovered\n");
  return 0;
}

// Child, default slab size, every stream operation slowed down so that the streams fall far
// behind the host: 1 KiB allocations are each written by one of two streams and freed at once,
// while the write is still queued, through several window ends. Every allocation reads as zero
// when it is handed out; eight allocations at the end of the third window are never written and
// kept: they must still read zero once the streams drain (a slab rewound before its writes were
// done would hand bytes a late write still lands on); only a few real slabs are made; and the
// stand-in's race detector sees nothing.
int child_windows() {
  cudaStream_t streams[2];
  for (cudaStream_t& stream : streams)
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t before = real_managed_calls();
  constexpr std::size_t kSize = 1024;
  constexpr int kWindow = 1024;  // allocations of kSize in a window of 1 MiB
  std::vector<void*> kept;
  for (int i = 0; i < 6 * kWindow; ++i) {
    void* ptr = managed(kSize);
    CHECK_MSG(host_bytes(ptr, kSize, 0), "a recycled allocation is not zero");
    if (i >= 3 * kWindow - 8 && i < 3 * kWindow) {
      kept.push_back(ptr);
      continue;
    }
    CHECK_CUDA(cudaMemsetAsync(ptr, 0xab, kSize, streams[i % 2]));
    CHECK_CUDA(cudaFree(ptr));  // the memset may still be queued
  }
  for (cudaStream_t stream : streams) CHECK_CUDA(cudaStreamSynchronize(stream));
  for (void* ptr : kept) {
    CHECK_MSG(host_bytes(ptr, kSize, 0), "a write queued before a free reached a new allocation");
    CHECK_CUDA(cudaFree(ptr));
  }
  const std::uint64_t made = real_managed_calls() - before;
  CHECK_MSG(made <= 4, std::to_string(made) + " real cudaMallocManaged for 6,144 pairs");
  CHECK_MSG(preload_test::counter("races") == 0, "the stand-in saw a race");
  for (cudaStream_t stream : streams) CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("windows turned over\n");
  return 0;
}

// Children: ten small allocations (one stays live), one passed through, then the end (where
// the exit report is checked).
int child(const char* mode) {
  const std::uint64_t before = real_managed_calls();
  for (int i = 0; i < 10; ++i) {
    void* a = managed(1000);
    std::memset(a, 1, 1000);
    if (i != 0) CHECK_CUDA(cudaFree(a));
  }
  CHECK_CUDA(cudaFree(managed(100, cudaMemAttachHost)));
  const std::uint64_t made = real_managed_calls() - before;
  std::printf("real managed calls: %llu (%s)\n", static_cast<unsigned long long>(made), mode);
  return 0;
}

}  // namespace

// Under free_fence:sync: what a stream wrote before a managed cudaFree is there for the host
// after it, as with the real cudaFree, which synchronizes the device.
int child_sync_barrier() {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t kSize = 1 << 20;
  void* written = managed(kSize);
  void* barrier = managed(4096);
  CHECK_CUDA(cudaMemsetAsync(written, 0x5a, kSize, stream));
  CHECK_CUDA(cudaFree(barrier));
  CHECK_MSG(host_bytes(written, kSize, 0x5a),
            "the stream's bytes were not all there after a managed cudaFree under free_fence:sync");
  CHECK_CUDA(cudaFree(written));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("barrier held\n");
  return 0;
}

// Note [Managed address ranges] in interpose/driver_hooks.cpp: a program that clears "the
// allocation" cuMemGetAddressRange names must not reach the neighbour.
void address_ranges() {
  using RangeFn = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  const auto range = preload_test::driver_entry<RangeFn>("cuMemGetAddressRange", 3020);
  auto* first = static_cast<unsigned char*>(managed(1000));
  auto* neighbour = static_cast<unsigned char*>(managed(1000));
  std::memset(neighbour, 7, 1000);
  const auto address = reinterpret_cast<CUdeviceptr>(first);
  for (const CUdeviceptr asked : {address, address + 999}) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    CHECK(range(&base, &size, asked) == CUDA_SUCCESS);
    CHECK_MSG(base == address && size == 1000,
              "cuMemGetAddressRange named " + std::to_string(size) + " bytes at another base");
    CHECK_CUDA(cudaMemset(reinterpret_cast<void*>(base), 0, size));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(host_bytes(neighbour, 1000, 7), "clearing the named range reached the neighbour");
  CHECK_CUDA(cudaFree(first));
  CUdeviceptr base = 0;
  CHECK(range(&base, nullptr, address) == CUDA_ERROR_NOT_FOUND);  // freed, as plainly
  CHECK_CUDA(cudaFree(neighbour));
}

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string mode = argv[1];
    if (mode == "out-of-memory") return child_out_of_memory();
    if (mode == "sync-barrier") return child_sync_barrier();
    if (mode == "windows") return child_windows();
    return child(argv[1]);
  }
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  contents_and_zero();
  threads_disjoint();
  few_real_calls();
  passes_through();
  refused_frees();
  address_ranges();

  // The report's managed section (JSON, at exit).
  preload_test::ChildResult report = preload_test::run_self(
      "report", {"POOLCUDA_CONF=managed_slab:1M,report_at_exit:1,report_format:json"});
  CHECK_MSG(report.status == 0, report.output);
  const std::size_t json_at = report.output.find("{\"pid\"");
  CHECK_MSG(json_at != std::string::npos, report.output);
  const std::string json =
      report.output.substr(json_at, report.output.find('\n', json_at) - json_at);
  CHECK_MSG(preload_test::JsonChecker(json).valid(), json);
  CHECK_MSG(json.find("\"managed\":{\"slab_size\":1048576,\"max_slabs\":64,\"live_allocations\":1,"
                      "\"issued_total\":10000,") != std::string::npos,
            json);
  CHECK_MSG(json.find("\"cuda_malloc_managed\":1}") != std::string::npos, json);
  CHECK_MSG(json.find("\"slabs_released\":0,\"slabs\":[{\"base\":\"0x") != std::string::npos,
            json);

  if (preload_test::on_stand_in()) {
    // managed:off, and a system without concurrent managed access: every request is real.
    for (const char* env : {"POOLCUDA_CONF=managed:off", "SIMCUDA_CONCURRENT_MANAGED=0"}) {
      preload_test::ChildResult plain = preload_test::run_self("plain", {env});
      CHECK_MSG(plain.status == 0 &&
                    plain.output.find("real managed calls: 11") != std::string::npos,
                std::string(env) + ": " + plain.output);
    }
    // Pooled: one slab and the cudaMemAttachHost request.
    preload_test::ChildResult pooled = preload_test::run_self("pooled", {});
    CHECK_MSG(pooled.output.find("real managed calls: 2") != std::string::npos, pooled.output);
    preload_test::ChildResult oom = preload_test::run_self(
        "out-of-memory", {"POOLCUDA_CONF=managed_slab:16M", "SIMCUDA_DEVICE_MEMORY=64M"});
    CHECK_MSG(oom.status == 0 && oom.output.find("recovered") != std::string::npos, oom.output);
    preload_test::ChildResult windows =
        preload_test::run_self("windows", {"POOLCUDA_CONF", "SIMCUDA_OP_DELAY_US=100"});
    CHECK_MSG(windows.status == 0 && windows.output.find("turned over") != std::string::npos,
              windows.output);
    preload_test::ChildResult barrier = preload_test::run_self(
        "sync-barrier", {"POOLCUDA_CONF=free_fence:sync", "SIMCUDA_OP_DELAY_US=50000"});
    CHECK_MSG(barrier.status == 0 && barrier.output.find("barrier held") != std::string::npos,
              barrier.output);
  }

  device_reset_forgets();
  std::printf("ok\n");
  return 0;
}
