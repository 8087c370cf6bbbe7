// Memory: cudaMalloc alignment and capacity, cudaFree rules (NULL, double free, interior
// pointer, synchronizes first), pitched, managed (the batch prefetch and discard included),
// pinned host and stream-ordered allocation, cudaMemGetInfo, copies, memsets and pointer
// attributes, and a fork beside an allocating thread. Runs with a 1 GiB device.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_test.h"

using simtest::counter;
using simtest::stand_in;

TEST_CASE("cudaMalloc: 256-byte aligned, distinct, not heap pointers, counted") {
  if (stand_in()) stand_in()->reset_counters();
  std::vector<void*> ptrs;
  for (size_t size : {1, 255, 256, 257, 4096, 1 << 20}) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, size));
    REQUIRE(p != nullptr);
    CHECK_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    cudaPointerAttributes attr;
    CUDA_OK(cudaPointerGetAttributes(&attr, p));
    CHECK_EQ(attr.type, cudaMemoryTypeDevice);
    CHECK_EQ(attr.devicePointer, p);
    ptrs.push_back(p);
  }
  for (size_t i = 0; i < ptrs.size(); ++i)
    for (size_t j = i + 1; j < ptrs.size(); ++j) CHECK(ptrs[i] != ptrs[j]);
  if (stand_in()) {
    CHECK_EQ(counter("cudaMalloc"), 6u);
    CHECK_EQ(counter("live_allocations"), 6u);
    CHECK_EQ(counter("live_bytes"), 1u + 255 + 256 + 257 + 4096 + (1 << 20));
    CHECK_EQ(counter("no such counter"), UINT64_MAX);
  }
  for (void* p : ptrs) CUDA_OK(cudaFree(p));
  if (stand_in()) {
    CHECK_EQ(counter("cudaFree"), 6u);
    CHECK_EQ(counter("live_allocations"), 0u);
  }
  void* zero = reinterpret_cast<void*>(1);
  CUDA_OK(cudaMalloc(&zero, 0));
  CHECK_EQ(zero, nullptr);
  CHECK_EQ(cudaMalloc(nullptr, 16), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("live_bytes_peak: the most live bytes since the last counter reset" * STAND_IN_ONLY) {
  void* kept = nullptr;
  CUDA_OK(cudaMalloc(&kept, 1000));
  stand_in()->reset_counters();
  const uint64_t base = counter("live_bytes");
  CHECK_EQ(counter("live_bytes_peak"), base);  // a reset starts from what is live now
  void* a = nullptr;
  void* b = nullptr;
  CUDA_OK(cudaMalloc(&a, 3000));
  CUDA_OK(cudaMalloc(&b, 5000));
  CUDA_OK(cudaFree(a));
  void* c = nullptr;
  CUDA_OK(cudaMalloc(&c, 2000));  // live drops to base + 7000 and stays below the peak
  CHECK_EQ(counter("live_bytes"), base + 7000);
  CHECK_EQ(counter("live_bytes_peak"), base + 8000);
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaFree(c));
  CHECK_EQ(counter("live_bytes_peak"), base + 8000);  // frees never lower it
  stand_in()->reset_counters();
  CHECK_EQ(counter("live_bytes_peak"), base);
  CUDA_OK(cudaFree(kept));
}

TEST_CASE("capacity: allocations beyond it fail with cudaErrorMemoryAllocation") {
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  void* big = nullptr;
  CHECK_EQ(cudaMalloc(&big, total + (1 << 20)), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  SIM_SKIP_REST_UNLESS(stand_in(), "exact accounting is the stand-in's");
  CHECK_EQ(free_bytes, total);
  void* half = nullptr;
  CUDA_OK(cudaMalloc(&half, total / 2));
  size_t free_now = 0;
  CUDA_OK(cudaMemGetInfo(&free_now, &total));
  CHECK_EQ(free_now, total - total / 2);
  void* managed = nullptr;  // managed memory draws on the same capacity
  CHECK_EQ(cudaMallocManaged(&managed, total / 2 + (1 << 20)), cudaErrorMemoryAllocation);
  cudaGetLastError();
  void* rest = nullptr;
  CUDA_OK(cudaMalloc(&rest, free_now));
  CUDA_OK(cudaMemGetInfo(&free_now, &total));
  CHECK_EQ(free_now, 0u);
  void* one = nullptr;
  CHECK_EQ(cudaMalloc(&one, 1), cudaErrorMemoryAllocation);
  cudaGetLastError();
  CUDA_OK(cudaFree(rest));
  CUDA_OK(cudaFree(half));
  CUDA_OK(cudaMemGetInfo(&free_now, &total));
  CHECK_EQ(free_now, total);
}

TEST_CASE("cudaFree: NULL is a no-op, double free and interior pointers are refused") {
  CUDA_OK(cudaFree(nullptr));
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, 1024));
  CHECK_EQ(cudaFree(static_cast<char*>(p) + 256), cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_OK(cudaFree(p));
  CHECK_EQ(cudaFree(p), cudaErrorInvalidValue);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  int on_stack = 0;
  CHECK_EQ(cudaFree(&on_stack), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("cudaFree synchronizes the device before freeing") {
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, 4096));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic<bool> done{false};
  auto slow = [](void* flag) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    static_cast<std::atomic<bool>*>(flag)->store(true);
  };
  CUDA_OK(cudaLaunchHostFunc(s, slow, &done));
  CUDA_OK(cudaFree(p));
  CHECK(done.load());  // the non-blocking stream's work finished before cudaFree returned
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_CASE("memset and memcpy round trip through device memory") {
  const size_t n = 1 << 16;
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n));
  CUDA_OK(cudaMemset(d, 0x5a, n));
  std::vector<unsigned char> host(n, 0);
  CUDA_OK(cudaMemcpy(host.data(), d, n, cudaMemcpyDeviceToHost));
  CHECK_EQ(host[0], 0x5a);
  CHECK_EQ(host[n - 1], 0x5a);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 7);
  CUDA_OK(cudaMemcpy(d, host.data(), n, cudaMemcpyHostToDevice));
  void* d2 = nullptr;
  CUDA_OK(cudaMalloc(&d2, n));
  CUDA_OK(cudaMemcpy(d2, d, n, cudaMemcpyDeviceToDevice));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(cudaMemsetAsync(d, 0, n / 2, s));
  std::vector<unsigned char> back(n, 1);
  CUDA_OK(cudaMemcpyAsync(back.data(), d2, n, cudaMemcpyDefault, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(std::memcmp(back.data(), host.data(), n), 0);
  CUDA_OK(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
  CHECK_EQ(back[0], 0);
  CHECK_EQ(back[n / 2 - 1], 0);
  CHECK_EQ(back[n / 2], host[n / 2]);
  if (stand_in()) {  // bounds are the stand-in's check; a GPU may fault later instead
    CHECK_EQ(cudaMemset(d, 0, n + 1), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpy(back.data(), d, n + 256, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  }
  CHECK_EQ(cudaMemcpy(d, back.data(), n, static_cast<cudaMemcpyKind>(7)),
           cudaErrorInvalidMemcpyDirection);
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(d));
  CUDA_OK(cudaFree(d2));
}

TEST_CASE("cudaMallocPitch") {
  void* p = nullptr;
  size_t pitch = 0;
  CUDA_OK(cudaMallocPitch(&p, &pitch, 1000, 10));
  int align = 0;
  CUDA_OK(cudaDeviceGetAttribute(&align, cudaDevAttrTexturePitchAlignment, 0));
  CHECK(pitch >= 1000);
  CHECK_EQ(pitch % static_cast<size_t>(align), 0u);
  CUDA_OK(cudaMemset(p, 1, pitch * 10));
  CUDA_OK(cudaFree(p));
  // A row too wide to pad, and rows whose product wraps: refused, nothing allocated.
  void* q = nullptr;
  CHECK_EQ(cudaMallocPitch(&q, &pitch, SIZE_MAX, 2), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaMallocPitch(&q, &pitch, SIZE_MAX - 100, 1), cudaErrorMemoryAllocation);
  CHECK_EQ(cudaMallocPitch(&q, &pitch, size_t{1} << 40, size_t{1} << 30), cudaErrorMemoryAllocation);
  CHECK(q == nullptr);
  cudaGetLastError();
}

TEST_CASE("cudaMallocManaged: flags, host access, attributes") {
  if (stand_in()) stand_in()->reset_counters();
  int* m = nullptr;
  CUDA_OK(cudaMallocManaged(reinterpret_cast<void**>(&m), 4096, cudaMemAttachGlobal));
  CUDA_OK(cudaDeviceSynchronize());
  m[0] = 42;  // host-accessible
  m[1023] = 7;
  cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, m + 10));
  CHECK_EQ(attr.type, cudaMemoryTypeManaged);
  CHECK(attr.hostPointer != nullptr);
  // A refused call may write its pointer (a GPU's runtime clears it): never the live one's.
  void* refused = nullptr;
  CHECK_EQ(cudaMallocManaged(&refused, 64, 0x80), cudaErrorInvalidValue);
  cudaGetLastError();
  // Size 0 succeeds with NULL, as cudaMalloc(&p, 0) does.
  void* none = reinterpret_cast<void*>(1);
  CUDA_OK(cudaMallocManaged(&none, 0, cudaMemAttachGlobal));
  CHECK_EQ(none, nullptr);
  CHECK_EQ(m[0], 42);  // refused calls changed nothing
  void* host_attached = nullptr;
  CUDA_OK(cudaMallocManaged(&host_attached, 100, cudaMemAttachHost));
  if (stand_in()) CHECK_EQ(counter("cudaMallocManaged"), 4u);
  CUDA_OK(cudaFree(host_attached));
  CUDA_OK(cudaFree(m));
}

namespace {
cudaMemLocation location(cudaMemLocationType type, int id) {
  cudaMemLocation where{};
  where.type = type;
  where.id = id;
  return where;
}
}  // namespace

TEST_CASE("managed memory: attach, advise and prefetch check their arguments") {
  char* m = nullptr;
  CUDA_OK(cudaMallocManaged(reinterpret_cast<void**>(&m), 10000, cudaMemAttachGlobal));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  const cudaMemLocation device = location(cudaMemLocationTypeDevice, 0);
  const cudaMemLocation host = location(cudaMemLocationTypeHost, 0);
  const cudaMemLocation no_device = location(cudaMemLocationTypeDevice, 99);

  // Attach: the whole allocation, by length 0 or by its size; never a part of it.
  CUDA_OK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle));
  CUDA_OK(cudaStreamAttachMemAsync(s, m, 10000, cudaMemAttachHost));
  CUDA_OK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachGlobal));
  CHECK_EQ(cudaStreamAttachMemAsync(s, m, 5000, cudaMemAttachGlobal), cudaErrorInvalidValue);
  CHECK_EQ(cudaStreamAttachMemAsync(s, m, 0, 0x8), cudaErrorInvalidValue);
  // Advice over a range of the allocation.
  CUDA_OK(cudaMemAdvise(m, 10000, cudaMemAdviseSetReadMostly, device));
  CUDA_OK(cudaMemAdvise(m, 10000, cudaMemAdviseUnsetReadMostly, device));
  CUDA_OK(cudaMemAdvise(m + 100, 1000, cudaMemAdviseSetPreferredLocation, device));
  CUDA_OK(cudaMemAdvise(m, 10000, cudaMemAdviseSetAccessedBy, host));
  CHECK_EQ(cudaMemAdvise(m, 10000, cudaMemAdviseSetPreferredLocation, no_device),
           cudaErrorInvalidValue);
  CHECK_EQ(cudaMemAdvise(m, 10000, static_cast<cudaMemoryAdvise>(77), device),
           cudaErrorInvalidValue);
  // Prefetch, stream-ordered, to the device or the host.
  CUDA_OK(cudaMemPrefetchAsync(m, 10000, device, 0, s));
  CUDA_OK(cudaMemPrefetchAsync(m + 5000, 5000, host, 0, s));
  CHECK_EQ(cudaMemPrefetchAsync(m, 10000, device, 1, s), cudaErrorInvalidValue);
  CHECK_EQ(cudaMemPrefetchAsync(m, 10000, no_device, 0, s), cudaErrorInvalidDevice);
  cudaGetLastError();
  CUDA_OK(cudaStreamSynchronize(s));
  m[9999] = 1;  // nothing moved out of reach
  if (stand_in()) {
    // Ranges that leave the allocation and empty ranges (CUDA rounds ranges to pages, so a GPU
    // may accept a few bytes past the end).
    CHECK_EQ(cudaMemAdvise(m, 10001, cudaMemAdviseSetReadMostly, device), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemAdvise(m, 0, cudaMemAdviseSetReadMostly, device), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemPrefetchAsync(m + 1, 10000, device, 0, s), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemPrefetchAsync(m, 0, device, 0, s), cudaErrorInvalidValue);
    CHECK_EQ(cudaStreamAttachMemAsync(s, m + 1, 10000, cudaMemAttachGlobal),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaStreamAttachMemAsync(reinterpret_cast<cudaStream_t>(0x10), m, 0,
                                      cudaMemAttachGlobal),
             cudaErrorInvalidResourceHandle);
    // Device memory is no managed memory.
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, 4096));
    CHECK_EQ(cudaMemAdvise(d, 4096, cudaMemAdviseSetReadMostly, device), cudaErrorInvalidValue);
    CUDA_OK(cudaFree(d));
    // Attach refuses a capturing stream, and invalidates the capture.
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CHECK_EQ(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachGlobal),
             cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = nullptr;
    CHECK_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  }
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(m));
}

TEST_CASE("managed memory: batch prefetch and discard") {
  char* m = nullptr;
  CUDA_OK(cudaMallocManaged(reinterpret_cast<void**>(&m), 3 * SIMCUDA_MANAGED_PAGE,
                            cudaMemAttachGlobal));
  std::memset(m, 7, 3 * SIMCUDA_MANAGED_PAGE);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  cudaMemLocation where[2] = {location(cudaMemLocationTypeDevice, 0),
                              location(cudaMemLocationTypeHost, 0)};
  // Two ranges, one location each; then one location for both.
  void* ptrs[2] = {m, m + 2 * SIMCUDA_MANAGED_PAGE};
  size_t sizes[2] = {100, SIMCUDA_MANAGED_PAGE};
  size_t firsts[2] = {0, 1};
  CUDA_OK(cudaMemPrefetchBatchAsync(ptrs, sizes, 2, where, firsts, 2, 0, s));
  CUDA_OK(cudaMemPrefetchBatchAsync(ptrs, sizes, 2, where, firsts, 1, 0, s));
  // The batch calls take neither the legacy stream nor flags.
  CHECK_EQ(cudaMemPrefetchBatchAsync(ptrs, sizes, 2, where, firsts, 1, 0, cudaStreamLegacy),
           cudaErrorInvalidValue);
  CHECK_EQ(cudaMemDiscardBatchAsync(ptrs, sizes, 2, 1, s), cudaErrorInvalidValue);
  // Location indices start at 0, increase and stay below count.
  size_t unordered[2] = {1, 0};
  CHECK_EQ(cudaMemPrefetchBatchAsync(ptrs, sizes, 2, where, unordered, 2, 0, s),
           cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(m[0], 7);  // a prefetch changes no byte
  if (stand_in()) {
    // Note [Discard poison]: a discard reaches whole pages, its neighbours within them included.
    void* middle[1] = {m + SIMCUDA_MANAGED_PAGE + 10};
    size_t one[1] = {1};
    CUDA_OK(cudaMemDiscardBatchAsync(middle, one, 1, 0, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK_EQ(m[SIMCUDA_MANAGED_PAGE - 1], 7);
    CHECK_EQ(static_cast<unsigned char>(m[SIMCUDA_MANAGED_PAGE]), SIMCUDA_DISCARD_POISON);
    CHECK_EQ(static_cast<unsigned char>(m[2 * SIMCUDA_MANAGED_PAGE - 1]),
             SIMCUDA_DISCARD_POISON);
    CHECK_EQ(m[2 * SIMCUDA_MANAGED_PAGE], 7);
    // Discard and prefetch: the same poison; the prefetch restores nothing.
    CUDA_OK(cudaMemDiscardAndPrefetchBatchAsync(ptrs, sizes, 2, where, firsts, 2, 0, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK_EQ(static_cast<unsigned char>(m[0]), SIMCUDA_DISCARD_POISON);
    CHECK_EQ(static_cast<unsigned char>(m[3 * SIMCUDA_MANAGED_PAGE - 1]),
             SIMCUDA_DISCARD_POISON);
    // Refused batches change nothing: a range leaving its allocation, an empty range, device
    // memory, no range at all, missing locations.
    std::memset(m, 7, 3 * SIMCUDA_MANAGED_PAGE);
    size_t too_long[1] = {3 * SIMCUDA_MANAGED_PAGE + 1};
    size_t empty[1] = {0};
    void* start[1] = {m};
    CHECK_EQ(cudaMemDiscardBatchAsync(start, too_long, 1, 0, s), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemDiscardBatchAsync(start, empty, 1, 0, s), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemDiscardBatchAsync(start, one, 0, 0, s), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemDiscardAndPrefetchBatchAsync(start, one, 1, where, firsts, 0, 0, s),
             cudaErrorInvalidValue);
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, 4096));
    void* mixed[2] = {m, d};
    CUDA_OK(cudaMemDiscardBatchAsync(mixed, one, 1, 0, s));
    CUDA_OK(cudaStreamSynchronize(s));
    std::memset(m, 7, 3 * SIMCUDA_MANAGED_PAGE);
    size_t both[2] = {1, 1};
    CHECK_EQ(cudaMemDiscardBatchAsync(mixed, both, 2, 0, s), cudaErrorInvalidValue);
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK_EQ(m[0], 7);
    CUDA_OK(cudaFree(d));
    CHECK_EQ(counter("cudaMemDiscardBatchAsync"), 7u);
  }
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(m));
}

TEST_CASE("pinned host memory") {
  void* h = nullptr;
  CUDA_OK(cudaMallocHost(&h, 10000));
  std::memset(h, 3, 10000);
  cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, h));
  CHECK_EQ(attr.type, cudaMemoryTypeHost);
  CUDA_OK(cudaFreeHost(h));
  void* h2 = nullptr;
  CUDA_OK(cudaHostAlloc(&h2, 4096, cudaHostAllocDefault));
  CUDA_OK(cudaFreeHost(h2));
  int local = 0;
  CUDA_OK(cudaPointerGetAttributes(&attr, &local));
  CHECK_EQ(attr.type, cudaMemoryTypeUnregistered);
}

TEST_CASE("stream-ordered allocation") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  size_t free_before = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  void* p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 1 << 20, s));
  REQUIRE(p != nullptr);
  CUDA_OK(cudaMemsetAsync(p, 0, 1 << 20, s));
  CUDA_OK(cudaFreeAsync(p, s));
  CUDA_OK(cudaStreamSynchronize(s));
  if (stand_in()) {
    size_t free_after = 0;
    CUDA_OK(cudaMemGetInfo(&free_after, &total));
    CHECK_EQ(free_after, free_before);  // returned once the stream reached the free
  }
  if (stand_in()) {
    CHECK_EQ(cudaFreeAsync(reinterpret_cast<void*>(0x10), s), cudaErrorInvalidValue);
    cudaGetLastError();
  }
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_CASE("allocation from many threads") {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        void* p = nullptr;
        if (cudaMalloc(&p, 512 + i) != cudaSuccess || cudaMemset(p, i, 512) != cudaSuccess ||
            cudaFree(p) != cudaSuccess)
          failures.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  CHECK_EQ(failures.load(), 0);
  if (stand_in()) CHECK_EQ(counter("live_allocations"), 0u);
}

TEST_CASE("an operation reaching freed memory raises a sticky illegal address (stand-in)" *
          STAND_IN_ONLY) {
  if (!stand_in()) return;
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  void* p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 4096, a));
  CUDA_OK(cudaStreamSynchronize(a));
  simtest::Gate gate;
  CUDA_OK(cudaLaunchHostFunc(a, simtest::Gate::wait_fn, &gate));
  CUDA_OK(cudaMemsetAsync(p, 1, 4096, a));  // queued behind the gate
  gate.wait_entered();
  CUDA_OK(cudaFreeAsync(p, b));  // unordered with stream a: frees first
  CUDA_OK(cudaStreamSynchronize(b));
  gate.open();
  CHECK_EQ(cudaStreamSynchronize(a), cudaErrorIllegalAddress);
  CHECK_EQ(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
  stand_in()->set_sticky_error(cudaSuccess);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
}

// CUDA takes every access to cudaMallocAsync memory as complete at a cudaFree: the free returns
// while work on it is still queued (behind a closed gate here), which then reaches freed memory.
// An H200 answered such a program with cudaErrorIllegalAddress.
TEST_CASE("cudaFree of stream-ordered memory waits for nothing (stand-in)" * STAND_IN_ONLY) {
  if (!stand_in()) return;
  cudaStream_t a;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  void* p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 4096, a));
  simtest::Gate gate;
  CUDA_OK(cudaLaunchHostFunc(a, simtest::Gate::wait_fn, &gate));
  CUDA_OK(cudaMemsetAsync(p, 1, 4096, a));
  gate.wait_entered();
  CUDA_OK(cudaFree(p));  // would hang here if it waited for the gate
  gate.open();
  CHECK_EQ(cudaStreamSynchronize(a), cudaErrorIllegalAddress);
  stand_in()->set_sticky_error(cudaSuccess);
  CHECK_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  CUDA_OK(cudaStreamDestroy(a));
}

// A child forked while another thread allocates or frees can itself allocate (Note [Forks while
// another thread allocates] in memory.cpp): it never inherits the memory lock held. The other
// thread spends most of its time under that lock (64 MiB pages mapped and unmapped), so without
// the fork's wait most of these children hung.
TEST_CASE("a child forked beside an allocating thread allocates (stand-in)" * STAND_IN_ONLY) {
  if (!stand_in()) return;
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) {
      void* p = nullptr;
      if (cudaMalloc(&p, 64 << 20) == cudaSuccess) cudaFree(p);
    }
  });
  for (int i = 0; i < 20; ++i) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::alarm(10);  // a hang fails the case instead of the suite's timeout
      void* p = nullptr;
      ::_exit(cudaMalloc(&p, 4096) == cudaSuccess ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "child status ", status);
  }
  stop.store(true);
  churn.join();
}
