// Streams and events: asynchronous in-order execution, cudaStreamQuery, the legacy default
// stream's ordering against blocking streams (and not non-blocking ones), the per-thread default
// stream, cudaStreamWaitEvent, host functions, stream creation variants, and event
// create/record/query/synchronize/elapsed/destroy. Streams are parked on a Gate so that every
// ordering check is deterministic.
#include "sim_test.h"

using simtest::Gate;
using simtest::Recorder;
using simtest::Tag;

TEST_CASE("a stream runs its work asynchronously and in order") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  Gate gate;
  Recorder rec;
  Tag tags[3] = {{&rec, 1}, {&rec, 2}, {&rec, 3}};
  CUDA_OK(cudaLaunchHostFunc(s, Gate::wait_fn, &gate));
  for (auto& t : tags) CUDA_OK(cudaLaunchHostFunc(s, Tag::fn, &t));
  gate.wait_entered();
  CHECK_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  CHECK_EQ(cudaGetLastError(), cudaSuccess);  // not-ready is not an error
  CHECK(rec.get().empty());
  gate.open();
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(rec.get(), std::vector<int>{1, 2, 3});
  CUDA_OK(cudaStreamQuery(s));
  CUDA_OK(cudaStreamDestroy(s));
  if (simtest::stand_in()) {  // a destroyed handle is undefined behaviour on the real runtime
    CHECK_EQ(cudaLaunchHostFunc(s, Tag::fn, &tags[0]), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
  }
}

// Note [No host function beside a parked one]: CUDA may run the host functions of independent
// streams one at a time ("may be serialized"), so while a Gate holds one stream inside a host
// function, a host function on another stream may never start on a real GPU. Where a check needs
// another stream to make progress meanwhile, that stream gets device work (a memset) instead.

TEST_CASE("the legacy stream orders against blocking streams, not non-blocking ones") {
  cudaStream_t blocking, nonblocking;
  CUDA_OK(cudaStreamCreate(&blocking));
  CUDA_OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, 4096));
  Recorder rec;
  Tag legacy_tag{&rec, 1}, blocking_tag{&rec, 2};

  // Work on the legacy stream waits for a parked blocking stream...
  Gate gate;
  CUDA_OK(cudaLaunchHostFunc(blocking, Gate::wait_fn, &gate));
  gate.wait_entered();
  CUDA_OK(cudaLaunchHostFunc(cudaStreamLegacy, Tag::fn, &legacy_tag));
  // ... and a non-blocking stream does not wait for the legacy stream (device work: see Note
  // [No host function beside a parked one]).
  CUDA_OK(cudaMemsetAsync(buf, 0, 4096, nonblocking));
  CUDA_OK(cudaStreamSynchronize(nonblocking));
  CHECK(rec.get().empty());
  CHECK_EQ(cudaStreamQuery(cudaStreamLegacy), cudaErrorNotReady);
  gate.open();
  CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
  CHECK_EQ(rec.get(), std::vector<int>{1});

  // A blocking stream waits for prior legacy work.
  Gate gate2;
  CUDA_OK(cudaLaunchHostFunc(0, Gate::wait_fn, &gate2));
  gate2.wait_entered();
  CUDA_OK(cudaLaunchHostFunc(blocking, Tag::fn, &blocking_tag));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_EQ(cudaStreamQuery(blocking), cudaErrorNotReady);
  gate2.open();
  CUDA_OK(cudaStreamSynchronize(blocking));
  CHECK_EQ(rec.get(), (std::vector<int>{1, 2}));
  CUDA_OK(cudaFree(buf));
  CUDA_OK(cudaStreamDestroy(blocking));
  CUDA_OK(cudaStreamDestroy(nonblocking));
}

TEST_CASE("the per-thread default stream: one per thread, blocking w.r.t. the legacy stream") {
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, 4096));
  Recorder rec;
  Tag b{&rec, 2};
  Gate gate;
  CUDA_OK(cudaLaunchHostFunc(cudaStreamPerThread, Gate::wait_fn, &gate));
  gate.wait_entered();
  // Another thread's per-thread stream is a different stream: not held by our gate (device
  // work: see Note [No host function beside a parked one]).
  cudaError_t other = cudaErrorUnknown;
  std::thread([&] {
    other = cudaMemsetAsync(buf, 0, 4096, cudaStreamPerThread);
    if (other == cudaSuccess) other = cudaStreamSynchronize(cudaStreamPerThread);
  }).join();
  CHECK_EQ(other, cudaSuccess);
  CHECK_EQ(cudaStreamQuery(cudaStreamPerThread), cudaErrorNotReady);  // ours is still parked
  // The legacy stream waits for our per-thread stream.
  CUDA_OK(cudaLaunchHostFunc(cudaStreamLegacy, Tag::fn, &b));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(rec.get().empty());
  gate.open();
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(rec.get(), std::vector<int>{2});
  unsigned flags = 99;
  CUDA_OK(cudaStreamGetFlags(cudaStreamPerThread, &flags));
  CHECK_EQ(flags, 0u);
  CUDA_OK(cudaFree(buf));
}

TEST_CASE("stream creation variants and attributes") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned flags = 0;
  CUDA_OK(cudaStreamGetFlags(s, &flags));
  CHECK_EQ(flags, static_cast<unsigned>(cudaStreamNonBlocking));
  CUDA_OK(cudaStreamDestroy(s));
  int least = 0, greatest = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_OK(cudaStreamCreateWithPriority(&s, cudaStreamDefault, greatest));
  int priority = 1;
  CUDA_OK(cudaStreamGetPriority(s, &priority));
  CHECK_EQ(priority, greatest);
  CUDA_OK(cudaStreamDestroy(s));
  CHECK_EQ(cudaStreamCreateWithFlags(&s, 0x40), cudaErrorInvalidValue);
  CHECK_EQ(cudaStreamCreate(nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_CASE("cudaStreamWaitEvent orders one stream after another's recorded point") {
  cudaStream_t producer, consumer;
  CUDA_OK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  Recorder rec;
  Tag first{&rec, 1}, second{&rec, 2}, after{&rec, 3};
  Gate gate;
  CUDA_OK(cudaLaunchHostFunc(producer, Gate::wait_fn, &gate));
  CUDA_OK(cudaLaunchHostFunc(producer, Tag::fn, &first));
  CUDA_OK(cudaEventRecord(ev, producer));
  CUDA_OK(cudaLaunchHostFunc(producer, Tag::fn, &after));  // after the record: not waited for
  CUDA_OK(cudaStreamWaitEvent(consumer, ev, 0));
  CUDA_OK(cudaLaunchHostFunc(consumer, Tag::fn, &second));
  gate.wait_entered();
  CHECK_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  CHECK_EQ(cudaStreamQuery(consumer), cudaErrorNotReady);
  gate.open();
  CUDA_OK(cudaStreamSynchronize(consumer));
  auto order = rec.get();
  REQUIRE(order.size() >= 2);
  CHECK_EQ(order[0], 1);
  CUDA_OK(cudaEventSynchronize(ev));
  CUDA_OK(cudaEventQuery(ev));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaEventDestroy(ev));
  CUDA_OK(cudaStreamDestroy(producer));
  CUDA_OK(cudaStreamDestroy(consumer));
}

TEST_CASE("events: never recorded, elapsed time, flags, destroy") {
  cudaEvent_t start, stop, untimed;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
  CUDA_OK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
  CUDA_OK(cudaEventQuery(start));  // a never-recorded event counts as complete
  CUDA_OK(cudaEventSynchronize(start));
  float ms = -1;
  CHECK_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CUDA_OK(cudaEventRecord(start, s));
  auto sleep20 = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  CUDA_OK(cudaLaunchHostFunc(s, sleep20, nullptr));
  CUDA_OK(cudaEventRecord(stop, s));
  CUDA_OK(cudaEventRecord(untimed, s));
  CUDA_OK(cudaEventSynchronize(stop));
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(ms >= 15.0f);
  CHECK(ms < 5000.0f);
  CHECK_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  CHECK_EQ(cudaEventCreateWithFlags(&untimed, 0x100), cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  CUDA_OK(cudaEventDestroy(untimed));
  CUDA_OK(cudaStreamDestroy(s));
}

TEST_CASE("counters count event records and synchronizations" * STAND_IN_ONLY) {
  if (!simtest::stand_in()) return;
  simtest::stand_in()->reset_counters();
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreate(&ev));
  CUDA_OK(cudaEventRecord(ev, 0));
  CUDA_OK(cudaEventRecord(ev, cudaStreamPerThread));
  CUDA_OK(cudaStreamSynchronize(0));
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(simtest::counter("cudaEventRecord"), 2u);
  CHECK_EQ(simtest::counter("cudaStreamSynchronize"), 1u);
  CHECK_EQ(simtest::counter("cudaDeviceSynchronize"), 1u);
  CUDA_OK(cudaEventDestroy(ev));
}

TEST_CASE("a stream destroyed with queued work still runs it") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  Gate gate;
  Recorder rec;
  Tag t{&rec, 9};
  CUDA_OK(cudaLaunchHostFunc(s, Gate::wait_fn, &gate));
  CUDA_OK(cudaLaunchHostFunc(s, Tag::fn, &t));
  CUDA_OK(cudaStreamDestroy(s));
  gate.open();
  CUDA_OK(cudaDeviceSynchronize());
  CHECK_EQ(rec.get(), std::vector<int>{9});
}

TEST_CASE("cudaStreamAddCallback runs in order with the stream and status") {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  struct Seen {
    cudaStream_t stream = nullptr;
    cudaError_t status = cudaErrorUnknown;
    Recorder* rec = nullptr;
  } seen;
  Recorder rec;
  seen.rec = &rec;
  Tag first{&rec, 1};
  CUDA_OK(cudaLaunchHostFunc(s, Tag::fn, &first));
  auto cb = [](cudaStream_t stream, cudaError_t status, void* p) {
    auto* seen = static_cast<Seen*>(p);
    seen->stream = stream;
    seen->status = status;
    seen->rec->add(2);
  };
  CUDA_OK(cudaStreamAddCallback(s, cb, &seen, 0));
  CUDA_OK(cudaStreamSynchronize(s));
  CHECK_EQ(rec.get(), (std::vector<int>{1, 2}));
  CHECK_EQ(seen.stream, s);
  CHECK_EQ(seen.status, cudaSuccess);
  CHECK_EQ(cudaStreamAddCallback(s, cb, &seen, 1), cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_OK(cudaStreamDestroy(s));
}
