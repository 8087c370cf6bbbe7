// One thread of the differential test's randomized CUDA program. A Worker owns its buffers
// (each with a home stream that orders its work, and a Shadow of what it must read back), its
// streams and its random generator, and chooses every next call from the generator and its own
// state only: never from a pointer value or a number the library may report differently. So the
// plain run and the run under the library make the same calls as long as they agree on every
// result, and the Recorder compares those results (differential_trace.h).
//
// The program stays a valid CUDA program in both runs: a buffer's work goes to its home stream
// (or to the legacy stream when the home is ordered with it), data moves between streams only
// through events, a stream parked behind a gate only receives work while nothing waits for it,
// and out-of-memory stays deterministic (concurrent phases keep within a budget).
//
// Depends on the CUDA runtime header, check.h (the gate) and the two other differential headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <vector>

#include "check.h"
#include "differential_shadow.h"
#include "differential_trace.h"

namespace differential {

// What a configuration's program may do.
struct Profile {
  int threads = 3;      // program threads in the concurrent phases (1: single-threaded only)
  bool streams = true;  // created and per-thread default streams (false: the legacy stream only)
  bool gates = true;    // streams parked until the program opens them (single-threaded phases)
  bool big = true;      // allocations of a large part of the device (single-threaded phases)
  bool async = false;   // cudaMallocAsync and cudaFreeAsync
  bool reset = true;    // cudaDeviceReset (single-threaded phases)
  bool reported_free = true;  // allocate all that cudaMemGetInfo reports free (alone)
  bool leave_errors = true;   // a failed call's error stays in the last-error slot (false: the
                              // program clears it at once, unrecorded, as careful programs do)
};

// Turns off the features named in `names` (comma-separated Profile members; "threads" runs
// single-threaded): to see what else diverges once a known divergence is out of the way.
// Returns the first unknown name, or an empty string.
std::string turn_off(const std::string& names, Profile* profile);

class Worker;

// What the program's threads share.
struct Program {
  RunInfo run;
  Profile profile;
  std::vector<std::uint64_t> capacity;  // bytes of each device
  std::vector<unsigned char> pattern;   // the host data copied into buffers
  std::vector<Worker*> workers;
  // The runtime's own cudaMemGetInfo (never the library's): what the plain run measures.
  cudaError_t (*device_memory)(std::size_t*, std::size_t*) = nullptr;
  // Every live buffer of every thread (begin -> end): two must never overlap.
  std::mutex live_mutex;
  std::map<std::uintptr_t, std::uintptr_t> live;
  // Allocations hold it shared; a free and its repetition (double free) hold it exclusively,
  // so no other thread's allocation can be handed the address in between.
  std::shared_mutex address_lock;
};

class Worker {
 public:
  Worker(int id, Program& program, Recorder& recorder);

  // Runs `steps` random steps on the calling thread. `alone`: no other worker runs meanwhile
  // (gates, large allocations, device resets and double frees without a lock are allowed).
  void run(int steps, bool alone);
  // cudaDeviceSynchronize on every device (between phases, on the calling thread).
  void synchronize_devices();
  // Frees every buffer and destroys every created stream.
  void teardown();

 private:
  enum class StreamKind { legacy, per_thread, created };
  struct Stream {
    int device;
    StreamKind kind;
    cudaStream_t handle;
    bool blocking;  // ordered with the legacy stream
    bool alive;
    std::string name;
  };
  struct Buffer {
    void* ptr;
    std::size_t size;
    int device;
    int home;     // index into streams_
    bool orphan;  // its home was destroyed with work queued: only a free or a device sync
    bool async;   // from cudaMallocAsync
    Shadow shadow;
  };

  // ---- generator (differential_worker.cpp)
  std::uint64_t roll(std::uint64_t n) { return n == 0 ? 0 : random_() % n; }
  bool pick_size(int device, bool bursting, std::size_t* size);
  int pick_buffer(bool usable_only);
  int pick_stream(int device, bool unblocked_only);
  void pick_range(std::size_t size, std::size_t most, std::size_t* offset, std::size_t* length);
  std::uint64_t limit(int device) const;
  std::uint64_t room(int device) const;  // what the limit leaves

  // ---- state (differential_worker.cpp)
  bool ensure_device(int device);
  bool blocked(int stream) const;
  bool legacy_ordered(int stream) const {
    return streams_[static_cast<std::size_t>(stream)].blocking;
  }
  int legacy_index(int device) const;
  bool claim(void* ptr, std::size_t size);
  void unclaim(void* ptr);
  void remove_buffer(int index);
  void forget_device(int device);
  void undo_allocation(void* ptr);
  void device_synchronized(int device);

  // ---- steps (differential_worker.cpp, differential_steps.cpp)
  void step();
  void step_gated();
  bool allocation(int device, std::size_t size, int stream, const char* note, void** ptr);
  void allocate();
  void allocate(int device, std::size_t size, bool async);
  void release();
  void burst();
  void allocate_reported_free(int device, std::size_t free_bytes);
  void write_fill(int index, bool allow_sync);
  void write_pattern(int index);
  void copy_between();
  void read_back(int index);
  void rehome(int index, int stream);
  void synchronize();
  void manage_streams();
  void park_timed();
  void run_kernel(int index);
  void park_gated();
  void mem_get_info();
  void last_error();
  void reset_device();

  Program& program_;
  Recorder& recorder_;
  std::mt19937_64 random_;
  bool alone_ = false;
  int current_ = -1;   // the device current on this thread, -1 when unknown
  int gated_ = -1;     // the stream parked behind the open gate, -1 when none
  std::vector<Stream> streams_;
  std::vector<Buffer> buffers_;
  std::vector<std::uint64_t> live_bytes_;  // per device
  std::vector<std::unique_ptr<preload_test::Gate>> gates_;
  std::vector<void*> pending_undo_;  // allocations to give back once the gate is open
  std::vector<unsigned char> host_;  // read-back staging
  int parked_ms_ = 0;                // host-function sleeps so far
};

// Runs a case's whole program in this process (differential_program.cpp): single-threaded
// and concurrent phases, then every buffer freed. The plain run (no reference) writes its
// record to `trace_path`; the run under the library compares with the record at
// `reference_path`. Returns the process's exit status.
int run_program(const RunInfo& run, const Profile& profile, const std::string& trace_path,
                const std::string& reference_path);

}  // namespace differential
