// The library's own CUDA calls (see own_api.h).
//
// Note [Own calls without a runtime]
// A program built with nvcc's default static cudart, or one that uses only the driver API, has
// no libcudart.so: its allocations reach the library through the driver hooks, and the pools'
// own calls (growing a pool, fences, memory info) must then be made with the driver. The
// functions below give the runtime calls CudaDevice makes the same meaning over the driver:
// runtime and driver handles (streams, events) are the same objects, and the error codes the
// library looks at coincide (out of memory 2, not ready 600, invalid handle 400, context
// destroyed 709). The runtime's "current device" becomes the current context, restricted to
// primary contexts: an own call never runs in a context made with cuCtxCreate (cudaGetDevice
// fails there, so CudaDevice does nothing). The driver has no last-error slot to protect.
// Processes with a runtime keep using it, so their behaviour is exactly the runtime's.
//
// Note [Quiet growth]
// The runtime's last-error slot holds the most recent error of any runtime call on the thread,
// and no call can put an older value back: a failed runtime call replaces the program's pending
// error for good. Out of memory is the normal failure of a pool's growth, and the manager then
// gives idle pages back and retries, so the program's cudaMalloc can still succeed; plain CUDA
// would have left the slot alone (a successful call never touches it). A clean slot is easy:
// OwnCallScope clears what our call left there. A slot that holds the program's error is not,
// so then growth asks the driver (cuMemAlloc), whose results never reach the runtime's slot, in
// the context current on the thread. That is the context the runtime itself uses (its primary
// context, or one the program made current), so the memory is what the runtime's cudaMalloc
// would have given (cudaFree releases it alike) and out of memory has the same number. A thread
// the runtime has not bound a context to yet gets one from cudaFree(NULL), the documented way
// to initialize it, which succeeds on a working device. Whenever the driver's answer is
// anything but success or out of memory (no context, another device's context, no driver
// function), the runtime's cudaMalloc decides as before.
//
// Depends on real_cuda.h, real_driver.h and driver_context.h.
#include "interpose/own_api.h"

#include <atomic>

#include "interpose/driver_context.h"
#include "interpose/real_driver.h"

namespace poolcuda::own {

bool through_runtime() {
  // 0: not decided; 1: runtime; 2: driver.
  static std::atomic<int> choice{0};
  int decided = choice.load(std::memory_order_acquire);
  if (decided == 0) {
    int expected = 0;
    choice.compare_exchange_strong(expected, real::runtime_loaded() ? 1 : 2,
                                   std::memory_order_acq_rel);
    decided = choice.load(std::memory_order_acquire);
  }
  return decided == 1;
}

// Note [Resolved before any lock]
// A real function is looked up at its first call, with the C library's dlsym or the driver's
// resolver, and both take the dynamic loader's lock. The pools make some calls with a shard's
// lock held (a growth's cudaMalloc, a fence's event). A dlopen holds the loader's lock while the
// new library's constructors run, and one that allocates waits for the shard's lock (or the
// registry's, while the device's pools are made): a first call there would wait for the loader
// forever. So before a device's pools are made, with no lock of the library's held, every
// function the library may call on its own behalf is looked up once.
void resolve_all() {
  static std::atomic<bool> done{false};
  if (done.load(std::memory_order_acquire)) return;
  if (through_runtime()) {
#define POOLCUDA_OWN_RESOLVE(name) (void)real::name();
    POOLCUDA_OWN_FUNCTIONS(POOLCUDA_OWN_RESOLVE)
    POOLCUDA_OWN_RESOLVE(cudaPointerGetAttributes)
    POOLCUDA_OWN_RESOLVE(cudaMallocManaged)
    POOLCUDA_OWN_RESOLVE(cudaGetDeviceCount)
    POOLCUDA_OWN_RESOLVE(cudaDeviceGetAttribute)
#undef POOLCUDA_OWN_RESOLVE
  }
  // With no driver loaded yet, the next device's pools try again.
  if (real_driver::resolve_all()) done.store(true, std::memory_order_release);
}

namespace {

// The context the runtime uses on this thread, binding it first when there is none (Note [Quiet
// growth]).
driver::CurrentContext runtime_context() {
  driver::CurrentContext current = driver::current_context();
  if (current.handle != nullptr) return current;
  if (real::cudaFree()(nullptr) != cudaSuccess) return current;
  return driver::current_context();
}

}  // namespace

cudaError_t quiet_malloc(void** ptr, std::size_t size) {
  if (!through_runtime()) return via_driver::cudaMalloc(ptr, size);
  int device = -1;
  if (real::cudaPeekAtLastError()() != cudaSuccess && real::cudaGetDevice()(&device) == cudaSuccess &&
      runtime_context().device == device) {
    const CUresult result =
        real_driver::cuMemAlloc_v2()(reinterpret_cast<CUdeviceptr*>(ptr), size);
    if (result == CUDA_SUCCESS) return cudaSuccess;
    if (result == CUDA_ERROR_OUT_OF_MEMORY) return cudaErrorMemoryAllocation;
  }
  return real::cudaMalloc()(ptr, size);
}

namespace via_driver {

namespace {

cudaError_t as_runtime(CUresult result) { return static_cast<cudaError_t>(result); }
CUstream as_driver(cudaStream_t stream) { return reinterpret_cast<CUstream>(stream); }
CUevent as_driver(cudaEvent_t event) { return reinterpret_cast<CUevent>(event); }

cudaError_t malloc(void** ptr, std::size_t size) {
  return as_runtime(real_driver::cuMemAlloc_v2()(reinterpret_cast<CUdeviceptr*>(ptr), size));
}

cudaError_t free(void* ptr) {
  return as_runtime(real_driver::cuMemFree_v2()(reinterpret_cast<CUdeviceptr>(ptr)));
}

cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  return as_runtime(real_driver::cuMemGetInfo_v2()(free_bytes, total_bytes));
}

cudaError_t synchronize() { return as_runtime(real_driver::cuCtxSynchronize()()); }

cudaError_t is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return as_runtime(real_driver::cuStreamIsCapturing()(
      as_driver(stream), reinterpret_cast<CUstreamCaptureStatus*>(status)));
}

cudaError_t exchange_capture_mode(cudaStreamCaptureMode* mode) {
  return as_runtime(real_driver::cuThreadExchangeStreamCaptureMode()(
      reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

// CUDA_ERROR_INVALID_CONTEXT has the runtime's number cudaErrorDeviceUninitialized.
cudaError_t get_device(int* device) {
  driver::CurrentContext current = driver::current_context();
  if (!current.primary) return cudaErrorDeviceUninitialized;
  *device = current.device;
  return cudaSuccess;
}

cudaError_t set_device(int device) {
  return driver::make_primary_current(device) ? cudaSuccess : cudaErrorDeviceUninitialized;
}

cudaError_t no_error() { return cudaSuccess; }

cudaError_t event_create(cudaEvent_t* event, unsigned int flags) {
  return as_runtime(real_driver::cuEventCreate()(reinterpret_cast<CUevent*>(event), flags));
}

cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) {
  return as_runtime(real_driver::cuEventRecord()(as_driver(event), as_driver(stream)));
}

cudaError_t event_query(cudaEvent_t event) {
  return as_runtime(real_driver::cuEventQuery()(as_driver(event)));
}

cudaError_t stream_query(cudaStream_t stream) {
  return as_runtime(real_driver::cuStreamQuery()(as_driver(stream)));
}

cudaError_t event_synchronize(cudaEvent_t event) {
  return as_runtime(real_driver::cuEventSynchronize()(as_driver(event)));
}

cudaError_t event_destroy(cudaEvent_t event) {
  return as_runtime(real_driver::cuEventDestroy_v2()(as_driver(event)));
}

cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return as_runtime(real_driver::cuStreamWaitEvent()(as_driver(stream), as_driver(event), flags));
}

cudaError_t stream_get_device(cudaStream_t stream, int* device) {
  return as_runtime(real_driver::cuStreamGetDevice()(as_driver(stream), device));
}

cudaError_t stream_get_capture_info(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                    unsigned long long* id, cudaGraph_t* graph,
                                    const cudaGraphNode_t** dependencies,
                                    const cudaGraphEdgeData** edges, std::size_t* count) {
  return as_runtime(real_driver::cuStreamGetCaptureInfo_v3()(
      as_driver(stream), reinterpret_cast<CUstreamCaptureStatus*>(status),
      reinterpret_cast<cuuint64_t*>(id), reinterpret_cast<CUgraph*>(graph),
      reinterpret_cast<const CUgraphNode**>(dependencies),
      reinterpret_cast<const CUgraphEdgeData**>(edges), count));
}

cudaError_t user_object_create(cudaUserObject_t* object, void* ptr, cudaHostFn_t destroy,
                               unsigned int refcount, unsigned int flags) {
  return as_runtime(real_driver::cuUserObjectCreate()(reinterpret_cast<CUuserObject*>(object),
                                                      ptr, destroy, refcount, flags));
}

cudaError_t user_object_release(cudaUserObject_t object, unsigned int count) {
  return as_runtime(
      real_driver::cuUserObjectRelease()(reinterpret_cast<CUuserObject>(object), count));
}

cudaError_t graph_retain_user_object(cudaGraph_t graph, cudaUserObject_t object,
                                     unsigned int count, unsigned int flags) {
  return as_runtime(real_driver::cuGraphRetainUserObject()(
      reinterpret_cast<CUgraph>(graph), reinterpret_cast<CUuserObject>(object), count, flags));
}

}  // namespace

decltype(&::cudaMalloc) const cudaMalloc = &malloc;
decltype(&::cudaFree) const cudaFree = &free;
decltype(&::cudaMemGetInfo) const cudaMemGetInfo = &mem_get_info;
decltype(&::cudaDeviceSynchronize) const cudaDeviceSynchronize = &synchronize;
decltype(&::cudaStreamIsCapturing) const cudaStreamIsCapturing = &is_capturing;
decltype(&::cudaThreadExchangeStreamCaptureMode) const cudaThreadExchangeStreamCaptureMode =
    &exchange_capture_mode;
decltype(&::cudaGetDevice) const cudaGetDevice = &get_device;
decltype(&::cudaSetDevice) const cudaSetDevice = &set_device;
decltype(&::cudaGetLastError) const cudaGetLastError = &no_error;
decltype(&::cudaPeekAtLastError) const cudaPeekAtLastError = &no_error;
decltype(&::cudaEventCreateWithFlags) const cudaEventCreateWithFlags = &event_create;
decltype(&::cudaEventRecord) const cudaEventRecord = &event_record;
decltype(&::cudaEventQuery) const cudaEventQuery = &event_query;
decltype(&::cudaStreamQuery) const cudaStreamQuery = &stream_query;
decltype(&::cudaEventSynchronize) const cudaEventSynchronize = &event_synchronize;
decltype(&::cudaEventDestroy) const cudaEventDestroy = &event_destroy;
decltype(&::cudaStreamWaitEvent) const cudaStreamWaitEvent = &stream_wait_event;
decltype(&::cudaStreamGetDevice) const cudaStreamGetDevice = &stream_get_device;
decltype(&::cudaStreamGetCaptureInfo) const cudaStreamGetCaptureInfo = &stream_get_capture_info;
decltype(&::cudaUserObjectCreate) const cudaUserObjectCreate = &user_object_create;
decltype(&::cudaUserObjectRelease) const cudaUserObjectRelease = &user_object_release;
decltype(&::cudaGraphRetainUserObject) const cudaGraphRetainUserObject =
    &graph_retain_user_object;

}  // namespace via_driver

}  // namespace poolcuda::own
