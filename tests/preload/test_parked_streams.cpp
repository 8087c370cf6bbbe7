// Preload test: an allocation never blocks on a stream the program parked. A program may park
// a stream on a host function that only it releases, later; the real cudaMalloc never waits on
// streams, so under the library cudaMalloc must not either.
//   release  An idle page goes back to the driver before a host function parks the legacy
//            stream (the real cudaFree of that page waits for every stream, so after the park
//            it could not); with the stream parked, 10,000 small allocations must still return.
//   give_back, give_back_callback, give_back_driver  Half the device freed before the park
//            (by cudaLaunchHostFunc, cudaStreamAddCallback, or the driver's cuLaunchHostFunc
//            reached through cudaGetDriverEntryPointByVersion), three quarters of it allocated
//            during it: the plain run's free reached the driver before the park, so the
//            allocation succeeds there, and must under the library too.
//   give_back_beside_capture  The same, while another thread's capture is open on a stream
//            of its own: the give-back was left out while any capture was open on the device,
//            and the allocation was refused after recovery's 10 seconds.
//   oom      Memory freed before the park, needed by an allocation after it: the free fence
//            must not queue behind the park (it is recorded at the free), so the allocation
//            succeeds as the plain one does.
//   oom_burst The same, but the free comes right after another one, so it waits in an open
//            epoch: the host function's hook records its fence before the park.
//   host_functions_beside_park  A buffer freed with cudaFreeAsync on a stream parked until
//            the end; then a loop on another stream allocates, launches a host function and
//            frees stream-ordered. The plain calls never wait for the parked free, and each
//            host function must not wait for it either (it would cost a second each). On the
//            stand-in the other stream's host functions also run during the park; CUDA may run
//            the host functions of all streams on one thread (docs/stand-in.md), so on a GPU
//            they run once the park ends and only the calls are timed.
//   refusal_bound  Memory freed behind a park that outlasts recovery's bound of 10 seconds,
//            needed by an allocation: the allocation is refused once, after that bound, not
//            after it twice (the retry through the driver waited for the same fence again).
//            (Plain CUDA's free would have blocked until the park ended.)
//   refusal_behind_stuck_release  Under free_fence:none, on a 2 GiB device of which 1 GiB is
//            taken, with two shards (two threads churned first): two 400 MiB buffers another
//            thread frees during the park are idle pages, which recovery gives back; their
//            driver free waits behind the park. A 600 MiB request is refused once, after
//            recovery's bound: the retry through CUDA waited for the same stuck free a second
//            time, in each shard (20 seconds).
//   free_async_loop  A loop that frees with cudaFreeAsync and then queues a host function on
//            the legacy stream keeps its page, as the plain loop makes no driver call.
//   free_async_room  But 5/8 of the device freed that way and synchronized before the park is
//            the driver's during it, for a cudaMallocPitch of the same size.
//   host_functions_behind_stuck_release  Beside a stream parked until the end, a loop frees
//            10 to 70 MB with cudaFreeAsync on another stream and queues a host function there:
//            once a give-back ran out behind the park, the later host functions do not wait;
//            a cudaMallocAsync that needs those pages still waits for them, and gets them
//            once the park ends.
//   pages_kept_behind_stuck_release  Beside a stream parked until the end, on a 96 MiB device,
//            rounds of 200 buffers of 64 KiB, each written on another stream that lags (a host
//            function sleeps first) and freed there with cudaFreeAsync, that stream
//            synchronized after each round. Every request fits what the rounds before gave back,
//            as under plain CUDA: once a give-back ran out behind the park, the pools keep their
//            idle pages (each host function used to queue them behind the stuck driver free,
//            out of everyone's reach: requests were refused by the ninth round).
// A watchdog fails the test instead of hanging; every gate opens by itself after ten seconds.
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "check.h"

namespace {

using preload_test::Gate;
using preload_test::wait_at_gate;

// Fails the test if `done` is not set within `seconds`, opening the gate first so that a real
// GPU is never left parked.
std::thread watchdog(std::atomic<bool>& done, Gate& gate, int seconds, const char* what) {
  return std::thread([&done, &gate, seconds, what] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!done.load()) {
      gate.open.store(true);
      preload_test::fail(__FILE__, __LINE__, std::string(what) + " blocked on a parked stream");
    }
  });
}

void CUDART_CB callback_at_gate(cudaStream_t, cudaError_t, void* data) { wait_at_gate(data); }

enum class Park { host_function, callback, driver };

void park_legacy_stream(Gate& gate, Park how = Park::host_function) {
  switch (how) {
    case Park::host_function:
      CHECK_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, &wait_at_gate, &gate));
      break;
    case Park::callback:
      CHECK_CUDA(cudaStreamAddCallback(cudaStreamLegacy, &callback_at_gate, &gate, 0));
      break;
    case Park::driver: {
      const auto launch =
          preload_test::driver_entry<decltype(&cuLaunchHostFunc)>("cuLaunchHostFunc", 10000);
      CHECK(launch(CU_STREAM_LEGACY, &wait_at_gate, &gate) == CUDA_SUCCESS);
      break;
    }
  }
  for (int i = 0; i < 10000 && !gate.entered.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(gate.entered.load());
}

void release_case() {
  void* big = nullptr;
  CHECK_CUDA(cudaMalloc(&big, 64 << 20));  // the exclusive pool: a page of its own
  CHECK_CUDA(cudaFree(big));
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::uint64_t frees_before =
      preload_test::on_stand_in() ? preload_test::counter("cudaFree") : 0;

  Gate gate;
  park_legacy_stream(gate);
  // The page reached the driver before the host function was passed on.
  if (preload_test::on_stand_in())
    CHECK_MSG(preload_test::counter("cudaFree") > frees_before,
              "the idle page was still pooled when the stream parked");
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 5, "cudaMalloc");
  // Past the exclusive pool's dealloc period (10,000 reservations).
  for (int i = 0; i < 10100; ++i) {
    void* small = nullptr;
    CHECK_CUDA(cudaMalloc(&small, 4096));
    CHECK_CUDA(cudaFree(small));
  }
  done.store(true);
  dog.join();
  gate.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("release: 10100 allocations with the legacy stream parked\n");
}

// Another thread's capture, open on a stream of its own from construction until end().
class CaptureBeside {
 public:
  CaptureBeside()
      : thread_([this] {
          cudaStream_t stream = nullptr;
          CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          void* captured = nullptr;
          CHECK_CUDA(cudaMalloc(&captured, 4096));
          CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          CHECK_CUDA(cudaMemsetAsync(captured, 3, 4096, stream));
          step_ = 1;
          while (step_.load() != 2) std::this_thread::yield();
          cudaGraph_t graph = nullptr;
          CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
          CHECK_CUDA(cudaGraphDestroy(graph));
          CHECK_CUDA(cudaFree(captured));
          CHECK_CUDA(cudaStreamDestroy(stream));
        }) {
    while (step_.load() != 1) std::this_thread::yield();
  }
  void end() {
    step_ = 2;
    thread_.join();
  }

 private:
  std::atomic<int> step_{0};  // 1: the capture is open; 2: it may end
  std::thread thread_;
};

// `beside_capture`: another thread's capture is open meanwhile.
void give_back_case(Park how, const char* name, bool beside_capture = false) {
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  void* half = nullptr;
  CHECK_CUDA(cudaMalloc(&half, free_bytes / 2));  // a page of its own
  CHECK_CUDA(cudaMemset(half, 1, 4096));
  CHECK_CUDA(cudaFree(half));

  std::optional<CaptureBeside> capture;
  if (beside_capture) capture.emplace();
  Gate gate;
  park_legacy_stream(gate, how);
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 5, "cudaMalloc");
  void* most = nullptr;
  const cudaError_t result = cudaMalloc(&most, free_bytes / 4 * 3);
  done.store(true);
  dog.join();
  gate.open.store(true);
  if (capture) capture->end();
  CHECK_RESULT(result, cudaSuccess);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemset(most, 7, 4096));
  CHECK(preload_test::device_bytes_equal(most, 4096, 7));
  CHECK_CUDA(cudaFree(most));
  std::printf("%s: memory freed before the park was allocated during it\n", name);
}

// `burst`: the free of the buffer needed later follows another free at once.
// Fills the device but for room for one 8 MiB buffer (kRoomSize) and a little more; returns
// the filler.
constexpr std::size_t kRoomSize = 8 << 20;
void* fill_but_room() {
  std::size_t free_bytes = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  void* filler = nullptr;
  CHECK_CUDA(cudaMalloc(&filler, free_bytes - 12 * (std::size_t{1} << 20)));
  return filler;
}

void oom_case(bool burst) {
  void* nudge = nullptr;
  CHECK_CUDA(cudaMalloc(&nudge, 4096));
  const std::size_t size = kRoomSize;
  void* filler = fill_but_room();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, size));
  CHECK_CUDA(cudaMemsetAsync(first, 1, 4096, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  // Let the fences of earlier frees age, so the next free is fenced at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (burst) CHECK_CUDA(cudaFree(nudge));
  CHECK_CUDA(cudaFree(first));
  if (!burst) CHECK_CUDA(cudaFree(nudge));

  Gate gate;
  park_legacy_stream(gate);
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 5, "out-of-memory recovery");
  void* second = nullptr;
  const cudaError_t result = cudaMalloc(&second, size);
  done.store(true);
  dog.join();
  gate.open.store(true);
  CHECK_RESULT(result, cudaSuccess);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemset(second, 7, 4096));
  CHECK(preload_test::device_bytes_equal(second, 4096, 7));
  CHECK_CUDA(cudaFree(second));
  CHECK_CUDA(cudaFree(filler));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("%s: memory freed before the park was reused after it\n",
              burst ? "oom_burst" : "oom");
}

}  // namespace

void host_functions_beside_park_case() {
  cudaStream_t parked = nullptr;
  cudaStream_t working = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&working, cudaStreamNonBlocking));
  void* held = nullptr;
  CHECK_CUDA(cudaMalloc(&held, 1 << 20));
  Gate gate;
  CHECK_CUDA(cudaLaunchHostFunc(parked, wait_at_gate, &gate));
  while (!gate.entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_CUDA(cudaFreeAsync(held, parked));  // waits for the park, as it does plainly
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 5, "ten host functions beside a parked free");
  for (int i = 0; i < 10; ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, 1 << 20));
    CHECK_CUDA(cudaMemsetAsync(buffer, 1, 1 << 20, working));
    CHECK_CUDA(cudaLaunchHostFunc(working, [](void*) {}, nullptr));
    CHECK_CUDA(cudaFreeAsync(buffer, working));
  }
  if (preload_test::on_stand_in()) CHECK_CUDA(cudaStreamSynchronize(working));
  done.store(true);
  dog.join();
  gate.open.store(true);
  CHECK_CUDA(cudaStreamSynchronize(working));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(parked));
  CHECK_CUDA(cudaStreamDestroy(working));
  std::printf("host_functions_beside_park: no host function waited for the parked free\n");
}

void noop(void*) {}

// A stream parked until the end, then a loop on another stream: an allocation of 10 to 70 MB,
// a cudaFreeAsync of it there and a host function there. Past a 64th of the device, the pages
// those frees left idle go to the driver before each host function, and their driver free
// waits behind the park. Each host function waited its whole second for them (16 took 15 s,
// against 0.01 s plainly); once the first give-back ran out behind the park, later ones must
// not wait for the pages queued after it (Note [Give-backs behind a stuck release]). Then a
// request that needs those pages still waits for them: the old rule made it fail at once.
void host_functions_behind_stuck_release_case() {
  cudaStream_t parked = nullptr;
  cudaStream_t working = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&working, cudaStreamNonBlocking));
  Gate gate;
  gate.limit_seconds = 30;
  preload_test::park(parked, gate);
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 6, "16 host functions beside a parked stream");
  for (int i = 0; i < 16; ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, std::size_t{10'000'000} * (1 + i % 7)));
    CHECK_CUDA(cudaFreeAsync(buffer, working));
    CHECK_CUDA(cudaLaunchHostFunc(working, noop, nullptr));
  }
  done.store(true);
  dog.join();
  // A request CUDA refuses still waits for those pages: the park ends 3 s later, and the pages
  // the driver then takes back serve it, as they serve the plain call's (900 MiB of the 1 GiB
  // device, 490 MiB of them behind the park).
  CHECK_CUDA(cudaStreamSynchronize(working));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    gate.open.store(true);
  });
  void* large = nullptr;
  const cudaError_t got = cudaMallocAsync(&large, std::size_t{900} << 20, working);
  opener.join();
  CHECK_MSG(got == cudaSuccess, "900 MiB after the park: " + preload_test::error_text(got));
  CHECK_CUDA(cudaFreeAsync(large, working));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(parked));
  CHECK_CUDA(cudaStreamDestroy(working));
  std::printf("host_functions_behind_stuck_release: one give-back waited at most\n");
}

void sleep_100_ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

void pages_kept_behind_stuck_release_case() {
  cudaStream_t parked = nullptr;
  cudaStream_t working = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&parked, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&working, cudaStreamNonBlocking));
  Gate gate;
  gate.limit_seconds = 30;
  preload_test::park(parked, gate);
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 20, "rounds of frees beside a parked stream");
  constexpr std::size_t kSize = 64 << 10;
  int refused = 0;
  for (int round = 0; round < 12; ++round) {
    CHECK_CUDA(cudaLaunchHostFunc(working, &sleep_100_ms, nullptr));
    for (int i = 0; i < 200; ++i) {
      void* buffer = nullptr;
      if (cudaMalloc(&buffer, kSize) != cudaSuccess) {
        ++refused;
        (void)cudaGetLastError();
        continue;
      }
      CHECK_CUDA(cudaMemsetAsync(buffer, round, kSize, working));
      CHECK_CUDA(cudaFreeAsync(buffer, working));
    }
    CHECK_CUDA(cudaStreamSynchronize(working));
  }
  done.store(true);
  dog.join();
  CHECK_MSG(refused == 0, std::to_string(refused) + " requests refused");
  gate.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(parked));
  CHECK_CUDA(cudaStreamDestroy(working));
  std::printf("pages_kept_behind_stuck_release: every request served\n");
}

// Each iteration allocates, writes, frees with cudaFreeAsync and queues a host function, all on
// the legacy stream: the plain cudaFreeAsync never goes to the driver, so the pools must not
// give the page back before every host function either (a driver free and a new page each
// time, and on a GPU a device synchronize).
void free_async_loop_case() {
  if (!preload_test::on_stand_in()) preload_test::skip("counts the stand-in's driver calls");
  const std::uint64_t mallocs = preload_test::counter("cudaMalloc");
  const std::uint64_t frees = preload_test::counter("cudaFree");
  for (int i = 0; i < 100; ++i) {
    void* buffer = nullptr;
    CHECK_CUDA(cudaMalloc(&buffer, 1 << 20));
    CHECK_CUDA(cudaMemsetAsync(buffer, i, 1 << 20, cudaStreamLegacy));
    CHECK_CUDA(cudaFreeAsync(buffer, cudaStreamLegacy));
    CHECK_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, &noop, nullptr));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::uint64_t grown = preload_test::counter("cudaMalloc") - mallocs;
  const std::uint64_t returned = preload_test::counter("cudaFree") - frees;
  CHECK_MSG(grown <= 2 && returned == 0, std::to_string(grown) + " driver allocations and " +
                                             std::to_string(returned) + " driver frees");
}

// Memory freed with cudaFreeAsync, its stream synchronized before the park: under plain CUDA it
// is the driver's again, so a cudaMallocPitch of most of the device during the park succeeds at
// once, and must under the library (which keeps pages such frees left idle only up to a 64th of
// the device).
void free_async_room_case() {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t big = total / 8 * 5;
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, big));
  CHECK_CUDA(cudaMemsetAsync(buffer, 1, big, cudaStreamLegacy));
  CHECK_CUDA(cudaFreeAsync(buffer, cudaStreamLegacy));
  CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  Gate gate;
  park_legacy_stream(gate);
  std::atomic<bool> done{false};
  std::thread dog = watchdog(done, gate, 5, "cudaMallocPitch");
  void* pitched = nullptr;
  std::size_t pitch = 0;
  const cudaError_t made = cudaMallocPitch(&pitched, &pitch, 1 << 20, big >> 20);
  done.store(true);
  dog.join();
  gate.open.store(true);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_MSG(made == cudaSuccess, std::string("cudaMallocPitch during the park: ") +
                                     cudaGetErrorName(made));
  CHECK_CUDA(cudaFree(pitched));
}

// Asks for `size` bytes during the park of `stream`, which `gate` ends once the answer came: the
// request must be refused, within recovery's bound of 10 seconds and not twice that, and served
// once the stream has passed the park. Destroys `stream`.
void refused_within_bound(std::size_t size, Gate& gate, cudaStream_t stream, const char* name) {
  const auto start = std::chrono::steady_clock::now();
  void* ptr = nullptr;
  const cudaError_t refused = cudaMalloc(&ptr, size);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  gate.open.store(true);
  CHECK_RESULT(refused, cudaErrorMemoryAllocation);
  cudaGetLastError();
  CHECK_MSG(waited < std::chrono::seconds(15),
            "the refusal took " + std::to_string(waited.count() / 1000) +
                " s, past recovery's bound of 10 s");
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMalloc(&ptr, size));  // what was freed before reached the pools or the driver
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("%s: refused after %lld ms\n", name, static_cast<long long>(waited.count()));
}

void refusal_bound_case() {
  const std::size_t size = kRoomSize;
  void* filler = fill_but_room();
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Gate gate;
  gate.limit_seconds = 30;
  preload_test::park(stream, gate);
  void* first = nullptr;
  CHECK_CUDA(cudaMalloc(&first, size));
  CHECK_CUDA(cudaMemsetAsync(first, 1, 4096, stream));  // behind the park
  CHECK_CUDA(cudaFree(first));
  refused_within_bound(size, gate, stream, "refusal_bound");
  CHECK_CUDA(cudaFree(filler));
}

void refusal_behind_stuck_release_case() {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const auto churn = [](unsigned seed) {
    std::vector<void*> live;
    for (int i = 0; i < 20000; ++i) {
      seed = seed * 1103515245u + 12345u;
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, 512 + (seed >> 8) % (64 << 10)));
      live.push_back(p);
      if (live.size() > 8) {
        CHECK_CUDA(cudaFree(live.front()));
        live.erase(live.begin());
      }
    }
    for (void* p : live) CHECK_CUDA(cudaFree(p));
  };
  std::thread first(churn, 1u), second(churn, 2u);  // two threads at once: a second shard
  first.join();
  second.join();
  void* filler = nullptr;
  CHECK_CUDA(cudaMalloc(&filler, std::size_t{1} << 30));
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 400 * kMiB));
  CHECK_CUDA(cudaMalloc(&b, 400 * kMiB));
  CHECK_CUDA(cudaMemset(a, 1, 4096));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Gate gate;
  gate.limit_seconds = 30;
  preload_test::park(stream, gate);
  // Plain CUDA's frees would wait for the park; the pools' return at once.
  std::thread freer([&] {
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
  });
  freer.join();
  refused_within_bound(600 * kMiB, gate, stream, "refusal_behind_stuck_release");
  CHECK_CUDA(cudaFree(filler));
}

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  CHECK(argc == 2);
  CHECK_CUDA(cudaFree(nullptr));
  const std::string which = argv[1];
  if (which == "release") release_case();
  else if (which == "oom") oom_case(false);
  else if (which == "oom_burst") oom_case(true);
  else if (which == "give_back") give_back_case(Park::host_function, "give_back");
  else if (which == "give_back_callback") give_back_case(Park::callback, "give_back_callback");
  else if (which == "give_back_driver") give_back_case(Park::driver, "give_back_driver");
  else if (which == "give_back_beside_capture")
    give_back_case(Park::host_function, "give_back_beside_capture", true);
  else if (which == "host_functions_beside_park") host_functions_beside_park_case();
  else if (which == "refusal_bound") refusal_bound_case();
  else if (which == "refusal_behind_stuck_release") refusal_behind_stuck_release_case();
  else if (which == "free_async_loop") free_async_loop_case();
  else if (which == "free_async_room") free_async_room_case();
  else if (which == "host_functions_behind_stuck_release")
    host_functions_behind_stuck_release_case();
  else if (which == "pages_kept_behind_stuck_release") pages_kept_behind_stuck_release_case();
  else preload_test::fail(__FILE__, __LINE__, "unknown case " + which);
  return 0;
}
