// Preload test: the calls that take a managed pointer treat a slab allocation as the runtime
// treats a managed allocation of its own (Note [Managed attach] in interpose/managed_hooks.cpp).
// cudaStreamAttachMemAsync accepts length 0 or the allocation's own size (never a part),
// cudaMemAdvise and cudaMemPrefetchAsync accept ranges inside the allocation and refuse ranges
// beyond it or in freed memory, the per-thread variants behave the same, an attach on a
// capturing stream is answered as for any managed allocation, cudaPointerGetAttributes says
// "managed" for live allocations and "unregistered" for freed ones, and no call changes a byte
// of the allocation or of its neighbours in the slab.
#include <algorithm>
#include <cstdint>

#include "check.h"

namespace {

bool host_bytes(const void* ptr, std::size_t size, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(ptr);
  return std::all_of(bytes, bytes + size, [&](unsigned char b) { return b == value; });
}

char* managed(std::size_t size) {
  void* ptr = nullptr;
  CHECK_CUDA(cudaMallocManaged(&ptr, size, cudaMemAttachGlobal));
  return static_cast<char*>(ptr);
}

cudaMemLocation location(cudaMemLocationType type, int id) {
  cudaMemLocation where{};
  where.type = type;
  where.id = id;
  return where;
}

void refused(cudaError_t result) {
  CHECK_RESULT(result, cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

}  // namespace

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
