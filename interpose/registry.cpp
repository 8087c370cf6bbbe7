// The process-wide registry of per-device managers (see registry.h).
//
// Managers are published through an array of atomic pointers so that the hot path is one
// acquire load and then the manager's own lock; the creation mutex is taken only while a device
// has no manager yet. Nothing here is ever freed (Note [Exit] in lifecycle.cpp).
//
// Depends on pools/, the CUDA device, the log and the configuration.
#include "interpose/registry.h"

#include "interpose/lifecycle.h"
#include "interpose/log.h"

namespace poolcuda {

namespace {

bool in_range(int device) { return device >= 0 && device < Registry::kMaxDevices; }

}  // namespace

Registry& Registry::instance() {
  // Allocated once and never deleted: late frees after exit handlers still find it.
  static Registry* registry = new Registry;
  return *registry;
}

MemoryManager* Registry::manager(int device) const {
  if (!in_range(device)) return nullptr;
  return managers_[device].load(std::memory_order_acquire);
}

CudaDevice* Registry::device(int device) const {
  if (!in_range(device)) return nullptr;
  return devices_[device].load(std::memory_order_acquire);
}

MemoryManager* Registry::manager_or_create(int device) {
  if (!in_range(device)) return nullptr;
  if (MemoryManager* existing = managers_[device].load(std::memory_order_acquire)) return existing;

  std::lock_guard<std::mutex> hold(create_mutex_);
  if (MemoryManager* existing = managers_[device].load(std::memory_order_relaxed)) return existing;

  auto* cuda_device = new CudaDevice(device, streams_);
  if (cuda_device->total_bytes() == 0) {
    delete cuda_device;
    if (first_time(Once::unreadable_size, device)) {
      log_format(LogLevel::basic,
                 "device %d: cannot read its memory size; passing its allocations to cudaMalloc "
                 "until it can be read",
                 device);
    }
    return nullptr;
  }
  const Config& conf = config();
  ManagerOptions options;
  options.device_index = device;
  options.layout = conf.pools;
  options.persistent = conf.persistent;
  options.free_fence = conf.free_fence;
  options.fence_slack = conf.fence_slack;
  options.log = conf.log;
  options.log_sink = [](LogLevel level, std::string_view message) { log_line(level, message); };
  auto* manager = new MemoryManager(*cuda_device, options);
  devices_[device].store(cuda_device, std::memory_order_release);
  managers_[device].store(manager, std::memory_order_release);
  log_format(LogLevel::full, "device %d: pools created (%llu bytes of device memory)", device,
             static_cast<unsigned long long>(cuda_device->total_bytes()));
  return manager;
}

ManagedSlabs* Registry::managed(int device) const {
  if (!in_range(device)) return nullptr;
  return managed_[device].load(std::memory_order_acquire);
}

ManagedSlabs* Registry::managed_or_create(int device) {
  if (!in_range(device)) return nullptr;
  if (ManagedSlabs* existing = managed_[device].load(std::memory_order_acquire)) return existing;
  const Config& conf = config();
  if (!conf.managed || managed_supported_.load(std::memory_order_acquire) == 0) return nullptr;
  if (manager_or_create(device) == nullptr) return nullptr;

  std::lock_guard<std::mutex> hold(create_mutex_);
  if (ManagedSlabs* existing = managed_[device].load(std::memory_order_relaxed)) return existing;
  if (managed_supported_.load(std::memory_order_relaxed) < 0) {
    managed_supported_.store(CudaManagedBacking::every_device_concurrent(device) ? 1 : 0,
                             std::memory_order_release);
  }
  if (managed_supported_.load(std::memory_order_relaxed) == 0) {
    if (first_time(Once::managed_unpooled, device)) {
      log_format(LogLevel::basic,
                 "not every device has concurrent managed access; cudaMallocManaged passes "
                 "through");
    }
    return nullptr;
  }
  auto* backing = new CudaManagedBacking(*devices_[device].load(std::memory_order_relaxed));
  ManagedOptions options;
  options.slab_size = conf.managed_slab;
  options.granule = CudaDevice::kAlignment;
  options.fences = conf.free_fence != FreeFence::none;
  auto* chain = new ManagedSlabs(*backing, options);
  managed_backings_[device].store(backing, std::memory_order_release);
  managed_[device].store(chain, std::memory_order_release);
  if (device >= managed_bound_.load(std::memory_order_relaxed)) {
    managed_bound_.store(device + 1, std::memory_order_release);
  }
  return chain;
}

void Registry::forget_managed(int device) {
  if (ManagedSlabs* chain = managed(device)) {
    chain->forget();
    managed_backings_[device].load(std::memory_order_acquire)->forget();
  }
}

bool Registry::trim_managed(int device) {
  ManagedSlabs* chain = managed(device);
  return chain != nullptr && chain->trim() != 0;
}

void Registry::count_forwarded_managed(int device) {
  if (in_range(device)) forwarded_managed_[device].fetch_add(1, std::memory_order_relaxed);
}

void Registry::count_forwarded_malloc(int device) {
  if (in_range(device)) forwarded_mallocs_[device].fetch_add(1, std::memory_order_relaxed);
}

void Registry::count_forwarded_free(int device) {
  if (in_range(device)) forwarded_frees_[device].fetch_add(1, std::memory_order_relaxed);
}

bool Registry::first_time(Once what, int device) {
  if (!in_range(device)) return false;
  return !logged_[static_cast<int>(what)][device].exchange(true, std::memory_order_relaxed);
}

std::vector<ManagerReport> Registry::reports() const {
  std::vector<ManagerReport> out;
  for (int device = 0; device < kMaxDevices; ++device) {
    MemoryManager* manager = managers_[device].load(std::memory_order_acquire);
    if (manager == nullptr) continue;
    out.push_back(manager->report());
    out.back().device = device;
    out.back().forwarded_mallocs = forwarded_mallocs_[device].load(std::memory_order_relaxed);
    out.back().forwarded_frees = forwarded_frees_[device].load(std::memory_order_relaxed);
    const std::uint64_t passed = forwarded_managed_[device].load(std::memory_order_relaxed);
    ManagedSlabs* chain = managed_[device].load(std::memory_order_acquire);
    if (chain != nullptr || passed != 0) {
      out.back().managed = chain != nullptr ? chain->report() : ManagedReport{};
      out.back().managed->passed_through = passed;
    }
  }
  return out;
}

}  // namespace poolcuda
