// The process-wide registry of per-device managers (see registry.h).
//
// Managers are published through an array of atomic pointers so that the hot path is one
// acquire load and then the manager's own lock; the creation mutex is taken only while a device
// has no manager yet. Nothing here is ever freed (Note [Exit] in lifecycle.cpp).
//
// Depends on pools/, the CUDA device, the log and the configuration.
#include "interpose/registry.h"

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "interpose/lifecycle.h"
#include "interpose/budget.h"
#include "interpose/log.h"
#include "interpose/own_api.h"
#include "interpose/release_worker.h"
#include "interpose/stream_order.h"
#include "interpose/threads.h"
#include "pools/wait_bound.h"

namespace poolcuda {

static_assert(Registry::kMaxDevices <= ReleaseWorker::kMaxDevices,
              "every device the registry pools has a release lane");

namespace {

// shards:auto: the first shard and one more per CPU the process may run on, at most 4 more
// (Note [Shards] in pools/manager_shards.cpp: more threads than CPUs cannot all reserve at
// once). One CPU: one shard. Linux keeps a CPU mask per thread, and a program may pin each of
// its threads to a CPU of its own (a pinned data-loading thread, an OpenMP binding), so the
// CPUs are the union of every program thread's mask now (program_cpus()). When no mask can be
// read (a mask wider than cpu_set_t's 1024 CPUs, a filtered system call), the CPUs online count.
// A device smaller than kShardsMinDevice keeps one shard: each shard holds partly used pages
// of its own, and near a full small device the free bytes inside other shards' pages were what
// a request lacked (a 256 MiB stand-in device refused an 8 MiB request with 27 MB free inside
// pages, where the plain run had room: docs/differential-test.md).
constexpr std::uint64_t kShardsMinDevice = std::uint64_t{1} << 30;

std::uint32_t auto_shards(std::uint64_t device_bytes) {
  if (device_bytes != 0 && device_bytes < kShardsMinDevice) return 1;
  cpu_set_t all;
  const long cpus = program_cpus(&all) ? CPU_COUNT(&all) : ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus <= 1) return 1;
  return 1 + static_cast<std::uint32_t>(std::min(cpus, 4L));
}

}  // namespace

// Note [Pools made ahead]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Making a device's pools (its CudaDevice, the first shard's pools, the capture policy) takes
// about half a millisecond of host work on the 2-core build machine, and it used to be the first
// cudaMalloc's, which the program times and plain CUDA answers in a quarter of that. Programs
// make their CUDA context with cudaFree(NULL) before they allocate, a call that already costs
// far more than that on a GPU, so the runtime's cudaFree(NULL) builds the pools now (prepare();
// a program with a static runtime still builds them at its first allocation). They are kept
// aside, not announced: the device counts as used only from its first allocation (or capture,
// reset or stream made on it: whatever calls manager_or_create()), as before. What announcing
// does depends on the devices the program has used (sole_device(), which a free trusts to
// search first, and the stream order of free_fence:auto, which treats the first device used
// apart from later ones), and a program that makes a context on device 0 and allocates only on
// device 1 must see exactly what it saw without the early build. So create_manager() takes the
// prepared objects if there are any and announces them. One figure of the build depends on when
// it runs: shards:auto counts the CPUs of the program's threads, which a program may pin or
// widen after making its context; create_manager() counts them again, and builds anew if the
// count changed; the recount reads the threads' CPU masks only (program_cpus() reads the online
// count once per process). The pools' first records (a chunk of slice records and one of page
// records, made by Impl's constructor) come with the build. These two took a process's first
// cudaMalloc after cudaFree(NULL) and a 20 ms pause from 167 to 130 us (medians of 61
// interleaved runs; the stand-in alone takes 55 to 110 us there). A device whose pools were
// prepared and that never allocates costs host memory only (no device memory, no event, no
// thread). cudaFree(NULL) takes the creation lock while its device has no published pools, so it
// may wait for another thread's creation, as a first cudaMalloc does.

bool Registry::build(int device, bool quiet, Built* out) {
  // First, as it may throw: nothing is made yet that would be lost.
  ReleaseWorker::instance().add_lane(device);
  auto* cuda_device = new CudaDevice(device, streams_);
  if (cuda_device->total_bytes() == 0) {
    delete cuda_device;
    if (!quiet && first_time(Once::unreadable_size, device)) {
      log_format(LogLevel::basic,
                 "device %d: cannot read its memory size; passing its allocations to the driver "
                 "until it can be read",
                 device);
    }
    return false;
  }
  const Config& conf = config();
  ManagerOptions options;
  options.device_index = device;
  options.layout = conf.pools;
  options.persistent = conf.persistent;
  options.free_fence = conf.free_fence;
  options.fence_slack = conf.fence_slack;
  options.hold_percent = conf.hold_percent;
  options.thread_cache = conf.thread_cache;
  options.shards = conf.shards != 0 ? conf.shards : auto_shards(cuda_device->total_bytes());
  out->auto_shards = conf.shards != 0 ? 0 : options.shards;
  options.log = conf.log;
  options.log_sink = [](LogLevel level, std::string_view message) { log_line(level, message); };
  // Said only if the driver refuses the request too (pooling::forward).
  options.refusal_sink = [](std::string message) { keep_line(std::move(message)); };
  auto* manager = new MemoryManager(*cuda_device, options);
  out->device = cuda_device;
  out->manager = manager;
  out->capture = new CapturePolicy(*manager, CaptureOptions{conf.capture_share});
  return true;
}

void Registry::prepare(int device) {
  if (!in_range(device) || manager(device) != nullptr) return;
  // The program's cudaFree(NULL) succeeded whatever happens here: a failure leaves the building
  // to the first allocation, which reports it.
  try {
    own::resolve_all();  // before the creation lock: Note [Resolved before any lock]
    std::lock_guard<RankedMutex> hold(create_mutex_);
    if (managers_[device].load(std::memory_order_relaxed) != nullptr ||
        prepared_[device].manager != nullptr)
      return;
    Built built;
    if (build(device, /*quiet=*/true, &built)) prepared_[device] = built;
  } catch (const abi::__forced_unwind&) {
    throw;  // a cancellation (Note [Cancellation] in no_cancel.h)
  } catch (...) {
  }
}

MemoryManager* Registry::create_manager(int device) {
  if (!in_range(device)) return nullptr;
  own::resolve_all();  // before the creation lock: Note [Resolved before any lock]

  std::lock_guard<RankedMutex> hold(create_mutex_);
  if (MemoryManager* existing = managers_[device].load(std::memory_order_relaxed)) return existing;
  Built built = std::exchange(prepared_[device], Built{});
  if (built.auto_shards != 0 && auto_shards(built.device->total_bytes()) != built.auto_shards) {
    // The program's threads may run on other CPUs now than when the pools were built.
    delete built.capture;
    delete built.manager;
    delete built.device;
    built = Built{};
  }
  if (built.manager == nullptr && !build(device, /*quiet=*/false, &built)) return nullptr;
  devices_[device].store(built.device, std::memory_order_release);
  captures_[device].store(built.capture, std::memory_order_release);
  // Before the pools are published: a thread that allocates from them must find the device's
  // stream order settled, or its per-thread work goes uncounted (Note [Leaving among threads]
  // in stream_order.cpp).
  stream_order::device_added(device, *built.manager);
  // Published last: whoever finds the manager finds the device and the capture policy too.
  managers_[device].store(built.manager, std::memory_order_release);
  sole_device_.store(devices().size() == 1 ? device : -1, std::memory_order_release);
  log_format(LogLevel::full, "device %d: pools created (%llu bytes of device memory)", device,
             static_cast<unsigned long long>(built.device->total_bytes()));
  return built.manager;
}

ManagedSlabs* Registry::managed_or_create(int device) {
  if (!in_range(device)) return nullptr;
  if (ManagedSlabs* existing = managed_[device].load(std::memory_order_acquire)) return existing;
  const Config& conf = config();
  if (!conf.managed || managed_supported_.load(std::memory_order_acquire) == 0) return nullptr;
  if (manager_or_create(device) == nullptr) return nullptr;

  std::lock_guard hold(create_mutex_);
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
  // A slab is at most a 64th of the device (or of its budget): one small live allocation keeps
  // its whole slab, which on a small device would otherwise be most of it.
  const std::uint64_t device_bytes =
      devices_[device].load(std::memory_order_relaxed)->total_bytes();
  options.slab_size = device_bytes != 0
                          ? std::min<std::uint64_t>(conf.managed_slab, device_bytes / 64)
                          : conf.managed_slab;
  options.granule = CudaDevice::kAlignment;
  options.fences = conf.free_fence != FreeFence::none;
  auto* chain = new ManagedSlabs(*backing, options);
  for (std::uint32_t i = 0; i < managed_freezes_[device]; ++i) chain->freeze();  // a reset runs
  managed_backings_[device].store(backing, std::memory_order_release);
  managed_[device].store(chain, std::memory_order_release);
  if (device >= managed_bound_.load(std::memory_order_relaxed)) {
    managed_bound_.store(device + 1, std::memory_order_release);
  }
  return chain;
}

void Registry::forget_managed(int device) {
  if (ManagedSlabs* chain = managed(device)) chain->forget();
}

void Registry::freeze_managed(int device) {
  if (!in_range(device)) return;
  std::lock_guard hold(create_mutex_);
  ++managed_freezes_[device];
  if (ManagedSlabs* chain = managed(device)) chain->freeze();
}

void Registry::thaw_managed(int device) {
  if (!in_range(device)) return;
  std::lock_guard hold(create_mutex_);
  if (managed_freezes_[device] == 0) return;
  --managed_freezes_[device];
  if (ManagedSlabs* chain = managed(device)) chain->thaw();
}

void Registry::await_new_managed_slabs() const {
  for (int device = 0; device < managed_bound(); ++device)
    if (const ManagedSlabs* chain = managed(device)) chain->await_new_slab();
}

bool Registry::trim_managed(int device, WaitBound& bound) {
  ManagedSlabs* chain = managed(device);
  if (chain == nullptr || chain->trim(bound) == 0) return false;
  // Again after a stop (Note [Stopped processes] in pools/wait_bound.h).
  bound.retry([&] { return ReleaseWorker::instance().flush(device, bound.left_micros()); });
  return true;
}

PassthroughCounters* Registry::passthrough(int device) {
  return in_range(device) ? &passthrough_[device] : nullptr;
}

bool Registry::first_time(Once what, int device) {
  if (!in_range(device)) return false;
  return !logged_[static_cast<int>(what)][device].exchange(true, std::memory_order_relaxed);
}

std::vector<int> Registry::devices() const {
  std::vector<int> out;
  for (int device = 0; device < kMaxDevices; ++device) {
    if (managers_[device].load(std::memory_order_acquire) != nullptr) out.push_back(device);
  }
  return out;
}

ManagerReport Registry::report(int device) const {
  // Graphs already gone give their memory back first, so that neither the pools' numbers nor
  // the capture section count it as pinned.
  if (CapturePolicy* policy = capture(device)) policy->drain_releases();
  ManagerReport out = managers_[device].load(std::memory_order_acquire)->report();
  out.device = device;
  return out;
}

ReportDocument Registry::document(const ReportHeader& header,
                                  const std::vector<ManagerReport>& managers) const {
  ReportDocument doc = make_document(header, managers);
  for (std::size_t i = 0; i < managers.size(); ++i) {
    const PassthroughCounters& counters = passthrough_[managers[i].device];
    ReportSection& section = doc.devices[i].child("passed_through", "passed through to CUDA");
#define POOLCUDA_FIELD(member, key, label) \
  section.add(key, label, ReportValue::of(Unit::count, counters.member.load(std::memory_order_relaxed)));
    POOLCUDA_PASSTHROUGH_COUNTERS(POOLCUDA_FIELD)
#undef POOLCUDA_FIELD
    if (ManagedSlabs* chain = managed(managers[i].device))
      doc.devices[i].sections.push_back(describe(chain->report()));
    if (std::optional<ReportSection> limit = budget::describe(managers[i].device))
      doc.devices[i].sections.push_back(std::move(*limit));
    // The capture part, once the device has seen a capture.
    if (CapturePolicy* policy = capture(managers[i].device)) {
      const CaptureStats stats = policy->stats();
      if (stats.captures + stats.failed_captures + stats.open_captures != 0)
        doc.devices[i].sections.push_back(describe(stats));
    }
  }
  return doc;
}

}  // namespace poolcuda
