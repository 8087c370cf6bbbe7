// A differential program thread's steps that move data, synchronize, manage streams and park
// them (see differential_worker.h); allocation and free are in differential_worker.cpp.
#include <algorithm>
#include <chrono>
#include <thread>

#include "../simcuda/simcuda.h"
#include "differential_worker.h"

namespace differential {

namespace {

void CUDART_CB sleep_ms(void* data) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::uintptr_t>(data)));
}

}  // namespace

// ---- Data --------------------------------------------------------------------------------------

void Worker::write_fill(int index, bool allow_sync) {
  Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  if (buffer.orphan || !ensure_device(buffer.device)) return;
  std::size_t offset = 0;
  std::size_t length = 0;
  pick_range(buffer.size, std::size_t{1} << 20, &offset, &length);
  const auto value = static_cast<unsigned char>(roll(256));
  char* target = static_cast<char*>(buffer.ptr) + offset;
  const Stream& home = streams_[static_cast<std::size_t>(buffer.home)];
  bool ok;
  if (allow_sync && legacy_ordered(buffer.home) && !blocked(buffer.home) && roll(3) == 0) {
    recorder_.begin("cudaMemset(%p + %zu, 0x%02x, %zu)", buffer.ptr, offset, value, length);
    ok = recorder_.end(Call::memset, cudaMemset(target, value, length));
  } else {
    recorder_.begin("cudaMemsetAsync(%p + %zu, 0x%02x, %zu) on %s", buffer.ptr, offset, value,
                    length, home.name.c_str());
    ok = recorder_.end(Call::memset_async, cudaMemsetAsync(target, value, length, home.handle));
  }
  recorder_.check(ok, "a memset inside a live buffer failed");
  buffer.shadow.fill(offset, offset + length, value);
}

void Worker::write_pattern(int index) {
  Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  if (buffer.orphan || !ensure_device(buffer.device)) return;
  std::size_t offset = 0;
  std::size_t length = 0;
  pick_range(buffer.size, std::size_t{1} << 20, &offset, &length);
  const std::size_t from = roll(program_.pattern.size() - length + 1);
  char* target = static_cast<char*>(buffer.ptr) + offset;
  const unsigned char* source = program_.pattern.data() + from;
  const Stream& home = streams_[static_cast<std::size_t>(buffer.home)];
  bool ok;
  if (legacy_ordered(buffer.home) && !blocked(buffer.home) && roll(3) == 0) {
    recorder_.begin("cudaMemcpy(%p + %zu, host, %zu, host to device)", buffer.ptr, offset, length);
    ok = recorder_.end(Call::memcpy,
                       cudaMemcpy(target, source, length, cudaMemcpyHostToDevice));
  } else {
    recorder_.begin("cudaMemcpyAsync(%p + %zu, host, %zu, host to device) on %s", buffer.ptr,
                    offset, length, home.name.c_str());
    ok = recorder_.end(Call::memcpy_async, cudaMemcpyAsync(target, source, length,
                                                           cudaMemcpyHostToDevice, home.handle));
  }
  recorder_.check(ok, "a copy into a live buffer failed");
  buffer.shadow.pattern(offset, offset + length,
                        static_cast<std::int64_t>(from) - static_cast<std::int64_t>(offset));
}

void Worker::copy_between() {
  const int from = pick_buffer(true);
  const int to = pick_buffer(true);
  if (from < 0 || to < 0 || from == to) return;
  Buffer& source = buffers_[static_cast<std::size_t>(from)];
  Buffer& target = buffers_[static_cast<std::size_t>(to)];
  if (source.device != target.device || !ensure_device(source.device)) return;
  const std::size_t length =
      1 + roll(std::min({source.size, target.size, std::size_t{1} << 20}));
  const std::size_t read_at = roll(source.size - length + 1);
  const std::size_t write_at = roll(target.size - length + 1);
  char* destination = static_cast<char*>(target.ptr) + write_at;
  const char* origin = static_cast<const char*>(source.ptr) + read_at;
  bool ok;
  if (legacy_ordered(source.home) && legacy_ordered(target.home) && !blocked(source.home) &&
      !blocked(target.home) && roll(3) == 0) {
    recorder_.begin("cudaMemcpy(%p + %zu, %p + %zu, %zu, device to device)", target.ptr,
                    write_at, source.ptr, read_at, length);
    ok = recorder_.end(Call::memcpy,
                       cudaMemcpy(destination, origin, length, cudaMemcpyDeviceToDevice));
  } else {
    rehome(to, source.home);  // the copy runs on the source's stream
    if (target.home != source.home) return;
    const Stream& stream = streams_[static_cast<std::size_t>(source.home)];
    recorder_.begin("cudaMemcpyAsync(%p + %zu, %p + %zu, %zu, device to device) on %s",
                    target.ptr, write_at, source.ptr, read_at, length, stream.name.c_str());
    ok = recorder_.end(Call::memcpy_async, cudaMemcpyAsync(destination, origin, length,
                                                           cudaMemcpyDeviceToDevice,
                                                           stream.handle));
  }
  recorder_.check(ok, "a copy between live buffers failed");
  target.shadow.copy(source.shadow, read_at, write_at, length);
}

void Worker::read_back(int index) {
  const Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  if (buffer.orphan || blocked(buffer.home) || !ensure_device(buffer.device)) return;
  std::size_t offset = 0;
  std::size_t length = 0;
  pick_range(buffer.size, std::size_t{256} << 10, &offset, &length);
  host_.assign(length, 0xee);
  const char* source = static_cast<const char*>(buffer.ptr) + offset;
  const Stream& home = streams_[static_cast<std::size_t>(buffer.home)];
  bool ok;
  if (legacy_ordered(buffer.home) && roll(2) == 0) {
    recorder_.begin("cudaMemcpy(host, %p + %zu, %zu, device to host)", buffer.ptr, offset,
                    length);
    ok = recorder_.end(Call::memcpy,
                       cudaMemcpy(host_.data(), source, length, cudaMemcpyDeviceToHost));
  } else {
    recorder_.begin("cudaMemcpyAsync(host, %p + %zu, %zu, device to host) on %s", buffer.ptr,
                    offset, length, home.name.c_str());
    ok = recorder_.end(Call::memcpy_async,
                       cudaMemcpyAsync(host_.data(), source, length, cudaMemcpyDeviceToHost,
                                       home.handle));
    recorder_.begin("cudaStreamSynchronize(%s)", home.name.c_str());
    ok = recorder_.end(Call::stream_synchronize, cudaStreamSynchronize(home.handle)) && ok;
  }
  recorder_.check(ok, "reading a live buffer back failed");
  Mismatch mismatch;
  const bool same = buffer.shadow.check(host_.data(), offset, length, program_.pattern, &mismatch);
  recorder_.check(same,
                  "the %zu-byte buffer %p of device %d read back 0x%02x at offset %llu where "
                  "0x%02x was written (%zu bytes read from offset %zu)",
                  buffer.size, buffer.ptr, buffer.device, mismatch.got,
                  static_cast<unsigned long long>(mismatch.offset), mismatch.expected, length,
                  offset);
}

// ---- Ordering ----------------------------------------------------------------------------------

// The buffer's later work goes to `stream`, ordered after its earlier work by an event. Never
// out of a stream held by the gate: the new stream would wait for the gate too.
void Worker::rehome(int index, int stream) {
  Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  if (buffer.orphan || stream < 0 || stream == buffer.home || blocked(buffer.home) ||
      !ensure_device(buffer.device)) {
    return;
  }
  const Stream& from = streams_[static_cast<std::size_t>(buffer.home)];
  const Stream& to = streams_[static_cast<std::size_t>(stream)];
  cudaEvent_t event = nullptr;
  recorder_.begin("cudaEventCreateWithFlags(disable timing)");
  const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (!recorder_.end(Call::event_create, created)) return;
  recorder_.begin("cudaEventRecord(event, %s)", from.name.c_str());
  bool ok = recorder_.end(Call::event_record, cudaEventRecord(event, from.handle));
  if (ok) {
    recorder_.begin("cudaStreamWaitEvent(%s, event)", to.name.c_str());
    ok = recorder_.end(Call::stream_wait_event, cudaStreamWaitEvent(to.handle, event, 0));
  }
  recorder_.begin("cudaEventDestroy(event)");
  recorder_.end(Call::event_destroy, cudaEventDestroy(event));
  if (ok) buffer.home = stream;
}

void Worker::synchronize() {
  const int device = current_ < 0 ? 0 : current_;
  if (!ensure_device(device)) return;
  const std::uint64_t r = roll(10);
  const int stream = pick_stream(device, true);
  if (r < 5 && stream >= 0) {
    const Stream& target = streams_[static_cast<std::size_t>(stream)];
    recorder_.begin("cudaStreamSynchronize(%s)", target.name.c_str());
    recorder_.end(Call::stream_synchronize, cudaStreamSynchronize(target.handle));
  } else if (r < 8 && stream >= 0) {
    const Stream& target = streams_[static_cast<std::size_t>(stream)];
    cudaEvent_t event = nullptr;
    recorder_.begin("cudaEventCreate()");
    if (!recorder_.end(Call::event_create, cudaEventCreate(&event))) return;
    recorder_.begin("cudaEventRecord(event, %s)", target.name.c_str());
    if (recorder_.end(Call::event_record, cudaEventRecord(event, target.handle))) {
      recorder_.begin("cudaEventSynchronize(event on %s)", target.name.c_str());
      recorder_.end(Call::event_synchronize, cudaEventSynchronize(event));
    }
    recorder_.begin("cudaEventDestroy(event)");
    recorder_.end(Call::event_destroy, cudaEventDestroy(event));
  } else if (gated_ < 0) {
    recorder_.begin("cudaDeviceSynchronize() on device %d", device);
    if (recorder_.end(Call::device_synchronize, cudaDeviceSynchronize())) {
      device_synchronized(device);
    }
  }
}

void Worker::manage_streams() {
  const int device = current_ < 0 ? 0 : current_;
  if (!program_.profile.streams || !ensure_device(device)) return;
  std::vector<int> created;
  for (int i = 0; i < static_cast<int>(streams_.size()); ++i) {
    const Stream& stream = streams_[static_cast<std::size_t>(i)];
    if (stream.alive && stream.kind == StreamKind::created && stream.device == device &&
        i != gated_) {
      created.push_back(i);
    }
  }
  if (created.size() < 3 && (created.empty() || roll(2) == 0)) {
    const unsigned flags = roll(2) == 0 ? cudaStreamNonBlocking : cudaStreamDefault;
    cudaStream_t handle = nullptr;
    cudaError_t code;
    const std::uint64_t how = roll(3);
    if (how == 0 && flags == cudaStreamDefault) {
      recorder_.begin("cudaStreamCreate()");
      code = cudaStreamCreate(&handle);
    } else if (how == 1) {
      recorder_.begin("cudaStreamCreateWithPriority(flags %u, priority -1)", flags);
      code = cudaStreamCreateWithPriority(&handle, flags, -1);
    } else {
      recorder_.begin("cudaStreamCreateWithFlags(%u)", flags);
      code = cudaStreamCreateWithFlags(&handle, flags);
    }
    if (!recorder_.end(Call::stream_create, code)) return;
    const bool blocking = flags == cudaStreamDefault;
    streams_.push_back(Stream{device, StreamKind::created, handle, blocking, true,
                              std::string(blocking ? "blocking" : "non-blocking") + " stream " +
                                  std::to_string(streams_.size()) + "@" +
                                  std::to_string(device)});
    return;
  }
  const int doomed = created[roll(created.size())];
  const Stream& stream = streams_[static_cast<std::size_t>(doomed)];
  // Synchronized first, its buffers move to the legacy stream; otherwise their queued work
  // still runs after the destroy, and they wait for a device synchronization. A stream that
  // holds cudaMallocAsync buffers is always synchronized first (their free waits for their work,
  // which a destroyed stream no longer offers), and is not destroyed while parked.
  const bool holds_async = std::any_of(buffers_.begin(), buffers_.end(), [&](const Buffer& b) {
    return b.async && b.home == doomed;
  });
  if (holds_async && blocked(doomed)) return;
  bool drained = false;
  if (!blocked(doomed) && (holds_async || roll(2) == 0)) {
    recorder_.begin("cudaStreamSynchronize(%s) before destroying it", stream.name.c_str());
    drained = recorder_.end(Call::stream_synchronize, cudaStreamSynchronize(stream.handle));
  }
  recorder_.begin("cudaStreamDestroy(%s)", stream.name.c_str());
  if (!recorder_.end(Call::stream_destroy, cudaStreamDestroy(stream.handle))) return;
  streams_[static_cast<std::size_t>(doomed)].alive = false;
  for (Buffer& buffer : buffers_) {
    if (buffer.home != doomed) continue;
    if (drained) {
      buffer.home = legacy_index(device);
    } else {
      buffer.orphan = true;
    }
  }
}

// ---- Parked streams ----------------------------------------------------------------------------

// A stream busy for a few milliseconds, with work queued behind it.
void Worker::park_timed() {
  const int device = current_ < 0 ? 0 : current_;
  if (parked_ms_ > 300 || !ensure_device(device)) return;
  const int index = pick_stream(device, false);
  const Stream& stream = streams_[static_cast<std::size_t>(index)];
  const auto ms = static_cast<std::uintptr_t>(1 + roll(12));
  parked_ms_ += static_cast<int>(ms);
  recorder_.begin("cudaLaunchHostFunc(%s, sleep %zu ms)", stream.name.c_str(),
                  static_cast<std::size_t>(ms));
  recorder_.end(Call::launch_host_func,
                cudaLaunchHostFunc(stream.handle, sleep_ms, reinterpret_cast<void*>(ms)));
  for (int i = 0; i < static_cast<int>(buffers_.size()); ++i) {
    if (buffers_[static_cast<std::size_t>(i)].home == index && roll(2) == 0) write_fill(i, false);
  }
}

// A kernel that writes part of a buffer for a few milliseconds (the stand-in's
// simcuda_access_kernel, launched with cudaLaunchKernel as a real kernel is, so that the library
// sees the launch and its stream; the race detector sees the write while it runs), with work
// queued behind it. On a real GPU, a host function that sleeps as long.
void Worker::run_kernel(int index) {
  const Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  if (buffer.orphan || parked_ms_ > 300 || !ensure_device(buffer.device)) return;
  static const void* const access_kernel = ::dlsym(RTLD_DEFAULT, "simcuda_access_kernel");
  if (access_kernel == nullptr) return park_timed();
  const Stream& home = streams_[static_cast<std::size_t>(buffer.home)];
  std::size_t offset = 0;
  std::size_t length = 0;
  pick_range(buffer.size, std::size_t{1} << 20, &offset, &length);
  const auto ms = static_cast<std::uintptr_t>(1 + roll(8));
  parked_ms_ += static_cast<int>(ms);
  recorder_.begin("kernel writing %p + %zu (%zu bytes) for %zu ms on %s", buffer.ptr, offset,
                  length, static_cast<std::size_t>(ms), home.name.c_str());
  simcuda_access access{static_cast<char*>(buffer.ptr) + offset, length, 1, sleep_ms,
                        reinterpret_cast<void*>(ms)};
  void* args[] = {&access};
  const cudaError_t code =
      cudaLaunchKernel(access_kernel, dim3(1), dim3(1), args, 0, home.handle);
  recorder_.check(recorder_.end(Call::launch_kernel, code),
                  "a kernel on a live buffer failed");
  if (roll(2) == 0) write_fill(index, false);
}

// A stream held by a host function until the program opens its gate, while the program goes on
// with what never waits for it (allocations, work on other streams). The plain run never waits
// for the parked stream there; a call that does under the library is a hang the watchdog
// reports.
void Worker::park_gated() {
  if (!alone_ || !program_.profile.gates || gated_ >= 0) return;
  const int device = current_ < 0 ? 0 : current_;
  if (!ensure_device(device)) return;
  const int index = pick_stream(device, false);
  const Stream& stream = streams_[static_cast<std::size_t>(index)];
  gates_.push_back(std::make_unique<preload_test::Gate>());
  preload_test::Gate* gate = gates_.back().get();
  gate->limit_seconds = 4 * program_.run.hang_seconds + 20;  // only for a real GPU's sake
  recorder_.begin("cudaLaunchHostFunc(%s, parked until the program opens the gate)",
                  stream.name.c_str());
  if (!recorder_.end(Call::launch_host_func,
                     cudaLaunchHostFunc(stream.handle, preload_test::wait_at_gate, gate))) {
    return;
  }
  gated_ = index;
  for (int i = 0; i < static_cast<int>(buffers_.size()); ++i) {
    if (buffers_[static_cast<std::size_t>(i)].home == index && roll(2) == 0) write_fill(i, false);
  }
  const int steps = 4 + static_cast<int>(roll(24));
  for (int i = 0; i < steps; ++i) step_gated();
  gate->open.store(true);
  gated_ = -1;
  std::vector<void*> undo;
  undo.swap(pending_undo_);
  for (void* ptr : undo) undo_allocation(ptr);
}

void Worker::step_gated() {
  const std::uint64_t r = roll(100);
  const int some_buffer = pick_buffer(true);
  if (r < 50 || some_buffer < 0) return allocate();
  if (r < 60) return mem_get_info();
  if (r < 72) return write_fill(some_buffer, true);
  if (r < 82) return read_back(some_buffer);
  if (r < 88) {
    const int device = buffers_[static_cast<std::size_t>(some_buffer)].device;
    return rehome(some_buffer, pick_stream(device, false));
  }
  if (r < 94) return manage_streams();
  last_error();
}

// ---- Queries -----------------------------------------------------------------------------------

void Worker::mem_get_info() {
  const int device = current_ < 0 ? 0 : current_;
  if (!ensure_device(device)) return;
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  recorder_.begin("cudaMemGetInfo() on device %d", device);
  if (!recorder_.end(Call::mem_get_info, cudaMemGetInfo(&free_bytes, &total))) return;
  const std::uint64_t capacity = program_.capacity[static_cast<std::size_t>(device)];
  recorder_.check(total == capacity && free_bytes <= total,
                  "cudaMemGetInfo on device %d said %zu bytes free of %zu; the device has %llu",
                  device, free_bytes, total, static_cast<unsigned long long>(capacity));
  if (alone_ && gated_ < 0 && roll(2) == 0 && program_.profile.reported_free) {
    allocate_reported_free(device, free_bytes);
  }
}

// What cudaMemGetInfo calls free, a program may allocate (frameworks size workspaces that way).
void Worker::allocate_reported_free(int device, std::size_t free_bytes) {
  void* ptr = nullptr;
  recorder_.begin("cudaMalloc(%zu) on device %d, every byte cudaMemGetInfo reported free",
                  free_bytes, device);
  cudaError_t code = cudaMalloc(&ptr, free_bytes);
  const bool ok = recorder_.end(Call::malloc, code);
  if (code == cudaSuccess && !ok) return undo_allocation(ptr);
  if (!ok) return;
  if (ptr != nullptr) {
    recorder_.check(claim(ptr, free_bytes), "cudaMalloc(%zu) returned %p: it overlaps a live "
                    "buffer", free_bytes, ptr);
    unclaim(ptr);
  }
  recorder_.begin("cudaFree(%p), all the free memory", ptr);
  recorder_.check(recorder_.end(Call::free, cudaFree(ptr)), "freeing a live buffer failed");
}

void Worker::last_error() {
  recorder_.begin("cudaGetLastError()");
  recorder_.end(Call::get_last_error, cudaGetLastError());
}

}  // namespace differential
