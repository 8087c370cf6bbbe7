// A differential program thread: its random choices, its state, and the steps that allocate
// and free (see differential_worker.h). The steps that move data, synchronize, manage streams
// and park them are in differential_steps.cpp.
#include "differential_worker.h"

#include <algorithm>
#include <limits>

namespace differential {

Worker::Worker(int id, Program& program, Recorder& recorder)
    : program_(program),
      recorder_(recorder),
      random_(program.run.seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(id) * 7919u),
      live_bytes_(program.capacity.size(), 0) {
  for (int device = 0; device < static_cast<int>(program.capacity.size()); ++device) {
    const std::string at = std::string("@").append(std::to_string(device));
    streams_.push_back(Stream{device, StreamKind::legacy, cudaStreamLegacy, true, true,
                              "the legacy stream" + at});
    if (program.profile.streams) {
      streams_.push_back(Stream{device, StreamKind::per_thread, cudaStreamPerThread, true, true,
                                "the per-thread stream" + at});
    }
  }
}

// ---- Choices -----------------------------------------------------------------------------------

// The most a thread keeps allocated on a device: while threads run together, a quarter of the
// device shared among them, so that whether an allocation fits never depends on the order the
// threads run in; alone (with large allocations allowed) the whole device.
std::uint64_t Worker::limit(int device) const {
  if (alone_ && program_.profile.big) return std::numeric_limits<std::uint64_t>::max();
  return program_.capacity[static_cast<std::size_t>(device)] /
         (4 * static_cast<std::uint64_t>(program_.profile.threads));
}

std::uint64_t Worker::room(int device) const {
  const std::uint64_t most = limit(device);
  const std::uint64_t used = live_bytes_[static_cast<std::size_t>(device)];
  return most > used ? most - used : 0;
}

bool Worker::pick_size(int device, bool bursting, std::size_t* size) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  // Sizes around the alignment and the default layout's page and slice limits.
  static constexpr std::size_t kEdges[] = {
      1, 255, 256, 257, 511, 512, 513, 4096, 65536, 512 * 1024 - 1, 512 * 1024, 512 * 1024 + 1,
      2 * kMiB - 1, 2 * kMiB, 2 * kMiB + 1, 8 * kMiB - 1, 8 * kMiB, 8 * kMiB + 1, 32 * kMiB};
  static constexpr unsigned kBigPercent[] = {5, 10, 20, 30, 45, 60, 75, 90, 97};
  const std::uint64_t capacity = program_.capacity[static_cast<std::size_t>(device)];
  const std::uint64_t r = roll(1000);
  if (!bursting) {
    if (r < 15) {
      *size = 0;
      return gated_ < 0;
    }
    if (r < 35) {  // more than the device has: out of memory in both runs
      const std::size_t impossible[] = {capacity + 1 + roll(kMiB),
                                        std::numeric_limits<std::size_t>::max() - roll(4096),
                                        capacity * 2 + (std::size_t{1} << 40)};
      *size = impossible[roll(3)];
      return true;
    }
    if (r < 110 && alone_ && program_.profile.big) {
      *size = capacity / 100 * kBigPercent[roll(9)] + roll(4096);
      return true;
    }
  }
  std::size_t chosen;
  if (r < 200) {
    chosen = kEdges[roll(sizeof kEdges / sizeof kEdges[0])];
  } else if (r < 550) {
    chosen = 1 + roll(4096);
  } else if (r < 850) {
    chosen = 4096 + roll(512 * 1024);
  } else if (r < 960) {
    chosen = 512 * 1024 + roll(4 * kMiB);
  } else {
    chosen = 4 * kMiB + roll(60 * kMiB);
  }
  const std::uint64_t left = room(device);
  if (left == 0) return false;
  if (chosen > left) chosen = 1 + roll(left);
  *size = chosen;
  return true;
}

int Worker::pick_buffer(bool usable_only) {
  const std::size_t count = buffers_.size();
  const std::size_t start = roll(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t index = (start + i) % count;
    if (!usable_only || !buffers_[index].orphan) return static_cast<int>(index);
  }
  return -1;
}

int Worker::pick_stream(int device, bool unblocked_only) {
  std::vector<int> candidates;
  for (int i = 0; i < static_cast<int>(streams_.size()); ++i) {
    const Stream& stream = streams_[static_cast<std::size_t>(i)];
    if (stream.alive && stream.device == device && !(unblocked_only && blocked(i))) {
      candidates.push_back(i);
    }
  }
  return candidates.empty() ? -1 : candidates[roll(candidates.size())];
}

// A range of at most `most` bytes in a buffer of `size`: at its start, at its end or anywhere.
void Worker::pick_range(std::size_t size, std::size_t most, std::size_t* offset,
                        std::size_t* length) {
  *length = 1 + roll(std::min(size, most));
  switch (roll(3)) {
    case 0:
      *offset = 0;
      break;
    case 1:
      *offset = size - *length;
      break;
    default:
      *offset = roll(size - *length + 1);
  }
}

// ---- State -------------------------------------------------------------------------------------

bool Worker::ensure_device(int device) {
  if (current_ == device) return true;
  recorder_.begin("cudaSetDevice(%d)", device);
  if (!recorder_.end(Call::set_device, cudaSetDevice(device))) return false;
  current_ = device;
  return true;
}

// While a gate is closed, a host call that waits for the parked stream would never return:
// the parked stream itself, and every stream ordered with the legacy stream when the parked
// one is.
bool Worker::blocked(int stream) const {
  if (gated_ < 0) return false;
  if (stream == gated_) return true;
  const Stream& parked = streams_[static_cast<std::size_t>(gated_)];
  const Stream& other = streams_[static_cast<std::size_t>(stream)];
  return parked.device == other.device && parked.blocking && other.blocking;
}

bool Worker::claim(void* ptr, std::size_t size) {
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> hold(program_.live_mutex);
  auto next = program_.live.lower_bound(begin);
  if (next != program_.live.end() && next->first < begin + size) return false;
  if (next != program_.live.begin() && std::prev(next)->second > begin) return false;
  program_.live.emplace(begin, begin + size);
  return true;
}

void Worker::unclaim(void* ptr) {
  std::lock_guard<std::mutex> hold(program_.live_mutex);
  program_.live.erase(reinterpret_cast<std::uintptr_t>(ptr));
}

void Worker::remove_buffer(int index) {
  Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  live_bytes_[static_cast<std::size_t>(buffer.device)] -= buffer.size;
  std::swap(buffer, buffers_.back());
  buffers_.pop_back();
}

void Worker::forget_device(int device) {
  for (int i = static_cast<int>(buffers_.size()) - 1; i >= 0; --i) {
    if (buffers_[static_cast<std::size_t>(i)].device != device) continue;
    unclaim(buffers_[static_cast<std::size_t>(i)].ptr);
    remove_buffer(i);
  }
  for (Stream& stream : streams_) {
    if (stream.device == device && stream.kind == StreamKind::created) stream.alive = false;
  }
}

// An allocation the program does not keep (a tight fit, or one only the library could make)
// goes back unrecorded, so that both runs go on with the same buffers. Never while a gate is
// closed: a plain cudaFree (or one under free_fence:sync) would wait for the parked stream.
void Worker::undo_allocation(void* ptr) {
  if (gated_ >= 0) {
    pending_undo_.push_back(ptr);
    return;
  }
  cudaError_t code = cudaFree(ptr);
  recorder_.check(code == cudaSuccess, "cudaFree(%p) of an allocation given back: %s", ptr,
                  cudaGetErrorName(code));
}

// Everything queued on the device has run: buffers whose stream was destroyed may be used again
// (on the legacy stream).
void Worker::device_synchronized(int device) {
  for (Buffer& buffer : buffers_) {
    if (buffer.device != device || !buffer.orphan) continue;
    buffer.orphan = false;
    buffer.home = legacy_index(device);
  }
}

int Worker::legacy_index(int device) const {
  for (int i = 0; i < static_cast<int>(streams_.size()); ++i) {
    const Stream& stream = streams_[static_cast<std::size_t>(i)];
    if (stream.device == device && stream.kind == StreamKind::legacy) return i;
  }
  return 0;  // unreachable: every device has its legacy stream
}

// ---- Phases ------------------------------------------------------------------------------------

void Worker::run(int steps, bool alone) {
  alone_ = alone;
  current_ = -1;  // a new host thread
  for (int i = 0; i < steps; ++i) step();
  alone_ = false;
  // Back within the budget of the concurrent phases: free the largest buffers.
  for (int device = 0; device < static_cast<int>(live_bytes_.size()); ++device) {
    while (live_bytes_[static_cast<std::size_t>(device)] > limit(device)) {
      int largest = -1;
      for (int i = 0; i < static_cast<int>(buffers_.size()); ++i) {
        const Buffer& buffer = buffers_[static_cast<std::size_t>(i)];
        if (buffer.device == device &&
            (largest < 0 || buffer.size > buffers_[static_cast<std::size_t>(largest)].size)) {
          largest = i;
        }
      }
      void* ptr = buffers_[static_cast<std::size_t>(largest)].ptr;
      unclaim(ptr);
      recorder_.begin("cudaFree(%p), the largest buffer, at the end of a phase", ptr);
      recorder_.check(recorder_.end(Call::free, cudaFree(ptr)), "freeing a live buffer failed");
      remove_buffer(largest);
    }
  }
}

void Worker::synchronize_devices() {
  current_ = -1;
  for (int device = 0; device < static_cast<int>(program_.capacity.size()); ++device) {
    if (!ensure_device(device)) continue;
    recorder_.begin("cudaDeviceSynchronize() between phases");
    if (!recorder_.end(Call::device_synchronize, cudaDeviceSynchronize())) continue;
    for (Worker* worker : program_.workers) worker->device_synchronized(device);
  }
}

void Worker::teardown() {
  current_ = -1;
  while (!buffers_.empty()) {
    const Buffer& buffer = buffers_.back();
    if (!ensure_device(buffer.device)) return;
    unclaim(buffer.ptr);
    recorder_.begin("cudaFree(%p), %zu bytes, at the end", buffer.ptr, buffer.size);
    recorder_.check(recorder_.end(Call::free, cudaFree(buffer.ptr)), "freeing a buffer failed");
    remove_buffer(static_cast<int>(buffers_.size()) - 1);
  }
  for (Stream& stream : streams_) {
    if (!stream.alive || stream.kind != StreamKind::created || !ensure_device(stream.device)) {
      continue;
    }
    recorder_.begin("cudaStreamDestroy(%s) at the end", stream.name.c_str());
    recorder_.end(Call::stream_destroy, cudaStreamDestroy(stream.handle));
    stream.alive = false;
  }
}

// ---- Steps that allocate and free --------------------------------------------------------------

void Worker::step() {
  const std::uint64_t r = roll(1000);
  const bool two_devices = program_.capacity.size() > 1;
  const int some_buffer = pick_buffer(true);
  if (some_buffer < 0 || r < 260) return allocate();
  if (r < 420) return release();
  if (r < 530) return write_fill(some_buffer, true);
  if (r < 590) return write_pattern(some_buffer);
  if (r < 640) return copy_between();
  if (r < 750) return read_back(some_buffer);
  if (r < 790) return synchronize();
  if (r < 820) {
    const Buffer& buffer = buffers_[static_cast<std::size_t>(some_buffer)];
    return rehome(some_buffer, pick_stream(buffer.device, false));
  }
  if (r < 860) return manage_streams();
  if (r < 875) return park_timed();
  if (r < 890) return run_kernel(some_buffer);
  if (r < 920) return mem_get_info();
  if (r < 935) return burst();
  if (r < 960) {
    if (two_devices) ensure_device(current_ == 1 ? 0 : 1);
    return;
  }
  if (r < 985) return last_error();
  if (r < 995) return park_gated();
  if (alone_ && program_.profile.reset) return reset_device();
}

// One allocation (cudaMallocAsync on `stream`, or cudaMalloc when it is -1), recorded and
// compared. True when both runs have it and the program keeps it in *ptr.
bool Worker::allocation(int device, std::size_t size, int stream, const char* note, void** ptr) {
  cudaError_t code;
  {
    std::shared_lock<std::shared_mutex> hold(program_.address_lock);
    if (stream >= 0) {
      const Stream& target = streams_[static_cast<std::size_t>(stream)];
      recorder_.begin("cudaMallocAsync(%zu) on %s%s", size, target.name.c_str(), note);
      code = cudaMallocAsync(ptr, size, target.handle);
    } else {
      recorder_.begin("cudaMalloc(%zu) on device %d%s", size, device, note);
      code = cudaMalloc(ptr, size);
    }
  }
  std::size_t free_after = 0;
  if (!program_.run.library && code == cudaSuccess) {
    std::size_t total = 0;
    program_.device_memory(&free_after, &total);
  }
  bool tight = false;
  const bool ok = recorder_.end_allocation(
      stream >= 0 ? Call::malloc_async : Call::malloc, code, free_after,
      program_.capacity[static_cast<std::size_t>(device)] / 8, &tight);
  // A tight fit, or memory the plain run could not get: given back, unrecorded.
  if (code == cudaSuccess && (tight || !ok)) undo_allocation(*ptr);
  if (tight) (void)cudaGetLastError();  // unrecorded in both runs: a refusal leaves its error
  return ok && !tight;
}

void Worker::allocate() {
  int device = current_ < 0 ? 0 : current_;
  if (program_.capacity.size() > 1 && roll(4) == 0) {
    device = static_cast<int>(roll(program_.capacity.size()));
  }
  std::size_t size = 0;
  if (!pick_size(device, false, &size)) return release();  // no room within the budget
  allocate(device, size, program_.profile.async && roll(4) == 0);
}

void Worker::allocate(int device, std::size_t size, bool async) {
  if (!ensure_device(device)) return;
  const int home = pick_stream(device, false);
  void* ptr = nullptr;
  if (!allocation(device, size, async ? home : -1, "", &ptr)) {
    if (roll(2) == 0) last_error();
    return;
  }
  if (size == 0) {
    recorder_.begin("cudaFree(%p), what a 0-byte allocation returned", ptr);
    recorder_.end(Call::free, cudaFree(ptr));
    return;
  }
  recorder_.check(ptr != nullptr && reinterpret_cast<std::uintptr_t>(ptr) % 256 == 0,
                  "an allocation of %zu bytes returned %p: not 256-byte aligned", size, ptr);
  recorder_.check(claim(ptr, size), "an allocation of %zu bytes returned %p: it overlaps a live "
                  "buffer", size, ptr);
  buffers_.push_back(Buffer{ptr, size, device, home, false, async, Shadow{}});
  live_bytes_[static_cast<std::size_t>(device)] += size;
  if (roll(2) == 0) write_fill(static_cast<int>(buffers_.size()) - 1, true);
}

void Worker::release() {
  if (gated_ >= 0) return;  // the plain cudaFree waits for the device, and the gate waits for us
  const int index = pick_buffer(false);
  if (index < 0) return;
  Buffer& buffer = buffers_[static_cast<std::size_t>(index)];
  const std::uint64_t r = roll(100);
  if (r < 8 && buffer.size > 1) {
    const std::size_t inside =
        roll(2) == 0 ? 1 + roll(buffer.size - 1)
                     : std::min<std::size_t>(buffer.size - 1, std::size_t{256} << roll(12));
    recorder_.begin("cudaFree(%p + %zu), inside a live %zu-byte buffer", buffer.ptr, inside,
                    buffer.size);
    recorder_.end(Call::free, cudaFree(static_cast<char*>(buffer.ptr) + inside));
    if (roll(2) == 0) last_error();
    return;
  }
  if (r < 40 && program_.profile.async && !buffer.orphan) {
    if (!ensure_device(buffer.device)) return;
    const Stream& home = streams_[static_cast<std::size_t>(buffer.home)];
    unclaim(buffer.ptr);
    recorder_.begin("cudaFreeAsync(%p) of %zu bytes on %s", buffer.ptr, buffer.size,
                    home.name.c_str());
    recorder_.check(recorder_.end(Call::free_async, cudaFreeAsync(buffer.ptr, home.handle)),
                    "cudaFreeAsync of a live buffer failed");
    remove_buffer(index);
    return;
  }
  const bool busy = !buffer.orphan && roll(3) == 0;  // still in use at the free
  if (busy && roll(2) == 0) {
    run_kernel(index);
  } else if (busy) {
    write_fill(index, false);
  }
  if (roll(4) != 0 && !ensure_device(buffer.device)) return;  // else freed from another device
  if (buffer.async) {
    // CUDA takes every access to cudaMallocAsync memory as complete at its cudaFree and waits
    // for nothing: a program waits for the work queued on it first (the buffer's work is all on
    // its home stream, which no park of this thread holds here). Without this wait an H200
    // freed the memory under a queued memset: cudaErrorIllegalAddress in the plain run.
    const Stream& home = streams_[static_cast<std::size_t>(buffer.home)];
    recorder_.begin("cudaStreamSynchronize(%s) before freeing a stream-ordered buffer",
                    home.name.c_str());
    if (!recorder_.end(Call::stream_synchronize, cudaStreamSynchronize(home.handle))) return;
  }
  const bool twice = roll(8) == 0;
  std::unique_lock<std::shared_mutex> hold(program_.address_lock, std::defer_lock);
  if (twice) hold.lock();
  void* ptr = buffer.ptr;
  unclaim(ptr);
  recorder_.begin("cudaFree(%p), a %zu-byte buffer of device %d", ptr, buffer.size,
                  buffer.device);
  recorder_.check(recorder_.end(Call::free, cudaFree(ptr)), "freeing a live buffer failed");
  const int device = buffer.device;
  const std::size_t size = buffer.size;
  remove_buffer(index);
  if (twice) {
    recorder_.begin("cudaFree(%p) again (a double free)", ptr);
    recorder_.end(Call::free, cudaFree(ptr));
    hold.unlock();
    if (roll(2) == 0) last_error();
  }
  // The same size again, as a loop would: the memory just freed fits it exactly.
  if (busy && roll(2) == 0 && room(device) >= size) allocate(device, size, false);
}

// Many allocations of one size, each written and freed at once: reuse, and the pools' periodic
// returns of idle pages.
void Worker::burst() {
  if (gated_ >= 0) return;
  const int device = current_ < 0 ? 0 : current_;
  std::size_t size = 0;
  if (!pick_size(device, true, &size) || !ensure_device(device)) return;
  const Stream& stream = streams_[static_cast<std::size_t>(pick_stream(device, false))];
  const int count = 10 + static_cast<int>(roll(100));
  for (int i = 0; i < count; ++i) {
    void* ptr = nullptr;
    if (!allocation(device, size, -1, ", in a burst", &ptr)) return;
    recorder_.check(claim(ptr, size), "a burst allocation of %zu bytes returned %p: it overlaps "
                    "a live buffer", size, ptr);
    recorder_.begin("cudaMemsetAsync(%p, %zu bytes) on %s", ptr, std::min<std::size_t>(size, 4096),
                    stream.name.c_str());
    recorder_.end(Call::memset_async,
                  cudaMemsetAsync(ptr, i & 0xff, std::min<std::size_t>(size, 4096), stream.handle));
    unclaim(ptr);
    recorder_.begin("cudaFree(%p), the end of a burst allocation", ptr);
    recorder_.check(recorder_.end(Call::free, cudaFree(ptr)), "freeing a live buffer failed");
  }
}

void Worker::reset_device() {
  const int device = current_ < 0 ? 0 : current_;
  if (!ensure_device(device)) return;
  recorder_.begin("cudaDeviceSynchronize() before a reset");
  recorder_.end(Call::device_synchronize, cudaDeviceSynchronize());
  recorder_.begin("cudaDeviceReset() of device %d", device);
  if (!recorder_.end(Call::device_reset, cudaDeviceReset())) return;
  for (Worker* worker : program_.workers) worker->forget_device(device);
}

}  // namespace differential
