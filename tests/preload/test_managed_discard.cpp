// Preload test: a batch discard never reaches a slab allocation (Note [Managed discard] in
// interpose/managed_hooks.cpp). Two neighbours share a page of a slab; discarding one of them
// leaves both intact, whether alone, in a batch with a range outside the slabs (which is still
// discarded), through cudaMemDiscardAndPrefetchBatchAsync (slab ranges only prefetched) or
// through the per-thread variants. Slab ranges are checked as a prefetch checks its range, and a
// refused batch does nothing at all. A batch with only slab ranges gets the answer a batch of
// the runtime's own managed memory gets for its flags and stream, and a refused batch (an empty
// slab range, or one of freed slab memory) the answer the runtime gives the same batch of its
// own memory, on every stream, an unknown one included. On the stand-in, the real
// discard of the same range (asked of the runtime directly) poisons the neighbour: the damage
// the hook prevents (Note [Discard poison] in tests/simcuda/rt_managed.cpp).
#include <cstdint>

#include "managed_check.h"

namespace {

constexpr std::size_t kPage = 4096;
constexpr unsigned char kPoison = 0xDB;  // SIMCUDA_DISCARD_POISON

using managed_test::host_bytes;
using managed_test::location;
using managed_test::managed;
using managed_test::refused;

// A stand-in call counter; 0 on a real GPU, where the counts are not checked.
std::uint64_t calls(const char* name) {
  return preload_test::on_stand_in() ? preload_test::counter(name) : 0;
}

using DiscardFn = cudaError_t (*)(void**, std::size_t*, std::size_t, unsigned long long,
                                  cudaStream_t);
using BatchFn = cudaError_t (*)(void**, std::size_t*, std::size_t, cudaMemLocation*,
                                std::size_t*, std::size_t, unsigned long long, cudaStream_t);

struct Memory {
  char* a;    // 3000 bytes at the start of a slab
  char* b;    // 1000 bytes after it, on the same page
  char* own;  // larger than a slab: the runtime's own managed allocation
};

void fill(const Memory& m) {
  std::memset(m.a, 0x11, 3000);
  std::memset(m.b, 0x22, 1000);
  std::memset(m.own, 0x33, kPage);
}

// The slab neighbours hold what fill() wrote; the runtime's own allocation was discarded (on
// the stand-in, where that is visible) or not.
void expect(const Memory& m, cudaStream_t stream, bool own_discarded) {
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(host_bytes(m.a, 3000, 0x11));
  CHECK(host_bytes(m.b, 1000, 0x22));
  if (preload_test::on_stand_in()) {
    CHECK(host_bytes(m.own, kPage, own_discarded ? kPoison : 0x33));
  }
  fill(m);
}

}  // namespace

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  int device = -1;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Slabs exist only where every device has concurrent managed access (Note [Managed routing]),
  // as the batch calls require.
  int concurrent = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device));
  if (concurrent == 0) preload_test::skip("no concurrent managed access");

  Memory m{managed(3000), managed(1000), managed(std::size_t{2} << 20)};
  CHECK(reinterpret_cast<std::uintptr_t>(m.a) % kPage == 0);
  CHECK(m.b - m.a < static_cast<std::ptrdiff_t>(kPage));
  char* freed = managed(500);
  CHECK_CUDA(cudaFree(freed));
  fill(m);

  std::size_t one = 1;
  void* own_ptr = m.own;
  const cudaError_t probe = cudaMemDiscardBatchAsync(&own_ptr, &one, 1, 0, stream);
  if (probe == cudaErrorNotSupported || probe == cudaErrorCallRequiresNewerDriver) {
    preload_test::skip("no batch discard on this system");
  }
  CHECK_CUDA(probe);
  expect(m, stream, true);

  // A slab range alone: nothing reaches the driver, the call succeeds, nothing is lost.
  std::uint64_t discards = calls("cudaMemDiscardBatchAsync");
  void* b_ptr = m.b;
  std::size_t b_size = 1000;
  CHECK_CUDA(cudaMemDiscardBatchAsync(&b_ptr, &b_size, 1, 0, stream));
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(calls("cudaMemDiscardBatchAsync") == discards);
  expect(m, stream, false);

  // Mixed: the range outside the slabs is discarded, the slab ranges are not.
  void* mixed[3] = {m.a, m.own, m.b + 10};
  std::size_t sizes[3] = {3000, 100, 990};
  CHECK_CUDA(cudaMemDiscardBatchAsync(mixed, sizes, 3, 0, stream));
  if (preload_test::on_stand_in()) CHECK(calls("cudaMemDiscardBatchAsync") == discards + 1);
  expect(m, stream, true);

  // Discard and prefetch: slab ranges only prefetched, to their own locations.
  cudaMemLocation where[2] = {location(cudaMemLocationTypeDevice, device),
                              location(cudaMemLocationTypeHost, 0)};
  std::size_t firsts[2] = {0, 2};  // a and own to the device, b to the host
  const std::uint64_t prefetches = calls("cudaMemPrefetchBatchAsync");
  const std::uint64_t both = calls("cudaMemDiscardAndPrefetchBatchAsync");
  CHECK_CUDA(cudaMemDiscardAndPrefetchBatchAsync(mixed, sizes, 3, where, firsts, 2, 0, stream));
  if (preload_test::on_stand_in()) {
    CHECK(calls("cudaMemPrefetchBatchAsync") == prefetches + 1);
    CHECK(calls("cudaMemDiscardAndPrefetchBatchAsync") == both + 1);
  }
  expect(m, stream, true);
  // Only slab ranges: one prefetch, no discard.
  void* slab_only[2] = {m.a, m.b};
  std::size_t slab_sizes[2] = {3000, 1000};
  CHECK_CUDA(cudaMemDiscardAndPrefetchBatchAsync(slab_only, slab_sizes, 2, where, firsts, 1, 0,
                                                 stream));
  if (preload_test::on_stand_in()) {
    CHECK(calls("cudaMemPrefetchBatchAsync") == prefetches + 2);
    CHECK(calls("cudaMemDiscardAndPrefetchBatchAsync") == both + 1);
  }
  expect(m, stream, false);

  // A prefetch batch over slab ranges is the real call's, once its ranges are checked.
  CHECK_CUDA(cudaMemPrefetchBatchAsync(mixed, sizes, 3, where, firsts, 2, 0, stream));
  expect(m, stream, false);

  // Refused, and nothing done: a slab range beyond its allocation, in freed slab memory;
  // location indices that do not start at 0.
  discards = calls("cudaMemDiscardBatchAsync");
  void* bad_ptrs[2] = {m.own, m.a};
  std::size_t too_long[2] = {100, 3001};
  refused(cudaMemDiscardBatchAsync(bad_ptrs, too_long, 2, 0, stream));
  bad_ptrs[1] = freed;
  std::size_t small[2] = {100, 100};
  refused(cudaMemDiscardBatchAsync(bad_ptrs, small, 2, 0, stream));
  refused(cudaMemDiscardAndPrefetchBatchAsync(bad_ptrs, small, 2, where, firsts, 1, 0, stream));
  refused(cudaMemPrefetchBatchAsync(bad_ptrs, small, 2, where, firsts, 1, 0, stream));
  bad_ptrs[1] = m.b;
  std::size_t late_firsts[1] = {1};
  refused(
      cudaMemDiscardAndPrefetchBatchAsync(bad_ptrs, small, 2, where, late_firsts, 1, 0, stream));
  // The runtime answered the two discards, asked with every slab range replaced by one it
  // refuses, and discarded nothing (not even the range of its own allocation).
  if (preload_test::on_stand_in()) CHECK(calls("cudaMemDiscardBatchAsync") == discards + 2);
  expect(m, stream, false);

  // Only slab ranges, nothing to call: the answer a batch of the runtime's own memory gets.
  struct Case {
    unsigned long long flags;
    cudaStream_t stream;
  };
  const Case cases[] = {{0, stream}, {1, stream}, {0, cudaStreamLegacy}, {0, nullptr}};
  for (const Case& c : cases) {
    const cudaError_t theirs = cudaMemDiscardBatchAsync(&own_ptr, &one, 1, c.flags, c.stream);
    cudaGetLastError();
    const cudaError_t ours = cudaMemDiscardBatchAsync(&b_ptr, &one, 1, c.flags, c.stream);
    cudaGetLastError();
    CHECK_MSG(theirs == ours, preload_test::error_text(theirs) + " vs " +
                                  preload_test::error_text(ours));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  fill(m);

  // A refused batch gets the runtime's own answer, and leaves it as the last error: an empty
  // slab range (which the runtime refuses in a batch) or one of freed slab memory answers as an
  // empty range of the runtime's own allocation and one past its end do, on every stream.
  cudaStream_t streams[4] = {stream, cudaStreamLegacy, nullptr, stream};
  if (preload_test::on_stand_in()) {  // a handle never created: only the stand-in is asked
    streams[3] = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234});
  }
  struct Ranges {
    void* theirs;
    std::size_t their_size;
    void* ours;
    std::size_t our_size;
  };
  const Ranges ranges[] = {{m.own, 0, m.b, 0}, {m.own, (std::size_t{2} << 20) + 1, freed, 100}};
  for (cudaStream_t s : streams) {
    for (const Ranges& r : ranges) {
      void* their_ptrs[2] = {m.own, r.theirs};
      std::size_t their_sizes[2] = {100, r.their_size};
      void* our_ptrs[2] = {m.own, r.ours};
      std::size_t our_sizes[2] = {100, r.our_size};
      std::size_t one_location[1] = {0};
      const auto same = [&](const char* what, auto&& call) {
        const cudaError_t theirs = call(their_ptrs, their_sizes);
        const cudaError_t their_last = cudaGetLastError();
        const cudaError_t ours = call(our_ptrs, our_sizes);
        const cudaError_t our_last = cudaGetLastError();
        CHECK_MSG(theirs != cudaSuccess, std::string(what) + " took a bad range");
        CHECK_MSG(theirs == ours && their_last == our_last,
                  std::string(what) + ": " + preload_test::error_text(theirs) + " vs " +
                      preload_test::error_text(ours));
      };
      same("discard", [&](void** p, std::size_t* z) {
        return cudaMemDiscardBatchAsync(p, z, 2, 0, s);
      });
      same("discard alone", [&](void** p, std::size_t* z) {
        return cudaMemDiscardBatchAsync(p + 1, z + 1, 1, 0, s);
      });
      same("discard and prefetch", [&](void** p, std::size_t* z) {
        return cudaMemDiscardAndPrefetchBatchAsync(p, z, 2, where, one_location, 1, 0, s);
      });
      same("prefetch", [&](void** p, std::size_t* z) {
        return cudaMemPrefetchBatchAsync(p, z, 2, where, one_location, 1, 0, s);
      });
    }
  }
  expect(m, stream, false);

  // On a stream whose capture work on the legacy stream invalidated, a slab-only batch answers
  // as the runtime's own memory does (cudaErrorStreamCaptureInvalidated, left as the last
  // error); asking the stream for its device answered another error.
  cudaStream_t blocking = nullptr;
  CHECK_CUDA(cudaStreamCreate(&blocking));
  CHECK_CUDA(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal));
  (void)cudaMemsetAsync(m.own, 0, 10, cudaStreamLegacy);  // invalidates the capture
  (void)cudaGetLastError();
  {
    const cudaError_t theirs = cudaMemDiscardBatchAsync(&own_ptr, &one, 1, 0, blocking);
    const cudaError_t their_last = cudaGetLastError();
    const cudaError_t ours = cudaMemDiscardBatchAsync(&b_ptr, &one, 1, 0, blocking);
    const cudaError_t our_last = cudaGetLastError();
    CHECK_MSG(theirs == ours && their_last == our_last,
              "invalidated capture: " + preload_test::error_text(theirs) + " vs " +
                  preload_test::error_text(ours) + ", last " +
                  preload_test::error_text(their_last) + " vs " +
                  preload_test::error_text(our_last));
  }
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(blocking, &graph) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  CHECK_CUDA(cudaStreamDestroy(blocking));
  CHECK_CUDA(cudaDeviceSynchronize());
  fill(m);

  // The per-thread variants, with the per-thread default stream.
  auto discard_ptsz =
      reinterpret_cast<DiscardFn>(::dlsym(RTLD_DEFAULT, "cudaMemDiscardBatchAsync_ptsz"));
  auto both_ptsz = reinterpret_cast<BatchFn>(
      ::dlsym(RTLD_DEFAULT, "cudaMemDiscardAndPrefetchBatchAsync_ptsz"));
  CHECK(discard_ptsz != nullptr && both_ptsz != nullptr);
  CHECK_CUDA(discard_ptsz(&b_ptr, &b_size, 1, 0, nullptr));
  CHECK_CUDA(both_ptsz(mixed, sizes, 3, where, firsts, 2, 0, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  expect(m, stream, true);
  refused(discard_ptsz(bad_ptrs, too_long, 2, 0, nullptr));

  if (preload_test::on_stand_in()) {
    // The damage: the runtime's own discard of b reaches a, which shares its page.
    auto real_discard = preload_test::real<DiscardFn>("cudaMemDiscardBatchAsync");
    CHECK_CUDA(real_discard(&b_ptr, &b_size, 1, 0, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK(host_bytes(m.a, 3000, kPoison));
  }

  CHECK_CUDA(cudaFree(m.a));
  CHECK_CUDA(cudaFree(m.b));
  CHECK_CUDA(cudaFree(m.own));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}
