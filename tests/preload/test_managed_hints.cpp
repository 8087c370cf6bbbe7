// Preload test: the calls that take a managed pointer treat a slab allocation as the runtime
// treats a managed allocation of its own (Note [Managed attach] in interpose/managed_hooks.cpp).
// cudaStreamAttachMemAsync accepts length 0 or the allocation's own size (never a part),
// cudaMemAdvise and cudaMemPrefetchAsync accept ranges inside the allocation and refuse ranges
// beyond it or in freed memory, the per-thread variants behave the same, an attach on a
// capturing stream is answered as for any managed allocation, cudaPointerGetAttributes says
// "managed" for live allocations and "unregistered" for freed ones, and no call changes a byte
// of the allocation or of its neighbours in the slab. A refused attach or prefetch gets the answer
// and last error the runtime gives the same bad range of its own memory, on every stream (an
// unknown or destroyed one included).
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "managed_check.h"

using managed_test::host_bytes;
using managed_test::location;
using managed_test::managed;
using managed_test::refused;

int main() {
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  int device = -1;
  CHECK_CUDA(cudaGetDevice(&device));
  const cudaMemLocation on_device = location(cudaMemLocationTypeDevice, device);
  const cudaMemLocation on_host = location(cudaMemLocationTypeHost, 0);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  // Neighbours: a, b and c come from the same slab, one after the other.
  char* a = managed(3000);
  char* b = managed(1000);
  char* c = managed(500);
  std::memset(a, 0x11, 3000);
  std::memset(b, 0x22, 1000);
  CHECK_CUDA(cudaFree(c));

  // Attach: the whole allocation (length 0 or its size, from its start), never a part.
  CHECK_CUDA(cudaStreamAttachMemAsync(stream, a, 3000, cudaMemAttachSingle));
  CHECK_CUDA(cudaStreamAttachMemAsync(stream, a, 0, cudaMemAttachHost));
  CHECK_CUDA(cudaStreamAttachMemAsync(stream, a, 0, cudaMemAttachGlobal));
  CHECK_CUDA(cudaStreamAttachMemAsync(stream, b, 1000, cudaMemAttachHost));
  CHECK_CUDA(cudaStreamAttachMemAsync(stream, b, 0, cudaMemAttachGlobal));
  refused(cudaStreamAttachMemAsync(stream, a, 1500, cudaMemAttachGlobal));
  refused(cudaStreamAttachMemAsync(stream, a, 4000, cudaMemAttachGlobal));
  refused(cudaStreamAttachMemAsync(stream, a, 0, 0x8));
  refused(cudaStreamAttachMemAsync(stream, c, 0, cudaMemAttachGlobal));  // freed

  // Advice and prefetches over ranges of the allocation; none beyond it, none in freed memory.
  CHECK_CUDA(cudaMemAdvise(a, 3000, cudaMemAdviseSetReadMostly, on_device));
  CHECK_CUDA(cudaMemAdvise(a, 3000, cudaMemAdviseUnsetReadMostly, on_device));
  CHECK_CUDA(cudaMemAdvise(a + 100, 2900, cudaMemAdviseSetPreferredLocation, on_device));
  CHECK_CUDA(cudaMemAdvise(b, 1000, cudaMemAdviseSetAccessedBy, on_host));
  refused(cudaMemAdvise(a, std::size_t{1} << 20, cudaMemAdviseSetReadMostly, on_device));
  refused(cudaMemAdvise(c, 500, cudaMemAdviseSetReadMostly, on_device));
  CHECK_CUDA(cudaMemPrefetchAsync(a, 3000, on_device, 0, stream));
  CHECK_CUDA(cudaMemPrefetchAsync(b + 500, 500, on_host, 0, stream));
  refused(cudaMemPrefetchAsync(a + 2000, std::size_t{1} << 20, on_device, 0, stream));
  refused(cudaMemPrefetchAsync(c, 500, on_host, 0, stream));
  // The real call still judges what it alone knows (here: a device that does not exist).
  CHECK_RESULT(cudaMemPrefetchAsync(a, 3000, location(cudaMemLocationTypeDevice, 999), 0, stream),
               cudaErrorInvalidDevice);
  cudaGetLastError();

  // The per-thread-default-stream variants, as a program built with --default-stream per-thread
  // calls them.
  using AttachFn = cudaError_t (*)(cudaStream_t, void*, std::size_t, unsigned int);
  using PrefetchFn =
      cudaError_t (*)(const void*, std::size_t, cudaMemLocation, unsigned int, cudaStream_t);
  auto attach_ptsz =
      reinterpret_cast<AttachFn>(::dlsym(RTLD_DEFAULT, "cudaStreamAttachMemAsync_ptsz"));
  auto prefetch_ptsz =
      reinterpret_cast<PrefetchFn>(::dlsym(RTLD_DEFAULT, "cudaMemPrefetchAsync_ptsz"));
  CHECK(attach_ptsz != nullptr && prefetch_ptsz != nullptr);
  CHECK_CUDA(attach_ptsz(nullptr, a, 3000, cudaMemAttachGlobal));
  refused(attach_ptsz(nullptr, a, 1, cudaMemAttachGlobal));
  CHECK_CUDA(prefetch_ptsz(b, 1000, on_device, 0, nullptr));
  refused(prefetch_ptsz(b, 2000, on_device, 0, nullptr));

  // A refused attach or prefetch gets the runtime's own answer and leaves it as the last error:
  // a slab range that is a part, runs past its allocation, is freed or lies in the padding after
  // one answers as such a range of the runtime's own memory does, with the same flags, location
  // and stream; an unknown or destroyed stream handle is refused first there (only the stand-in
  // is given such a handle).
  {
    constexpr std::size_t kOwn = std::size_t{2} << 20;  // > a slab
    char* own = managed(kOwn);
    char* gone = managed(kOwn);
    CHECK_CUDA(cudaFree(gone));
    char* padding = a + 3000;
    CHECK(b > padding);
    std::vector<cudaStream_t> streams = {stream, nullptr, cudaStreamLegacy};
    if (preload_test::on_stand_in()) {
      cudaStream_t destroyed = nullptr;
      CHECK_CUDA(cudaStreamCreate(&destroyed));
      CHECK_CUDA(cudaStreamDestroy(destroyed));
      streams.push_back(destroyed);
      streams.push_back(reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234}));
    }
    struct Case {
      char* theirs;
      std::size_t their_size;
      char* ours;
      std::size_t our_size;
      unsigned int flags;
      cudaMemLocation where;  // prefetch only
    };
    const cudaMemLocation no_device = location(cudaMemLocationTypeDevice, 999);
    const Case attaches[] = {
        {own + 1, kOwn - 1, a + 1, 2999, cudaMemAttachGlobal, on_device},  // a part
        {own, kOwn + 1, a, 3001, cudaMemAttachGlobal, on_device},          // past the end
        {gone, 0, c, 0, cudaMemAttachGlobal, on_device},                   // freed
        {gone, 0, padding, 0, cudaMemAttachHost, on_device},
        {own, 0, a, 0, 0x8, on_device},  // only the flags
        {own, kOwn + 1, a, 3001, 0x8, on_device},
    };
    const Case prefetches[] = {
        {own + kOwn - 1, 2, a + 2000, std::size_t{1} << 20, 0, on_device},  // past the end
        {gone, 500, c, 500, 0, on_host},                                    // freed
        {gone, 1, padding, 1, 0, on_device},
        {own + kOwn - 1, 2, a + 2000, std::size_t{1} << 20, 1, on_device},
        {gone, 500, c, 500, 0, no_device},
    };
    const auto same = [](const std::string& what, const auto& call) {
      const cudaError_t theirs = call(true);
      const cudaError_t their_last = cudaGetLastError();
      const cudaError_t ours = call(false);
      const cudaError_t our_last = cudaGetLastError();
      CHECK_MSG(theirs != cudaSuccess, what + " took a bad range");
      CHECK_MSG(theirs == ours && their_last == our_last,
                what + ": " + preload_test::error_text(theirs) + " vs " +
                    preload_test::error_text(ours) + ", last " +
                    preload_test::error_text(their_last) + " vs " +
                    preload_test::error_text(our_last));
    };
    for (std::size_t s = 0; s < streams.size(); ++s) {
      const std::string on = " on stream " + std::to_string(s) + ", case ";
      for (std::size_t i = 0; i < std::size(attaches); ++i) {
        const Case& k = attaches[i];
        same("attach" + on + std::to_string(i), [&](bool theirs) {
          return theirs ? cudaStreamAttachMemAsync(streams[s], k.theirs, k.their_size, k.flags)
                        : cudaStreamAttachMemAsync(streams[s], k.ours, k.our_size, k.flags);
        });
        same("attach_ptsz" + on + std::to_string(i), [&](bool theirs) {
          return theirs ? attach_ptsz(streams[s], k.theirs, k.their_size, k.flags)
                        : attach_ptsz(streams[s], k.ours, k.our_size, k.flags);
        });
      }
      for (std::size_t i = 0; i < std::size(prefetches); ++i) {
        const Case& k = prefetches[i];
        same("prefetch" + on + std::to_string(i), [&](bool theirs) {
          return theirs ? cudaMemPrefetchAsync(k.theirs, k.their_size, k.where, k.flags, streams[s])
                        : cudaMemPrefetchAsync(k.ours, k.our_size, k.where, k.flags, streams[s]);
        });
        same("prefetch_ptsz" + on + std::to_string(i), [&](bool theirs) {
          return theirs ? prefetch_ptsz(k.theirs, k.their_size, k.where, k.flags, streams[s])
                        : prefetch_ptsz(k.ours, k.our_size, k.where, k.flags, streams[s]);
        });
      }
    }
    CHECK_CUDA(cudaFree(own));
  }

  // Pointer attributes: managed memory while live, anywhere inside; unknown once freed.
  cudaPointerAttributes attributes{};
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, a + 2999));
  CHECK(attributes.type == cudaMemoryTypeManaged);
  CHECK(attributes.device == device);
  CHECK(attributes.devicePointer == a + 2999);
  CHECK(attributes.hostPointer == a + 2999);
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, c));
  CHECK(attributes.type == cudaMemoryTypeUnregistered);
  CHECK_RESULT(cudaPointerGetAttributes(nullptr, a), cudaErrorInvalidValue);
  cudaGetLastError();

  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(host_bytes(a, 3000, 0x11));
  CHECK(host_bytes(b, 1000, 0x22));

  // An attach on a capturing stream gets the answer a managed allocation of the runtime's own
  // gets (the stand-in refuses it and invalidates the capture).
  if (preload_test::on_stand_in()) {
    void* own = nullptr;
    CHECK_CUDA(cudaMallocManaged(&own, std::size_t{2} << 20, cudaMemAttachGlobal));  // > a slab
    cudaError_t answers[2];
    char* targets[2] = {static_cast<char*>(own), a};
    for (int i = 0; i < 2; ++i) {
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
      answers[i] = cudaStreamAttachMemAsync(stream, targets[i], 0, cudaMemAttachGlobal);
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
    }
    CHECK_MSG(answers[0] == answers[1], preload_test::error_text(answers[0]) + " vs " +
                                            preload_test::error_text(answers[1]));
    CHECK_CUDA(cudaFree(own));
  }

  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("ok\n");
  return 0;
}
