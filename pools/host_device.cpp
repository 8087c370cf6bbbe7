// HostDevice implementation. Allocations over-allocate by the alignment and round the address
// up, so any alignment works; the real base is kept to free it. The memory is an anonymous
// mapping without reserved swap: the pools never touch device memory, so a page costs the host
// nothing until a test writes to it (with malloc, a harness that fills every block, such as
// meson's MALLOC_PERTURB_, wrote every byte of every page: 37 s instead of 0.1 for one test).
#include <algorithm>
#include "pools/host_device.h"

#include <sys/mman.h>

namespace poolcuda {

HostDevice::HostDevice(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(capacity), total_(capacity), alignment_(alignment == 0 ? 1 : alignment) {}

HostDevice::~HostDevice() {
  for (auto& [ptr, block] : blocks_) ::munmap(block.base, block.mapped);
}

void HostDevice::enter(const char* method) const {
  if (!forbid_) return;
  ++forbidden_;
  if (forbidden_hook_) forbidden_hook_(method);
}

AllocStatus HostDevice::allocate(std::uint64_t size, DevicePtr* out) {
  std::lock_guard lock(mutex_);
  ++calls_.allocate;
  enter("allocate");
  if (fail_countdown_ != 0 && --fail_countdown_ == 0) return fail_status_;
  if (size == 0 || size % alignment_ != 0) return AllocStatus::failed;
  if (size > capacity_ || used_ > capacity_ - size) return AllocStatus::out_of_memory;
  const std::uint64_t mapped = size + alignment_;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return AllocStatus::out_of_memory;
  const DevicePtr ptr = align_up(reinterpret_cast<std::uintptr_t>(base), alignment_);
  blocks_.emplace(ptr, Block{base, mapped, size});
  used_ += size;
  used_peak_ = std::max(used_peak_, used_);
  *out = ptr;
  return AllocStatus::ok;
}

void HostDevice::release(DevicePtr ptr, std::uint64_t size) {
  std::lock_guard lock(mutex_);
  ++calls_.release;
  enter("release");
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second.size != size) {
    ++bad_releases_;
    return;
  }
  used_ -= size;
  ::munmap(it->second.base, it->second.mapped);
  blocks_.erase(it);
}

DeviceMemoryInfo HostDevice::memory_info() {
  std::lock_guard lock(mutex_);
  ++calls_.memory_info;
  enter("memory_info");
  return {capacity_ > used_ ? std::min(capacity_ - used_, total_) : 0, total_};
}

std::uint64_t HostDevice::alignment() const {
  std::lock_guard lock(mutex_);
  ++calls_.alignment;
  enter("alignment");
  return alignment_;
}

FenceHandle HostDevice::fence_record() {
  std::lock_guard lock(mutex_);
  ++calls_.fence_record;
  enter("fence_record");
  if (capture_open_) return kNoFence;
  const FenceHandle fence = next_fence_++;
  live_fences_.insert(fence);
  if (fence_mode_ == FenceMode::immediate) completed_upto_ = fence;
  return fence;
}

FenceHandle HostDevice::fence_record_on(StreamToken stream, StreamToken& lane) {
  std::lock_guard lock(mutex_);
  lane = stream;
  ++calls_.fence_record;
  enter("fence_record_on");
  if (capture_open_) return kNoFence;
  const FenceHandle fence = next_fence_++;
  live_fences_.insert(fence);
  if (parked_streams_.count(stream) == 0) {
    passed_apart_.insert(fence);
  } else {
    held_back_.insert(fence);
  }
  return fence;
}

void HostDevice::park_stream(StreamToken stream) {
  std::lock_guard lock(mutex_);
  parked_streams_.insert(stream);
}

bool HostDevice::fence_passed(FenceHandle fence) {
  std::lock_guard lock(mutex_);
  ++calls_.fence_passed;
  enter("fence_passed");
  return passed_locked(fence);
}

bool HostDevice::passed_locked(FenceHandle fence) const {
  if (held_back_.count(fence) != 0) return false;
  return fence <= completed_upto_ || passed_apart_.count(fence) != 0;
}

void HostDevice::fence_wait(FenceHandle fence) {
  std::unique_lock lock(mutex_);
  ++calls_.fence_wait;
  enter("fence_wait");
  if (fence_mode_ == FenceMode::parked) {
    fences_completed_.wait(lock, [&] { return passed_locked(fence); });
    return;
  }
  // The device runs to the fence: it and every earlier fence pass (but for other parked
  // streams').
  if (fence > completed_upto_) completed_upto_ = fence;
  held_back_.erase(fence);
}

bool HostDevice::fence_wait_for(FenceHandle fence, std::uint32_t max_microseconds) {
  std::unique_lock lock(mutex_);
  ++calls_.fence_wait_for;
  enter("fence_wait_for");
  if (fence_mode_ == FenceMode::on_wait && fence > completed_upto_) completed_upto_ = fence;
  return fences_completed_.wait_for(lock, std::chrono::microseconds(max_microseconds),
                                    [&] { return passed_locked(fence); });
}

void HostDevice::fence_destroy(FenceHandle fence) {
  std::lock_guard lock(mutex_);
  ++calls_.fence_destroy;
  enter("fence_destroy");
  live_fences_.erase(fence);
  passed_apart_.erase(fence);
  held_back_.erase(fence);
}

bool HostDevice::synchronize() {
  std::lock_guard lock(mutex_);
  ++calls_.synchronize;
  enter("synchronize");
  if (capture_open_) {  // refused, as CudaDevice refuses: it would invalidate the capture
    ++synchronize_during_capture_;
    return false;
  }
  completed_upto_ = next_fence_ - 1;
  held_back_.clear();
  fences_completed_.notify_all();
  return true;
}

bool HostDevice::capture_active() {
  std::lock_guard lock(mutex_);
  ++calls_.capture_active;
  enter("capture_active");
  return capture_open_;
}

void HostDevice::set_capacity(std::uint64_t capacity) {
  std::lock_guard lock(mutex_);
  capacity_ = capacity;
  total_ = capacity;
}

void HostDevice::set_total_memory(std::uint64_t total) {
  std::lock_guard lock(mutex_);
  total_ = total;
}

void HostDevice::fail_nth_allocation(std::uint64_t n, AllocStatus status) {
  std::lock_guard lock(mutex_);
  fail_countdown_ = n;
  fail_status_ = status;
}

void HostDevice::forbid_calls(bool forbid) {
  std::lock_guard lock(mutex_);
  forbid_ = forbid;
}

void HostDevice::on_forbidden_call(std::function<void(const char*)> hook) {
  std::lock_guard lock(mutex_);
  forbidden_hook_ = std::move(hook);
}

std::uint64_t HostDevice::forbidden_calls() const {
  std::lock_guard lock(mutex_);
  return forbidden_;
}

void HostDevice::set_fence_mode(FenceMode mode) {
  std::lock_guard lock(mutex_);
  fence_mode_ = mode;
}

void HostDevice::complete_fences() {
  std::lock_guard lock(mutex_);
  completed_upto_ = next_fence_ - 1;
  held_back_.clear();
  fences_completed_.notify_all();
}

void HostDevice::set_capture_open(bool open) {
  std::lock_guard lock(mutex_);
  capture_open_ = open;
}

std::uint64_t HostDevice::synchronize_during_capture() const {
  std::lock_guard lock(mutex_);
  return synchronize_during_capture_;
}

HostDevice::Calls HostDevice::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

std::uint64_t HostDevice::outstanding_allocations() const {
  std::lock_guard lock(mutex_);
  return blocks_.size();
}

std::uint64_t HostDevice::outstanding_bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

std::uint64_t HostDevice::peak_outstanding_bytes() const {
  std::lock_guard lock(mutex_);
  return used_peak_;
}

std::uint64_t HostDevice::outstanding_fences() const {
  std::lock_guard lock(mutex_);
  return live_fences_.size();
}

std::uint64_t HostDevice::bad_releases() const {
  std::lock_guard lock(mutex_);
  return bad_releases_;
}

bool HostDevice::owns(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  for (const auto& [start, block] : blocks_)
    if (ptr >= start && ptr < start + block.size) return true;
  return false;
}

}  // namespace poolcuda
