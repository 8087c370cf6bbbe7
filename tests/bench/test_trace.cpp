// Tests of the benchmark's traces: the text format (round trip, every parse error with its
// line), validation, the figures a trace determines, and the generators (deterministic from
// the seed, the families' own rules, every suite trace valid and within a 16 GiB device even
// for an allocator that rounds every request up to a power of two).
#include <doctest/doctest.h>

#include <bit>
#include <sstream>
#include <string>

#include "tools/bench/trace.h"
#include "tools/bench/trace_gen.h"

using namespace poolcuda::bench;

namespace {

std::string text_of(const Trace& trace) {
  std::ostringstream out;
  write_trace(trace, out);
  return out.str();
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Two threads, a phase, a reused slot.
Trace sample() {
  Trace t;
  t.name = "sample";
  t.description = "two threads, one phase";
  t.seed = 7;
  t.threads.resize(2);
  t.phases = {"warm"};
  t.threads[0].ops = {{OpKind::allocate, 0, 100}, {OpKind::allocate, 1, 50},
                      {OpKind::phase, 0, 0},      {OpKind::release, 0, 0},
                      {OpKind::allocate, 0, 300}, {OpKind::release, 1, 0},
                      {OpKind::release, 0, 0}};
  t.threads[0].slots = 2;
  t.threads[1].ops = {{OpKind::allocate, 0, 4096}, {OpKind::release, 0, 0}};
  t.threads[1].slots = 1;
  return t;
}

std::string parse_error(const std::string& text) {
  ParseOutcome outcome = parse_trace(text);
  INFO("input:\n" << text);
  REQUIRE_FALSE(outcome.trace);
  return outcome.error;
}

constexpr const char* kHead = "poolcuda-trace 1\nname t\nthreads 1\nthread 0\n";

}  // namespace

TEST_CASE("write then parse gives back the same trace") {
  const Trace original = sample();
  REQUIRE(validate(original).empty());
  const std::string text = text_of(original);
  ParseOutcome parsed = parse_trace(text);
  REQUIRE_MESSAGE(parsed.trace, parsed.error);
  const Trace& back = *parsed.trace;
  CHECK(back.name == original.name);
  CHECK(back.description == original.description);
  CHECK(back.seed == original.seed);
  CHECK(back.phases == original.phases);
  REQUIRE(back.threads.size() == 2);
  for (std::size_t t = 0; t < 2; ++t) {
    CHECK(back.threads[t].slots == original.threads[t].slots);
    REQUIRE(back.threads[t].ops.size() == original.threads[t].ops.size());
    for (std::size_t i = 0; i < back.threads[t].ops.size(); ++i) {
      CHECK(back.threads[t].ops[i].kind == original.threads[t].ops[i].kind);
      CHECK(back.threads[t].ops[i].slot == original.threads[t].ops[i].slot);
      CHECK(back.threads[t].ops[i].size == original.threads[t].ops[i].size);
    }
  }
  CHECK(text_of(back) == text);
}

TEST_CASE("the parser accepts comments, blank lines, CRLF and sections in any order") {
  const std::string text =
      "poolcuda-trace 1\r\n# a comment\n\nthreads 2\nname x\nthread 1\na 0 8\nthread 0\n"
      "a 3 16\nf 3\nthread 1\n  f   0  \n";
  ParseOutcome parsed = parse_trace(text);
  REQUIRE_MESSAGE(parsed.trace, parsed.error);
  CHECK(parsed.trace->threads[0].slots == 4);
  CHECK(parsed.trace->threads[1].ops.size() == 2);
  CHECK(parsed.trace->description.empty());
}

TEST_CASE("every malformed trace is refused with its line and what is wrong") {
  const std::string head = kHead;
  struct Case {
    std::string text;
    const char* expected;
  };
  const Case cases[] = {
      {"", "line 0: empty file"},
      {"poolcuda-trace 2\n", "line 1: expected 'poolcuda-trace 1'"},
      {"poolcuda-trace 1\nthreads 1\nthread 0\n", "line 3: 'name' and 'threads' must come first"},
      {"poolcuda-trace 1\nname t\n", "'name' and 'threads' are required"},
      {"poolcuda-trace 1\nname t\nthreads 0\n", "line 3: threads must be 1..64"},
      {"poolcuda-trace 1\nname t\nthreads 65\n", "threads must be 1..64"},
      {"poolcuda-trace 1\nname bad/name\nthreads 1\n", "line 2: name 'bad/name' is not valid"},
      {"poolcuda-trace 1\nname t\nname u\nthreads 1\n", "line 3: 'name' given twice"},
      {"poolcuda-trace 1\nname t\nthreads 1\nseed x\n", "line 4: seed is not a number"},
      {"poolcuda-trace 1\nname t\nthreads 1\na 0 8\n", "an operation before any 'thread' line"},
      {head + "thread 1\n", "line 5: expected 'thread K' with K below 1"},
      {head + "a 0\n", "line 5: expected 'a SLOT SIZE'"},
      {head + "a 0 8 9\n", "expected 'a SLOT SIZE'"},
      {head + "f\n", "line 5: expected 'f SLOT'"},
      {head + "a x 8\n", "slot 'x' is not a number below 16777216"},
      {head + "a 16777216 8\n", "is not a number below 16777216"},
      {head + "a 0 -8\n", "size '-8' is not a number"},
      {head + "a 0 0\n", "size 0 is not in 1..1099511627776"},
      {head + "a 0 1099511627777\n", "is not in 1..1099511627776"},
      {head + "a 0 8\na 0 8\n", "line 6: slot 0 is already live"},
      {head + "f 2\n", "line 5: slot 2 is not live"},
      {head + "a 0 8\nf 0\nf 0\n", "line 7: slot 0 is not live"},
      {head + "phase bad label\n", "expected 'phase LABEL'"},
      {head + "a 0 8\nseed 3\n", "line 6: 'seed' after the first operation"},
      {head + "b 0\n", "line 5: unknown line 'b'"},
      {head + "a 0 8\na 1 8\nf 1\n", "the trace ends with slot 0 of thread 0 still live"},
  };
  for (const Case& c : cases) {
    const std::string error = parse_error(c.text);
    CHECK_MESSAGE(contains(error, c.expected), "got: " << error);
  }
}

TEST_CASE("a file that cannot be read is an error naming it") {
  ParseOutcome outcome = read_trace_file("/nonexistent/dir/x.trace");
  CHECK_FALSE(outcome.trace);
  CHECK(outcome.error == "/nonexistent/dir/x.trace: cannot be read");
}

TEST_CASE("validate finds what a generator could get wrong") {
  Trace t = sample();
  t.threads[1].slots = 3;
  CHECK(validate(t) == "thread 1 declares 3 slots but uses 1");
  t = sample();
  t.threads[0].ops.pop_back();
  CHECK(validate(t) == "the trace ends with slot 0 of thread 0 still live");
  t = sample();
  t.threads[0].ops[2].slot = 5;
  CHECK(validate(t) == "thread 0, operation 2: phase index 5 is out of range");
  t = sample();
  t.name = "";
  CHECK(contains(validate(t), "is not a valid label"));
  t = sample();
  t.threads.clear();
  CHECK(validate(t) == "the thread count 0 is not in 1..64");
}

TEST_CASE("figures: pairs, operations, each thread's peak live bytes and their sum") {
  const TraceFigures f = figures(sample());
  CHECK(f.pairs == 4);
  CHECK(f.ops == 8);
  REQUIRE(f.thread_peak_live.size() == 2);
  CHECK(f.thread_peak_live[0] == 350);  // 100 + 50, then 50 + 300 = 350
  CHECK(f.thread_peak_live[1] == 4096);
  CHECK(f.peak_live == 4446);
  CHECK(f.bytes_allocated == 100 + 50 + 300 + 4096);
}

TEST_CASE("generators: the same seed gives the same trace, another seed another one") {
  for (const char* name : {"rmm-10k-64MiB", "ring16-512B-16MiB-2t", "llm-serving", "training"}) {
    CAPTURE(name);
    const GenOptions a{1, 0.05}, b{2, 0.05};
    const std::string first = text_of(*generate(name, a));
    CHECK(first == text_of(*generate(name, a)));
    CHECK(first != text_of(*generate(name, b)));
  }
  CHECK_FALSE(generate("no-such-trace", GenOptions{}));
}

TEST_CASE("every suite trace is valid and fits a 16 GiB device rounded to powers of two") {
  const std::vector<TraceEntry> suite = suite_traces();
  CHECK(suite.size() == 27);
  for (const TraceEntry& entry : suite) {
    CAPTURE(entry.name);
    const Trace trace = *generate(entry.name, GenOptions{});
    CHECK(trace.name == entry.name);
    CHECK(validate(trace).empty());
    // The most bytes live at once with every size rounded up to a power of two, per thread.
    std::uint64_t rounded_peak = 0;
    for (const ThreadOps& thread : trace.threads) {
      std::vector<std::uint64_t> sizes(thread.slots);
      std::uint64_t live = 0, peak = 0;
      for (const Op& op : thread.ops) {
        if (op.kind == OpKind::allocate) {
          sizes[op.slot] = std::bit_ceil(op.size);
          live += sizes[op.slot];
          peak = std::max(peak, live);
        } else if (op.kind == OpKind::release) {
          live -= sizes[op.slot];
        }
      }
      rounded_peak += peak;
    }
    CHECK(rounded_peak <= (std::uint64_t{16} << 30));
  }
}

TEST_CASE("RMM pattern: N allocations of 1..max bytes, live bytes under the cap") {
  const Trace t = rmm_random(2000, 64 << 20, 2, GenOptions{3, 1});
  CHECK(t.name == "rmm-2k-64MiB-2t");
  for (const ThreadOps& thread : t.threads) {
    std::vector<std::uint64_t> sizes(thread.slots);
    std::uint64_t live = 0, allocations = 0;
    REQUIRE(thread.ops.front().kind == OpKind::allocate);
    for (const Op& op : thread.ops) {
      if (op.kind == OpKind::allocate) {
        CHECK((op.size >= 1 && op.size <= (64u << 20)));
        sizes[op.slot] = op.size;
        live += op.size;
        CHECK(live < kRmmUsageCap / 2);
        ++allocations;
      } else {
        live -= sizes[op.slot];
      }
    }
    CHECK(allocations == 1000);  // the work is split between the threads
  }
}

TEST_CASE("ring and loop: the live count the trace promises") {
  const Trace ring = log_uniform_ring(1000, 16, 1, GenOptions{});
  std::uint64_t live = 0, most = 0;
  for (const Op& op : ring.threads[0].ops) {
    if (op.kind == OpKind::allocate) {
      CHECK((op.size >= 512 && op.size <= (16u << 20)));
      most = std::max(most, ++live);
    } else {
      --live;
    }
  }
  CHECK(most == 16);
  CHECK(figures(ring).pairs == 1000);
  const Trace loop = one_buffer_loop(100, 65536, 2, GenOptions{});
  CHECK(loop.threads[1].ops.size() == 100);  // 50 pairs each
  CHECK(loop.threads[0].slots == 1);
}

TEST_CASE("live slices: each live phase churns at its level") {
  const Trace t = live_slices({10, 100}, 50, GenOptions{});
  CHECK(t.phases == std::vector<std::string>{"grow-10", "live-10", "grow-100", "live-100",
                                             "drain"});
  std::uint64_t live = 0;
  std::string phase;
  for (const Op& op : t.threads[0].ops) {
    if (op.kind == OpKind::phase) {
      phase = t.phases[op.slot];
      if (phase == "live-10") CHECK(live == 10);
      if (phase == "live-100") CHECK(live == 100);
      continue;
    }
    if (op.kind == OpKind::allocate) CHECK((op.size >= 64 && op.size <= 65536));
    live += op.kind == OpKind::allocate ? 1 : -1;
  }
  CHECK(live == 0);
  CHECK(figures(t).pairs == 100 + 2 * 100);  // 100 grown, 50 churn steps at each level
}

TEST_CASE("training: weights first and freed last, everything else within the steps") {
  const Trace t = training(3, GenOptions{});
  const std::vector<Op>& ops = t.threads[0].ops;
  // 1 embedding, 16 layers of 10 weights, 1 final norm: allocated before anything else.
  constexpr std::size_t kWeights = 1 + 16 * 10 + 1;
  for (std::size_t i = 0; i < kWeights; ++i) REQUIRE(ops[i].kind == OpKind::allocate);
  for (std::size_t i = ops.size() - kWeights; i < ops.size(); ++i) {
    REQUIRE(ops[i].kind == OpKind::release);
  }
  CHECK(ops[0].size == 32000 * 1024 * 2);  // the fp16 embedding
}
