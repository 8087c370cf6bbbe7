// poolcuda_replay_pools: replays a trace against poolcuda's pools called directly (allocator
// `pools`): one MemoryManager with default options (the default layout, resolved for a 16 GiB
// device unless --device-memory says otherwise, and the default free fences) over HostDevice,
// whose fences pass at once. A metering Device between them counts what a driver would see:
// allocations, releases, fence records, and the bytes held now and at the peak. Allocator
// `harness` replays through an allocator that does nothing: the replay loop's own cost on that
// trace. No CUDA anywhere.
//
//   poolcuda_replay_pools [--allocator pools|harness] [--label TEXT] [--device-memory SIZE] TRACE
#include <algorithm>
#include <atomic>
#include <thread>
#include <memory>

#include "pools/forwarding_device.h"
#include "pools/host_device.h"
#include "pools/memory_manager.h"
#include "tools/bench/replay_cli.h"

namespace poolcuda::bench {
namespace {

// Forwards every call to the device below and meters it. Atomic counters: a manager may call
// release() without its lock, from any thread, while another thread allocates.
class MeteredDevice final : public ForwardingDevice<> {
 public:
  using ForwardingDevice::ForwardingDevice;

  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override {
    const AllocStatus status = inner_.allocate(size, out);
    if (status == AllocStatus::ok) {
      allocs_.fetch_add(1, std::memory_order_relaxed);
      const std::uint64_t held = held_.fetch_add(size) + size;
      std::uint64_t peak = peak_.load();
      while (held > peak && !peak_.compare_exchange_weak(peak, held)) {
      }
    }
    return status;
  }
  void release(DevicePtr ptr, std::uint64_t size) override {
    inner_.release(ptr, size);
    releases_.fetch_add(1, std::memory_order_relaxed);
    held_.fetch_sub(size);
  }
  FenceHandle fence_record() override {
    const FenceHandle fence = inner_.fence_record();
    if (fence != kNoFence) fence_records_.fetch_add(1, std::memory_order_relaxed);
    return fence;
  }

  // Called while no other thread uses the device (before and after the replay).
  void reset() {
    allocs_ = 0;
    releases_ = 0;
    fence_records_ = 0;
    peak_ = held_.load();
  }
  Meters meters() const {
    return {held_.load(), peak_.load(), allocs_.load(), releases_.load(), fence_records_.load()};
  }

 private:
  std::atomic<std::uint64_t> allocs_{0}, releases_{0}, fence_records_{0};
  std::atomic<std::uint64_t> held_{0}, peak_{0};
};

class PoolsAllocator final : public ReplayAllocator {
 public:
  explicit PoolsAllocator(std::uint64_t device_memory)
      : host_(device_memory, 512), metered_(host_), manager_(metered_, options()) {
    // What the library does for a program whose work is one ordered queue, as every trace's is.
    manager_.set_stream_ordered(true);
  }

  void* allocate(std::uint64_t size) override {
    const Reservation r = manager_.allocate(size);
    if (r.ptr == 0) {
      last_failure_ = describe(r.error);
      return nullptr;
    }
    return reinterpret_cast<void*>(r.ptr);
  }

  bool release(void* ptr, std::uint64_t) override {
    const FreeOutcome outcome = manager_.free(reinterpret_cast<DevicePtr>(ptr));
    if (outcome == FreeOutcome::freed) return true;
    last_failure_ = "the manager did not free the pointer (outcome " +
                    std::to_string(static_cast<int>(outcome)) + ")";
    return false;
  }

  std::string failure() override { return last_failure_; }
  void reset_meters() override { metered_.reset(); }
  Meters meters() override { return metered_.meters(); }

 private:
  static ManagerOptions options() {
    ManagerOptions o;
    o.thread_cache = true;  // the library's defaults
    o.hold_percent = kDefaultHoldPercent;
    const unsigned cpus = std::thread::hardware_concurrency();
    o.shards = cpus <= 1 ? 1 : 1 + std::min(cpus, 4u);
    return o;
  }

  HostDevice host_;
  MeteredDevice metered_;
  MemoryManager manager_;
  static thread_local std::string last_failure_;
};

thread_local std::string PoolsAllocator::last_failure_;

}  // namespace
}  // namespace poolcuda::bench

int main(int argc, char** argv) {
  using namespace poolcuda::bench;
  return replay_main(argc, argv, "poolcuda_replay_pools", {"pools", "harness"},
                     [](const ReplayArgs& args, std::string&) -> std::unique_ptr<ReplayAllocator> {
                       if (args.allocator == "harness") return make_null_allocator();
                       return std::make_unique<PoolsAllocator>(args.device_memory);
                     });
}
