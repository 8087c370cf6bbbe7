// A benchmark trace: the allocations and frees of one or more host threads, in order, as the
// side-by-side benchmark replays them against every allocator, and its text file format
// (docs/benchmarks.md describes the format). Owns parsing, validation, writing and the figures
// a trace determines on its own (pairs, peak live bytes). Knows nothing of allocators, CUDA or
// the pools: any program can read these files.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace poolcuda::bench {

enum class OpKind : std::uint8_t {
  allocate,  // allocate `size` bytes into `slot` (the slot must be free)
  release,   // free the buffer in `slot` (the slot must be live)
  phase,     // the thread's later operations belong to phase `slot` (an index into phases)
};

struct Op {
  OpKind kind = OpKind::allocate;
  std::uint32_t slot = 0;
  std::uint64_t size = 0;  // allocate only
};

// One host thread's operations. Slots name buffers within the thread; a slot is reused only
// after its buffer was freed, so `slots` (1 + the largest slot) bounds the live buffers' table.
struct ThreadOps {
  std::vector<Op> ops;
  std::uint32_t slots = 0;
};

struct Trace {
  std::string name;         // [A-Za-z0-9_.-]+
  std::string description;  // one line, may be empty
  std::uint64_t seed = 0;   // the generator's seed (informational)
  std::vector<ThreadOps> threads;
  std::vector<std::string> phases;  // labels, [A-Za-z0-9_.-]+, in order of first use
};

// Limits the format enforces, so a replayer's tables stay small and sizes fit every allocator.
inline constexpr std::size_t kMaxThreads = 64;
inline constexpr std::uint32_t kMaxSlots = 1u << 24;
inline constexpr std::uint64_t kMaxAllocation = std::uint64_t{1} << 40;

// Figures that follow from the trace alone, the same for every allocator.
struct TraceFigures {
  std::uint64_t pairs = 0;  // allocations (each one is freed: every trace ends empty)
  std::uint64_t ops = 0;    // allocations and frees
  // The most bytes live at once in each thread, and their sum: the peak of the combined live
  // bytes when threads run concurrently can never exceed it (and equals it with one thread).
  std::vector<std::uint64_t> thread_peak_live;
  std::uint64_t peak_live = 0;
  std::uint64_t bytes_allocated = 0;  // sum of every allocation's size
};
TraceFigures figures(const Trace& trace);

// Checks what the file format guarantees: a valid name and phase labels, 1..kMaxThreads
// threads, slots below kMaxSlots, sizes 1..kMaxAllocation, an allocation only into a free slot,
// a free only of a live slot, phase indexes in range, every slot free at the end, `slots`
// exactly 1 + the largest slot used. Returns an empty string when all hold, else the first
// breach.
std::string validate(const Trace& trace);

// Writes `trace` in the text format. The trace must be valid.
void write_trace(const Trace& trace, std::ostream& out);

struct ParseOutcome {
  std::optional<Trace> trace;  // set on success
  std::string error;           // "line N: ..." when trace is empty
};

// Parses the text format; a trace that parses is valid. Never throws on malformed input.
ParseOutcome parse_trace(std::string_view text);

// Reads and parses a file; a file that cannot be read is an error like a malformed one.
ParseOutcome read_trace_file(const std::string& path);

// Whether `text` is a valid name or phase label ([A-Za-z0-9_.-]+, at most 64 characters).
bool valid_label(std::string_view text);

}  // namespace poolcuda::bench
