// Runtime stand-in entry points for devices (their limits included), errors and versions, plus
// the stand-in-only C API of simcuda.h. Each entry point is a guard (bind the primary context,
// honour the sticky error) and a call into the core (the limits: into the driver); error codes
// go through record_error for cudaGetLastError.
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "rt_common.h"
#include "rt_driver.h"
#include "simcuda.h"

using namespace poolcuda::sim;

namespace {

constexpr int kVersion = 13000;

void fill_properties(cudaDeviceProp* p, int device) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "simcuda device %d", device);
  p->uuid.bytes[0] = static_cast<char>(device + 1);
  p->totalGlobalMem = config().memory;
  p->sharedMemPerBlock = 48 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->memPitch = 2147483647;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->totalConstMem = 64 << 10;
  p->major = 9;
  p->minor = 0;
  p->textureAlignment = 512;
  p->texturePitchAlignment = 32;
  p->multiProcessorCount = kMultiprocessors;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->pciBusID = device + 1;
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = kThreadsPerMultiprocessor;
  p->streamPrioritiesSupported = 1;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = 1;
  p->concurrentManagedAccess = config().concurrent_managed ? 1 : 0;
  p->pageableMemoryAccess = 0;
  p->directManagedMemAccessFromHost = 0;
  p->maxBlocksPerMultiProcessor = 32;
  p->memoryPoolsSupported = 1;
  p->hostRegisterSupported = 1;
}

// Peer access enabled, as (accessing device, peer) pairs. The stand-in's streams reach every
// device's memory anyway; this keeps the calls' answers right.
struct PeerAccess {
  std::mutex mutex;
  std::set<std::pair<int, int>> enabled;
};

PeerAccess& peer_access() {
  static auto* p = new PeerAccess;  // never destroyed: worker threads may outlive exit
  return *p;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return record_error(cudaErrorInvalidValue);
  *count = config().devices;
  if (config().devices == 0) return record_error(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device))
    return record_error(config().devices == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  current_device() = device;
  runtime_bind(device);
  if (cudaError_t sticky = sticky_error()) return record_error(sticky);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return record_error(cudaErrorInvalidValue);
  if (config().devices == 0) return record_error(cudaErrorNoDevice);
  if (config().get_device_binds) {
    runtime_touch();
  } else {
    set_driver_initialized();
  }
  *device = current_device();
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  SIM_ENTER();
  if (!prop) return record_error(cudaErrorInvalidValue);
  if (!valid_device(device)) return record_error(cudaErrorInvalidDevice);
  fill_properties(prop, device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  SIM_ENTER();
  if (!value) return record_error(cudaErrorInvalidValue);
  if (!valid_device(device)) return record_error(cudaErrorInvalidDevice);
  cudaDeviceProp p;
  fill_properties(&p, device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrTextureAlignment: *value = static_cast<int>(p.textureAlignment); break;
    case cudaDevAttrTexturePitchAlignment: *value = static_cast<int>(p.texturePitchAlignment); break;
    case cudaDevAttrMaxPitch: *value = static_cast<int>(p.memPitch); break;
    case cudaDevAttrConcurrentManagedAccess: *value = p.concurrentManagedAccess; break;
    case cudaDevAttrManagedMemory: *value = p.managedMemory; break;
    case cudaDevAttrUnifiedAddressing: *value = p.unifiedAddressing; break;
    case cudaDevAttrMemoryPoolsSupported: *value = p.memoryPoolsSupported; break;
    case cudaDevAttrPciBusId: *value = p.pciBusID; break;
    case cudaDevAttrCanMapHostMemory: *value = p.canMapHostMemory; break;
    case cudaDevAttrPageableMemoryAccess: *value = p.pageableMemoryAccess; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrConcurrentKernels: *value = p.concurrentKernels; break;
    case cudaDevAttrAsyncEngineCount: *value = p.asyncEngineCount; break;
    case cudaDevAttrStreamPrioritiesSupported: *value = p.streamPrioritiesSupported; break;
    case cudaDevAttrTotalConstantMemory: *value = static_cast<int>(p.totalConstMem); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    default:
      // Every attribute the headers define but the stand-in does not model reads as 0.
      if (attr < cudaDevAttrMaxThreadsPerBlock || attr >= cudaDevAttrMax)
        return record_error(cudaErrorInvalidValue);
      *value = 0;
  }
  return cudaSuccess;
}

// There is no cudaDevAttr for the capacity: total memory comes from cudaMemGetInfo and
// cudaGetDeviceProperties (totalGlobalMem), as on the real runtime.

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  SIM_ENTER();
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  bump(Counter::cudaDeviceSynchronize);
  SIM_ENTER();
  int device = current_device();
  {
    std::lock_guard lock(state_mutex());
    if (invalidate_device_captures_locked(device))
      return record_error(cudaErrorStreamCaptureUnsupported);
  }
  device_drain(device);
  SIM_RETURN(sticky_error());  // a fault in the work just waited for is reported here
}

// The heap, printf FIFO and stack sizes reserve device memory: through the driver, as the real
// runtime does (rt_driver.h).
cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value) {
  SIM_ENTER();
  SIM_RETURN(via_driver::device_set_limit(limit, value));
}

cudaError_t cudaDeviceGetLimit(size_t* pValue, cudaLimit limit) {
  SIM_ENTER();
  SIM_RETURN(via_driver::device_get_limit(pValue, limit));
}

// Also returns the device's limits to their defaults (limits.cpp).
cudaError_t cudaDeviceReset(void) {
  if (config().devices == 0) return record_error(cudaErrorNoDevice);
  runtime_touch();
  if (rt::kStaticRuntime) {
    if (cudaError_t err = via_driver::device_reset(current_device()); err != cudaSuccess)
      return record_error(err);
  } else {
    device_reset(current_device());
  }
  {
    PeerAccess& p = peer_access();
    std::lock_guard lock(p.mutex);
    std::erase_if(p.enabled, [](const auto& pair) { return pair.first == current_device(); });
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer) {
  if (!can_access) return record_error(cudaErrorInvalidValue);
  if (!valid_device(device) || !valid_device(peer)) return record_error(cudaErrorInvalidDevice);
  *can_access = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  SIM_ENTER();
  if (flags != 0) SIM_RETURN(cudaErrorInvalidValue);
  if (!valid_device(peer) || peer == current_device()) SIM_RETURN(cudaErrorInvalidDevice);
  PeerAccess& p = peer_access();
  std::lock_guard lock(p.mutex);
  if (!p.enabled.emplace(current_device(), peer).second)
    SIM_RETURN(cudaErrorPeerAccessAlreadyEnabled);
  SIM_RETURN(cudaSuccess);
}

cudaError_t cudaDeviceDisablePeerAccess(int peer) {
  SIM_ENTER();
  if (!valid_device(peer) || peer == current_device()) SIM_RETURN(cudaErrorInvalidDevice);
  PeerAccess& p = peer_access();
  std::lock_guard lock(p.mutex);
  if (p.enabled.erase({current_device(), peer}) == 0) SIM_RETURN(cudaErrorPeerAccessNotEnabled);
  SIM_RETURN(cudaSuccess);
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return record_error(cudaErrorInvalidValue);
  *version = kVersion;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return record_error(cudaErrorInvalidValue);
  *version = kVersion;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  if (cudaError_t sticky = sticky_error()) return sticky;
  cudaError_t e = last_error();
  last_error() = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  if (cudaError_t sticky = sticky_error()) return sticky;
  return last_error();
}

const char* cudaGetErrorName(cudaError_t error) {
  const char* name = error_name(error);
  return name ? name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const char* text = error_string(error);
  return text ? text : "unrecognized error code";
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* driverStatus) {
  SIM_ENTER();
  SIM_RETURN(rt::driver_entry(symbol, funcPtr, CUDART_VERSION, flags, driverStatus));
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  SIM_ENTER();
  SIM_RETURN(rt::driver_entry(symbol, funcPtr, cudaVersion, flags, driverStatus));
}

namespace {

// The per-thread-default-stream flavours (code built with --default-stream per-thread): the
// default lookup asks for the per-thread variants.
unsigned long long per_thread_default(unsigned long long flags) {
  constexpr auto kPerThread = static_cast<unsigned long long>(cudaEnablePerThreadDefaultStream);
  return flags == cudaEnableDefault ? kPerThread : flags;
}

}  // namespace

cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus) {
  SIM_ENTER();
  SIM_RETURN(rt::driver_entry(symbol, funcPtr, CUDART_VERSION, per_thread_default(flags),
                              driverStatus));
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus) {
  SIM_ENTER();
  SIM_RETURN(rt::driver_entry(symbol, funcPtr, cudaVersion, per_thread_default(flags),
                              driverStatus));
}

extern "C" {

__attribute__((visibility("default"))) uint64_t simcuda_counter(const char* name) {
  return counter_value(name);
}

__attribute__((visibility("default"))) void simcuda_reset_counters(void) { reset_counters(); }

__attribute__((visibility("default"))) void simcuda_set_sticky_error(int error) {
  set_sticky_error(static_cast<cudaError_t>(error));
}

}  // extern "C"
