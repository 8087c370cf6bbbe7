// Preload test 12: free fences never touch an open capture. While a stream captures, the program
// frees more pooled buffers than one fence epoch holds (which would normally record fence
// events): no event is recorded anywhere (recording on the legacy stream while a blocking stream
// captures would invalidate that capture, and recording on the capturing stream would put the
// event into the graph), the capture ends valid and its graph runs. The buffers freed in the
// window belong to the graph until it is gone; after that the postponed fence is recorded by
// the next free and the freed memory is reused.
// With the argument `sync` (run under free_fence:sync) the frees during the capture must not
// synchronize the device either (that would invalidate the capture): the capture must still end
// valid and its graph run; the event and reuse counts of the default mode do not apply.
// A refused cudaFreeAsync (a double free) inside a global capture leaves the capture valid.
// Under `sync`, a free whose synchronize waits for a parked stream holds nothing the program's
// other calls need: another thread creates and destroys a stream meanwhile, as under plain CUDA;
// and a cudaFreeAsync does not wait for the parked stream at all.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda.h>

#include "check.h"

namespace {

bool sync_mode = false;

void run_case(const char* name, unsigned int flags) {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, flags));
  void* target = nullptr;
  void* after = nullptr;
  CHECK_CUDA(cudaMalloc(&target, 4096));
  CHECK_CUDA(cudaMalloc(&after, 1024));
  std::vector<void*> buffers(600);
  for (void*& ptr : buffers) CHECK_CUDA(cudaMalloc(&ptr, 1024));
  CHECK_CUDA(cudaDeviceSynchronize());

  const bool counted = preload_test::on_stand_in() && !sync_mode;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  // Counted from here: the begin may record the window's fence before the capture begins.
  std::uint64_t records = counted ? preload_test::counter("cudaEventRecord") : 0;
  CHECK_CUDA(cudaMemsetAsync(target, 0x6b, 4096, stream));
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  if (counted) {
    CHECK_MSG(preload_test::counter("cudaEventRecord") == records,
              std::string(name) + ": an event was recorded during the capture");
  }
  preload_test::launch_once(graph, stream);
  CHECK(preload_test::device_bytes_equal(target, 4096, 0x6b));
  // The graph is gone; CUDA tells the library so on a thread of its own, at once on the
  // stand-in: give it a moment.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // Capture over: the next free closes the overfull epoch with a fence, and the memory comes
  // back without new driver allocations.
  CHECK_CUDA(cudaFree(after));
  if (counted) {
    CHECK_MSG(preload_test::counter("cudaEventRecord") > records,
              std::string(name) + ": no fence after the capture");
  }
  std::uint64_t mallocs = counted ? preload_test::counter("cudaMalloc") : 0;
  for (void*& ptr : buffers) CHECK_CUDA(cudaMalloc(&ptr, 1024));
  if (counted) {
    CHECK_MSG(preload_test::counter("cudaMalloc") - mallocs <= 1,
              std::string(name) + ": freed memory was not reused");
  }
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(target));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaGetLastError());
  std::printf("%s: ok\n", name);
}

// A refused stream-ordered free inside a global capture answers cudaErrorInvalidValue and
// leaves the capture valid. The library raises the error with a real cudaFree of a host
// address, in relaxed mode: a GPU's runtime may judge the call unsafe under the capture before
// it looks at the pointer (the stand-in looks at the pointer first, so only a GPU tells).
void refused_free_in_capture() {
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* freed = nullptr;
  CHECK_CUDA(cudaMalloc(&freed, 1024));
  CHECK_CUDA(cudaFree(freed));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK_RESULT(cudaFreeAsync(freed, stream), cudaErrorInvalidValue);  // a double free
  CHECK_RESULT(cudaGetLastError(), cudaErrorInvalidValue);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CHECK_CUDA(cudaStreamIsCapturing(stream, &status));
  CHECK_MSG(status == cudaStreamCaptureStatusActive, "the refused free invalidated the capture");
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("refused free in a capture: ok\n");
}

// free_fence:sync: a free waits for the device, here for a stream parked until this thread
// opens its gate. Creating and destroying a stream meanwhile must not wait for that free, nor a
// cudaFreeAsync (the gate gives up by itself after 10 s; under plain CUDA both return at once).
void sync_free_beside_a_park() {
  cudaStream_t parked = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  void* buffer = nullptr;
  void* ordered = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, 4096));
  CHECK_CUDA(cudaMalloc(&ordered, 8192));
  preload_test::Gate gate;
  preload_test::park(parked, gate);
  std::atomic<bool> freeing{false};
  std::thread freer([&] {
    freeing.store(true);
    CHECK_CUDA(cudaFree(buffer));  // waits for the gate
  });
  while (!freeing.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // into its synchronize
  const auto start = std::chrono::steady_clock::now();
  cudaStream_t other = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  // Nor does a stream-ordered free wait for that thread's synchronize.
  CHECK_CUDA(cudaFreeAsync(ordered, other));
  CHECK_CUDA(cudaStreamDestroy(other));
  const auto waited = std::chrono::steady_clock::now() - start;
  gate.open.store(true);
  freer.join();
  CHECK_MSG(waited < std::chrono::seconds(5),
            "creating a stream, or a cudaFreeAsync, waited for another thread's free behind a "
            "parked stream");
  CHECK_CUDA(cudaStreamDestroy(parked));
  std::printf("sync free beside a park: ok\n");
}

// free_fence:sync: a cudaFreeAsync is no barrier (the plain one never waits for the device), so
// it returns while another stream is parked until this very thread opens its gate; pooled and
// managed memory alike, and past the number of frees the pools fence on streams of their own
// (the freeing stream is parked too, so none of them passes). (It synchronized the device, and
// hung until the gate gave up.)
void sync_free_async_beside_a_park() {
  cudaStream_t parked = nullptr;
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<void*> buffers(300);
  for (void*& buffer : buffers) CHECK_CUDA(cudaMalloc(&buffer, 4096));
  void* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&managed, 4096));
  CHECK_CUDA(cudaMemsetAsync(buffers[0], 1, 4096, stream));
  preload_test::Gate gate;
  preload_test::Gate stream_gate;
  preload_test::park(parked, gate);
  preload_test::park(stream, stream_gate);
  const auto start = std::chrono::steady_clock::now();
  for (void* buffer : buffers) CHECK_CUDA(cudaFreeAsync(buffer, stream));
  CHECK_CUDA(cudaFreeAsync(managed, stream));
  const auto waited = std::chrono::steady_clock::now() - start;
  gate.open.store(true);
  stream_gate.open.store(true);
  CHECK_MSG(waited < std::chrono::seconds(5), "a cudaFreeAsync waited for a parked stream");
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamSynchronize(parked));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaStreamDestroy(parked));
  std::printf("sync free async beside a park: ok\n");
}

// free_fence:sync: a cudaFreeAsync on a stream the library never saw created (the driver's own
// cuStreamCreate, as a library with its own runtime makes them) cannot be fenced on that stream,
// and the open epoch's fences do not wait for it: that free waits for the synchronize still, and
// a buffer written there is not handed out again while the write is under way.
void sync_free_async_on_an_unseen_stream() {
  using StreamCreate = CUresult (*)(CUstream*, unsigned int);
  CUstream unseen = nullptr;
  CHECK(preload_test::real_driver<StreamCreate>("cuStreamCreate")(&unseen, CU_STREAM_NON_BLOCKING) ==
        CUDA_SUCCESS);
  const auto stream = reinterpret_cast<cudaStream_t>(unseen);
  constexpr std::size_t kSize = 1 << 20;
  const bool counted = preload_test::on_stand_in();
  const std::uint64_t races_before = counted ? preload_test::counter("races") : 0;
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, kSize));
  CHECK_CUDA(cudaMemset(first, 0, kSize));
  preload_test::Gate gate;
  if (auto launch_access = preload_test::launch_access_function()) {
    CHECK(launch_access(stream, first, kSize, 1, &preload_test::wait_at_gate, &gate) ==
          cudaSuccess);
  } else {
    CHECK_CUDA(cudaLaunchHostFunc(stream, &preload_test::wait_at_gate, &gate));
  }
  CHECK_CUDA(cudaMemsetAsync(first, 0xaa, kSize, stream));  // queued behind the gate
  while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a long kernel's end
    gate.open.store(true);
  });
  CHECK_CUDA(cudaFreeAsync(first, stream));
  // New buffers until the freed one comes back, or enough to need it: each miss records fences,
  // which pass at once on every stream the library knows.
  std::vector<void*> taken;
  void* second = nullptr;
  for (int i = 0; i < 64 && second != first; ++i) {
    CHECK_CUDA(cudaMalloc(&second, kSize));
    CHECK_CUDA(cudaMemset(second, 0xbb, kSize));
    taken.push_back(second);
  }
  opener.join();
  CHECK_CUDA(cudaDeviceSynchronize());
  bool corrupted = false;
  for (void* buffer : taken) corrupted |= !preload_test::device_bytes_equal(buffer, kSize, 0xbb);
  CHECK_MSG(!corrupted,
            "a buffer freed on an unseen stream was handed out under that stream's write");
  if (counted) CHECK(preload_test::counter("races") == races_before);
  for (void* buffer : taken) CHECK_CUDA(cudaFree(buffer));

  // Managed memory, whose slab's fence does not cover that stream either: new allocations, each
  // freed again in stream order, until the address comes back or the write ends.
  constexpr std::size_t kManaged = 64 << 10;
  void* managed = nullptr;
  CHECK_CUDA(cudaMallocManaged(&managed, kManaged));
  CHECK_CUDA(cudaMemset(managed, 0, kManaged));
  preload_test::Gate managed_gate;
  if (auto launch_access = preload_test::launch_access_function()) {
    CHECK(launch_access(stream, managed, kManaged, 1, &preload_test::wait_at_gate,
                        &managed_gate) == cudaSuccess);
  } else {
    CHECK_CUDA(cudaLaunchHostFunc(stream, &preload_test::wait_at_gate, &managed_gate));
  }
  CHECK_CUDA(cudaMemsetAsync(managed, 0xaa, kManaged, stream));  // queued behind the gate
  while (!managed_gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread managed_opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    managed_gate.open.store(true);
  });
  CHECK_CUDA(cudaFreeAsync(managed, stream));
  void* again = nullptr;
  for (int i = 0; i < 20000 && again == nullptr && !managed_gate.open.load(); ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMallocManaged(&buffer, kManaged));
    CHECK_CUDA(cudaMemset(buffer, 0xbb, kManaged));
    if (buffer == managed) {
      again = buffer;
    } else {
      CHECK_CUDA(cudaFreeAsync(buffer, cudaStreamLegacy));
    }
  }
  managed_opener.join();
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(again == nullptr || preload_test::device_bytes_equal(again, kManaged, 0xbb),
            "managed memory freed on an unseen stream was handed out under that stream's write");
  if (again != nullptr) CHECK_CUDA(cudaFree(again));
  if (counted) CHECK(preload_test::counter("races") == races_before);
  using StreamDestroy = CUresult (*)(CUstream);
  CHECK(preload_test::real_driver<StreamDestroy>("cuStreamDestroy_v2")(unseen) == CUDA_SUCCESS);
  std::printf("sync free async on an unseen stream: ok\n");
}

}  // namespace

int main(int argc, char** argv) {
  sync_mode = argc > 1 && std::strcmp(argv[1], "sync") == 0;
  preload_test::require_preloaded();
  CHECK_CUDA(cudaFree(nullptr));
  run_case("non-blocking stream", cudaStreamNonBlocking);
  run_case("blocking stream", cudaStreamDefault);
  refused_free_in_capture();
  if (sync_mode) {
    sync_free_beside_a_park();
    sync_free_async_beside_a_park();
    sync_free_async_on_an_unseen_stream();
  }
  std::printf("ok\n");
  return 0;
}
