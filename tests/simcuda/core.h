// The CUDA stand-in's core: configuration, counters, device memory arenas, streams with their
// worker threads, events, the race detector, capture state, graphs and user objects, contexts
// and their limits, the memory code takes. Both stand-in libraries (libcudart.so.13 and
// libcuda.so.1) are thin shims over this one shared library, so the runtime and the driver see
// the same devices, memory and streams.
//
// Locking (see Note [Lock order]): state_mutex() guards registries, capture state and event
// record state; each Stream has its own queue mutex; memory, user objects and the race detector
// have leaf mutexes of their own; context limits and code memory have one each, taken before
// memory's. Nothing waits for a stream while holding state_mutex(). This layer must not depend
// on the exported shims (rt_*.cpp, drv_api.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace poolcuda::sim {

// Note [Lock order]
// state_mutex -> Stream::m -> {mem, user objects, race, event time} (leaves); limits -> mem;
// code -> mem. A worker thread runs an operation with no lock held; an operation may take
// state_mutex (e.g. to release a graph), so enqueueing code must never wait on a stream while
// holding state_mutex.

// Every device's shape as both APIs report it (an H100 SXM or H200): multiprocessors, and the
// threads one holds at once. The context limits' stacks are sized from them.
inline constexpr int kMultiprocessors = 132;
inline constexpr int kThreadsPerMultiprocessor = 2048;

struct Config {
  int devices = 1;
  size_t memory = size_t{16} << 30;
  unsigned op_delay_us = 0;
  unsigned free_delay_us = 0;  // a free's driver latency before it looks the pointer up
  unsigned freed_delay_us = 0;  // what a free takes to return once the memory is free
  unsigned lookup_delay_us = 0;  // what each cuGetProcAddress takes
  unsigned refusal_delay_us = 0;  // what an allocation refused for lack of memory takes
  unsigned destructor_delay_us = 0;  // what the internal thread takes before each destructor
  // A destroyed stream's handle value goes to the next stream created, as a real driver's
  // freed stream object may (SIMCUDA_REUSE_STREAM_HANDLES).
  bool reuse_stream_handles = false;
  bool strict = false;
  bool concurrent_managed = true;  // every device's cudaDevAttrConcurrentManagedAccess
  // Whether cudaGetDevice binds the primary context to a thread that has none, as every other
  // runtime entry does (SIMCUDA_GET_DEVICE_BINDS=0: it only reads the thread's device, as a real
  // runtime's query may).
  bool get_device_binds = true;
  // The device memory one module of code takes when loaded, by a kernel's first use on a
  // device or explicitly (SIMCUDA_CODE_BYTES; Note [Code memory] in code.cpp).
  size_t code_bytes = 0;
  // Whether explicit module and library loads defer their kernels' and variables' memory to each
  // one's first use (CUDA_MODULE_LOADING=LAZY; unset or EAGER: loaded with the module).
  bool lazy_loading = false;
};
const Config& config();
// Waits config().free_delay_us: the latency of cudaFree / cuMemFree before the lookup.
void free_latency();
// `err`, after config().freed_delay_us when it is cudaSuccess: how long cudaFree / cuMemFree
// take to return once they freed the memory, whose address another allocation may get
// meanwhile. Called with no lock of the stand-in's held.
cudaError_t after_free(cudaError_t err);
// Waits config().lookup_delay_us: the latency of one cuGetProcAddress.
void lookup_latency();
// `err`, after config().refusal_delay_us when it is cudaErrorMemoryAllocation: how long an
// allocation call refused for lack of memory takes to return once it found the device full (the
// runtime's and driver's allocations, cuMemCreate, arrays and code loads; not a memory pool's or
// limits). Called with no lock of the stand-in's held, so that frees go on meanwhile.
cudaError_t after_refusal(cudaError_t err);
// Parses "123", "4K", "16G"...; false on malformed text.
bool parse_size(const char* text, size_t* out);

enum class Counter {
  races,
  cudaMalloc,
  cudaFree,
  cudaMallocManaged,
  cuMemAlloc,
  cuMemFree,
  cudaEventRecord,
  cudaStreamSynchronize,
  cudaDeviceSynchronize,
  cudaMemPrefetchBatchAsync,
  cudaMemDiscardBatchAsync,
  cudaMemDiscardAndPrefetchBatchAsync,
  cuMemCreate,
  cuMemRelease,
  cuArrayCreate,  // cuArrayCreate_v2 and cuArray3DCreate_v2
  cuArrayDestroy,
  cuMemAllocFromPoolAsync,
  cuMipmappedArrayCreate,
  cuMipmappedArrayDestroy,
  cuCtxSetLimit,
  cuCtxGetLimit,
  cuLaunchKernel,  // cuLaunchKernel and cuLaunchKernel_ptsz
  cudaMemGetInfo,
  count_
};
void bump(Counter c);
uint64_t counter_value(const char* name);
void reset_counters();

std::mutex& state_mutex();

// ---- Memory (memory.cpp) -------------------------------------------------------------------
enum class AllocKind { device, managed, async, graph };
struct AllocInfo {
  uintptr_t base = 0;
  size_t size = 0;
  int device = -1;
  AllocKind kind = AllocKind::device;
  uint64_t id = 0;
};
// Reserves `size` bytes of device `device`'s capacity; returns cudaErrorMemoryAllocation when the
// capacity (or the device's address range) is exhausted. size 0 yields a null pointer.
cudaError_t mem_alloc(int device, size_t size, AllocKind kind, void** out, uint64_t* id = nullptr);
// Replaces the allocation at `old` carrying `old_id` (none: `old` null, or no longer carrying
// that id, e.g. after a device reset) by one of `size` bytes on `device`, in one step: the new
// one must fit once the old one is given back, else cudaErrorMemoryAllocation and the old one
// stays. size 0 only gives the old one back (*out null, *id 0).
cudaError_t mem_replace(int device, const void* old, uint64_t old_id, size_t size, AllocKind kind,
                        void** out, uint64_t* id);
// Frees an allocation by its base address; interior or unknown pointers -> cudaErrorInvalidValue.
// When `id` is non-zero, frees only if the allocation still carries that id.
cudaError_t mem_free(const void* ptr, uint64_t id = 0, AllocInfo* freed = nullptr);
// Finds the live allocation containing ptr (interior pointers included).
bool mem_find(const void* ptr, AllocInfo* out);
// An IPC handle of the device allocation holding `ptr` (start or inside): "simipc" and NUL
// padding in bytes 0-7, the allocation's base in 8-15 and its id in 16-23, zeros after. False
// when `ptr` is in no device allocation (managed memory included).
bool mem_ipc_handle(const void* ptr, unsigned char handle[64]);
// True if ptr lies in some device's reserved address range (live or not).
bool mem_in_device_range(const void* ptr, int* device = nullptr);
// Checks that [ptr, ptr+n) is usable: device-range pointers must lie inside one live allocation.
cudaError_t mem_check(const void* ptr, size_t n);
void mem_free_all(int device);
void mem_info(int device, size_t* free_bytes, size_t* total_bytes);
uint64_t mem_live_allocations();
uint64_t mem_live_bytes();
// The most live_bytes reached since the last mem_reset_live_bytes_peak(), which sets it to the
// current live_bytes.
uint64_t mem_live_bytes_peak();
void mem_reset_live_bytes_peak();
// Copies and memsets (transfer.cpp) on stream s; `wait`: the synchronous forms, which wait for
// the copy and are refused on a capturing stream. `what` names the call for the race detector.
struct Stream;
cudaError_t mem_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                     const std::shared_ptr<Stream>& s, bool wait, const char* what);
cudaError_t mem_set(void* dst, int value, size_t n, const std::shared_ptr<Stream>& s, bool wait,
                    const char* what);
// Pinned host memory (cudaMallocHost / cudaHostAlloc).
cudaError_t host_alloc(size_t size, unsigned flags, void** out);
cudaError_t host_free(void* ptr);
bool host_find(const void* ptr, unsigned* flags = nullptr);

// ---- Errors and threads (state.cpp) --------------------------------------------------------
int& current_device();            // per host thread
cudaError_t sticky_error();       // process-wide, cudaSuccess when none
void set_sticky_error(cudaError_t e);
cudaError_t record_error(cudaError_t e);  // updates the thread's last error, returns e
cudaError_t& last_error();
const char* error_name(int code);
const char* error_string(int code);
bool valid_device(int device);

// ---- Race detector (race.cpp) --------------------------------------------------------------
struct Range {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool write = false;
};
void race_begin(uint64_t op_id, uint64_t stream_id, const std::string* desc,
                const std::vector<Range>* ranges);
void race_end(uint64_t op_id);
void race_report_at_exit();

// ---- Streams and events (stream.cpp) -------------------------------------------------------
struct Stream;
struct Event;
struct Capture;
struct Context;
using StreamRef = std::shared_ptr<Stream>;

// One unit of stream work, also the payload of a captured graph node.
struct Work {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  std::string desc;
  std::vector<Range> ranges;
  std::function<void()> fn;           // runs on the stream's worker
  std::shared_ptr<Event> event;       // event record / wait nodes
  void* mem = nullptr;                // memory alloc / free nodes
  size_t mem_size = 0;
  std::shared_ptr<void> keep;         // keeps e.g. a graph exec alive while queued
};

enum class StreamKind { legacy, per_thread, user };

struct Stream {
  uint64_t id = 0;
  void* handle = nullptr;  // what the program holds: the object's address, or a reused one
  int device = 0;
  StreamKind kind = StreamKind::user;
  unsigned flags = 0;
  int priority = 0;
  // The context the driver's cuStreamCreate made it in (cuStreamGetCtx); null: the device's
  // primary context (a stream of the runtime, or a fixed handle).
  Context* context = nullptr;
  // Guarded by state_mutex():
  std::shared_ptr<Capture> capture;

  bool blocking() const { return kind != StreamKind::user || !(flags & cudaStreamNonBlocking); }

  // Queue side (m).
  std::mutex m;
  std::condition_variable cv;
  struct Op {
    Work work;
    std::vector<std::pair<StreamRef, uint64_t>> waits;
  };
  std::deque<Op> queue;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  bool worker_started = false;
  bool retired = false;
};

struct Event {
  unsigned flags = 0;
  int device = 0;
  // Guarded by state_mutex():
  StreamRef stream;
  uint64_t seq = 0;
  uint64_t gen = 0;
  bool recorded = false;
  bool captured = false;  // last recorded inside a capture
  std::weak_ptr<Capture> capture_of;
  // Written by the worker that executes the record (time_mutex).
  std::mutex time_mutex;
  uint64_t time_gen = 0;
  std::chrono::steady_clock::time_point time;
};
using EventRef = std::shared_ptr<Event>;

// Resolves a stream handle for the calling thread: 0 / cudaStreamLegacy / cudaStreamPerThread /
// a created stream. `per_thread_default` is true for the _ptsz/_ptds entry points (0 means the
// per-thread stream). Null on an invalid handle.
StreamRef resolve_stream(cudaStream_t handle, bool per_thread_default);
// simcuda_launch_access (simcuda.h) on `s`: a kernel's declared access of device memory.
cudaError_t launch_access(const StreamRef& s, const void* ptr, size_t bytes, int is_write,
                          void (*fn)(void*), void* user_data);
StreamRef legacy_stream(int device);
StreamRef create_stream(int device, unsigned flags, int priority);
cudaError_t destroy_stream(cudaStream_t handle);
// Enqueues work with CUDA's ordering rules, or appends it to the stream's capture.
cudaError_t submit(const StreamRef& s, Work work);
// Blocks until everything submitted to s so far has executed.
void drain(const StreamRef& s);
bool idle(const StreamRef& s);
// cudaStreamQuery / cuStreamQuery: cudaSuccess when s has run everything submitted to it,
// cudaErrorNotReady otherwise; refused on a capturing stream (wait_capture_guard).
cudaError_t stream_query(const StreamRef& s);
void device_drain(int device);
std::vector<StreamRef> device_streams(int device);  // requires state_mutex
void device_reset_streams(int device);
uint64_t stream_handle_id(const StreamRef& s);

EventRef find_event(cudaEvent_t e);
cudaEvent_t create_event(unsigned flags);
cudaError_t destroy_event(cudaEvent_t e);
// `external`: cudaEventRecordExternal / cudaEventWaitExternal. Inside a capture only external
// records and waits become graph nodes; a plain record marks the event as captured (for joins).
cudaError_t event_record(const EventRef& ev, const StreamRef& s, bool external = false);
cudaError_t event_wait(const StreamRef& s, const EventRef& ev, bool external = false);
// cudaStreamWaitEvent / cuStreamWaitEvent: the flags (0 or cudaEventWaitExternal) and handles
// checked, then event_wait.
cudaError_t stream_wait_event(const StreamRef& s, cudaEvent_t e, unsigned flags);
// Reached: cudaSuccess; not yet: cudaErrorNotReady.
cudaError_t event_query(const EventRef& ev);
cudaError_t event_sync(const EventRef& ev);
void device_reset_events(int device);
cudaError_t event_elapsed(const EventRef& start, const EventRef& end, float* ms);
// Serializes the memory effects of stand-in operations (memset, memcpy, frees) so that two
// unordered operations that race (and are reported) never race in the host process itself, and
// an operation checks its memory is still allocated and uses it atomically. Taken before the
// memory module's own mutex.
std::mutex& effects_mutex();
// Requires state_mutex: enqueue (no capture checks) with the legacy-stream ordering rules.
uint64_t enqueue_locked(const StreamRef& s, Work work);

// ---- Capture (capture.cpp) -----------------------------------------------------------------
struct Graph;
struct Capture {
  uint64_t id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  int device = 0;
  Stream* origin = nullptr;       // the stream that began the capture
  bool origin_blocking = true;
  std::vector<std::weak_ptr<Stream>> members;  // origin and joined streams
  cudaGraph_t graph_handle = nullptr;
  std::shared_ptr<Graph> graph;
  bool owns_graph = true;  // false when capturing into the program's graph (ToGraph)
  bool invalidated = false;
  std::vector<cudaGraphNode_t> deps;
  std::vector<cudaGraphEdgeData> edges;
};
cudaStreamCaptureMode& thread_capture_mode();
// Must hold state_mutex. Refuses and invalidates as CUDA does for a "potentially unsafe" call.
cudaError_t check_unsafe_call_locked();
cudaError_t check_unsafe_call();
// Invalidates every capture on `device` (device-wide synchronization during capture).
// Returns true if there was any. Must hold state_mutex.
bool invalidate_device_captures_locked(int device);
bool any_capture_locked(int device);
// Synchronizing or querying a capturing stream is illegal and invalidates the capture; doing so
// on the legacy stream while a blocking stream captures would depend on it implicitly.
cudaError_t wait_capture_guard(const StreamRef& s);
// Asking for the device of a stream in a capture fails and invalidates the capture, in every
// capture mode and from any thread (cudaStreamGetDevice and cuStreamGetDevice, as seen on an
// H200 with driver 580).
cudaError_t device_query_capture_guard(const StreamRef& s);
// Invalidates the captures of blocking streams on `device`: work on the legacy stream would
// depend on them implicitly (cudaErrorStreamCaptureImplicit). Must hold state_mutex.
bool invalidate_blocking_captures_locked(int device);
// The stream is going away (destroyed, its thread exited, device reset): if it takes part in a
// capture, the capture is invalidated and, if the stream began it, ended. Returns the graph of an
// ended capture, to be destroyed by the caller once state_mutex is released.
cudaGraph_t abandon_capture_locked(Stream& s);
// `into`: cudaStreamBeginCaptureToGraph's graph (the nodes are appended to it, and it is not
// destroyed if the capture fails); nullptr makes a new graph.
cudaError_t begin_capture(const StreamRef& s, cudaStreamCaptureMode mode, cudaGraph_t into = nullptr);
cudaError_t end_capture(const StreamRef& s, cudaGraph_t* graph);
// Stream-ordered allocation: memory nodes inside a capture, an allocation now (and a free when
// the stream reaches it) outside one. The memory is `device`'s (an explicit pool's device), by
// default the stream's.
cudaError_t malloc_async(const StreamRef& s, size_t size, void** out, int device = -1);
cudaError_t free_async(const StreamRef& s, void* ptr);
// Joins s to the capture `cap` (state_mutex held).
void capture_join_locked(const StreamRef& s, const std::shared_ptr<Capture>& cap);
// Appends work to a capture (state_mutex held).
cudaError_t capture_append_locked(Stream& s, Work work);
cudaError_t capture_info(const StreamRef& s, cudaStreamCaptureStatus* status,
                         unsigned long long* id, cudaGraph_t* graph,
                         const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                         size_t* num_deps);

// ---- Graphs and user objects (graph.cpp) ---------------------------------------------------
struct UserObject;
struct GraphMem;  // memory owned by graph memory nodes
struct Node {
  Work work;
};
struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;
  std::map<UserObject*, unsigned> refs;
  std::vector<std::shared_ptr<GraphMem>> mems;
  ~Graph();
};
struct GraphExec {
  std::vector<Work> nodes;
  std::map<UserObject*, unsigned> refs;
  std::vector<std::shared_ptr<GraphMem>> mems;
  int device = 0;
  ~GraphExec();
};
std::shared_ptr<GraphMem> make_graph_mem(void* ptr, uint64_t id);
cudaGraph_t register_graph(std::shared_ptr<Graph> g);
std::shared_ptr<Graph> find_graph(cudaGraph_t g);
cudaError_t graph_destroy(cudaGraph_t g);
cudaError_t graph_clone(cudaGraph_t* out, cudaGraph_t g);
cudaError_t graph_instantiate(cudaGraphExec_t* out, cudaGraph_t g);
cudaError_t graph_exec_destroy(cudaGraphExec_t e);
cudaError_t graph_launch(cudaGraphExec_t e, const StreamRef& s);
cudaError_t graph_get_nodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* num);
cudaError_t node_get_type(cudaGraphNode_t n, cudaGraphNodeType* type);

cudaError_t user_object_create(cudaUserObject_t* out, void* ptr, cudaHostFn_t fn,
                               unsigned initial, unsigned flags);
cudaError_t user_object_retain(cudaUserObject_t o, unsigned count);
cudaError_t user_object_release(cudaUserObject_t o, unsigned count);
cudaError_t graph_retain_user_object(cudaGraph_t g, cudaUserObject_t o, unsigned count,
                                     unsigned flags);
cudaError_t graph_release_user_object(cudaGraph_t g, cudaUserObject_t o, unsigned count);
// Adds references held by a graph or exec (no validity checks; used by clone/instantiate).
void retain_refs(const std::map<UserObject*, unsigned>& refs);
void release_refs(const std::map<UserObject*, unsigned>& refs);

// ---- Driver initialization and contexts (context.cpp) --------------------------------------
struct Context {
  int device = 0;
  uint64_t id = 0;        // unique for the process's life (cuCtxGetId)
  bool primary = false;
  // Guarded by state_mutex(): references held on a primary context; the runtime holds one once
  // it used it.
  int retains = 0;
  // After cuCtxDestroy, or a primary context after a reset (kept, so stale handles are safe).
  // Set under state_mutex(); read without it by every call that checks its thread's context.
  std::atomic<bool> destroyed{false};
};
// cuInit, or the runtime's first call (the real runtime initializes the driver itself).
bool driver_initialized();
void set_driver_initialized();
Context* primary_context(int device);  // the device's primary context now (a reset replaces it)
Context*& thread_context();  // per host thread; null until the runtime or cuCtxSetCurrent sets it
// The thread's context stack under thread_context(): cuCtxCreate pushes the current context here.
std::vector<Context*>& contexts_below();
// Called by every runtime entry point: initializes the driver, binds the primary context of the
// current device to a thread that has none, and makes the runtime hold a reference on it.
void runtime_touch();
// cudaSetDevice: binds `device`'s primary context (held by the runtime) to this thread.
void runtime_bind(int device);
// Primary-context references (cuDevicePrimaryCtxRetain / Release). The last release resets the
// device, as the real driver does.
void primary_retain(int device);
cudaError_t primary_release(int device);
bool primary_active(int device);
// cuCtxCreate: a context of its own on `device` (no memory or streams of its own in the
// stand-in: they belong to the device).
Context* create_context(int device);
// cuCtxDestroy of a context of cuCtxCreate; a primary context is refused
// (cudaErrorInvalidContext) and left as it was. A context current on the calling thread is
// popped.
cudaError_t destroy_context(Context* ctx);
// cudaDeviceReset, cuDevicePrimaryCtxReset, the last release of a primary context: every capture
// of the device is invalidated, its work drained, its streams, events and memory destroyed, and
// its contexts' limits back at their defaults, its code unloaded (drop_code).
void device_reset(int device);

// ---- Context limits (limits.cpp) -----------------------------------------------------------
// cuCtxSetLimit / cuCtxGetLimit on `ctx`, `limit` in the driver's numbering (CUlimit; the
// runtime's cudaLimit values coincide). Setting the heap, printf FIFO or stack size re-charges
// ctx's device (Note [Limit reservations] in limits.cpp): cudaErrorMemoryAllocation, the limit
// unchanged, when the device cannot hold it. cudaErrorUnsupportedLimit for a limit the device
// does not have.
cudaError_t set_limit(Context* ctx, int limit, size_t value);
cudaError_t get_limit(const Context* ctx, int limit, size_t* value);
// Whether setting `limit` may reserve device memory.
bool limit_reserves_memory(int limit);
// Gives back the reservations of every context of `device` and returns their limits to the
// defaults (a device reset); drop_context_limits does it for one context (its destruction).
void drop_limits(int device);
void drop_context_limits(const Context* ctx);

// ---- Device code (code.cpp) ----------------------------------------------------------------
// The memory modules of code take on their device (Note [Code memory] in code.cpp).
// Loads function `fn` (any non-null key) on `device`, as its first launch there does: the first
// load of a function the stand-in did not hand out, or (lazy loading) of one it did, takes
// config().code_bytes of the device's memory; cudaErrorMemoryAllocation, nothing remembered, when
// the device cannot hold it; cudaSuccess once loaded (or when code_bytes is 0, or when `fn` was
// loaded with its module or library). cudaErrorInvalidResourceHandle for a function or kernel
// handed out by code_get whose module or library is no longer loaded.
cudaError_t load_function(int device, const void* fn);
enum class CodeKind { module, library };
// An explicit load into `ctx` (a library is charged to ctx's device but belongs to no context):
// a fresh handle in *handle, having taken config().code_bytes unless loading is lazy;
// cudaErrorMemoryAllocation, *handle untouched, when the device cannot hold it.
cudaError_t code_load(const Context* ctx, CodeKind kind, void** handle);
// Unloads a handle code_load returned for `kind` and gives its memory back, with that of its
// functions or kernels; cudaErrorInvalidResourceHandle when it is not loaded (unknown, unloaded,
// or gone with a reset).
cudaError_t code_unload(const void* handle, CodeKind kind);
// The function `name` of a module, or the kernel `name` of a library, `handle` from code_load:
// the same handle in *out for the same pair every time. A module's function is loaded on the
// module's device (load_function); a library's kernel is not loaded. cudaErrorInvalidResourceHandle
// when `handle` is not loaded as `kind`; cudaErrorMemoryAllocation as load_function; *out untouched
// on failure.
cudaError_t code_get(const void* handle, CodeKind kind, const char* name, void** out);
// The variable `name` of a module or library, `handle` from code_load: its address in *address,
// inside the code memory that holds it (Note [Code memory]), kVariableBytes long. Lazy, the
// variable loads as its function would, a module's on the module's device, a library's on
// `device`; eager, it lives in the module's or library's own memory. cudaErrorInvalidResourceHandle
// when `handle` is not loaded as `kind`; cudaErrorMemoryAllocation as load_function;
// cudaErrorNotSupported when no code memory can hold it; *address untouched on failure.
inline constexpr size_t kVariableBytes = 256;
cudaError_t code_variable(const void* handle, CodeKind kind, int device, const char* name,
                          void** address);
// A device reset: forgets the functions loaded on the device and unloads its contexts' modules,
// their memory freed; the device's libraries stay loaded without memory.
void drop_code(int device);
// A created context destroyed: its modules are unloaded.
void drop_context_code(const Context* ctx);

}  // namespace poolcuda::sim
