// Tests of the replay engine every replayer shares: the allocator sees the trace's operations
// in order, meters are reset before and read after, pairs and phase steps are counted, a
// failure stops the replay and names the operation, a trace's threads run concurrently, each
// prepared before the clock, and the JSON carries every figure. Also the replayers' size parser.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/replay.h"
#include "tools/bench/replay_cli.h"
#include "tools/bench/trace_gen.h"

using namespace poolcuda::bench;

namespace {

// "a100" for an allocation of 100 bytes. (Built by appending: GCC 12 at -O3 warns falsely on
// a short literal + std::string.)
std::string entry(char kind, std::uint64_t size) {
  std::string text(1, kind);
  text += std::to_string(size);
  return text;
}

// Hands out distinct fake addresses and logs every call.
class Recorder : public ReplayAllocator {
 public:
  void* allocate(std::uint64_t size) override {
    std::lock_guard lock(m_);
    if (fail_at_ != 0 && ++allocations_ == fail_at_) return nullptr;
    log_.push_back(entry('a', size));
    return reinterpret_cast<void*>(next_ += 4096);
  }
  bool release(void* p, std::uint64_t size) override {
    std::lock_guard lock(m_);
    log_.push_back(entry('f', size) + '@' +
                   std::to_string(reinterpret_cast<std::uintptr_t>(p)));
    return true;
  }
  std::string failure() override { return "the recorder was told to fail"; }
  void reset_meters() override {
    std::lock_guard lock(m_);
    log_.push_back("reset");
  }
  Meters meters() override {
    std::lock_guard lock(m_);
    log_.push_back("meters");
    return {7, 9, 1, 2, 3};
  }

  std::vector<std::string> log() {
    std::lock_guard lock(m_);
    return log_;
  }
  void fail_allocation(int n) { fail_at_ = n; }
  void note(std::string line) {
    std::lock_guard lock(m_);
    log_.push_back(std::move(line));
  }

 private:
  std::mutex m_;
  std::vector<std::string> log_;
  std::uintptr_t next_ = 0;
  int fail_at_ = 0, allocations_ = 0;
};

Trace one_thread(std::vector<Op> ops, std::uint32_t slots) {
  Trace t;
  t.name = std::string(1, 't');  // not assigned from a literal: see entry()
  t.threads.resize(1);
  t.threads[0].ops = std::move(ops);
  t.threads[0].slots = slots;
  return t;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("the allocator sees the trace in order, between a meter reset and a meter read") {
  const Trace t = one_thread({{OpKind::allocate, 0, 100},
                              {OpKind::allocate, 1, 200},
                              {OpKind::release, 0, 0},
                              {OpKind::allocate, 0, 300},
                              {OpKind::release, 1, 0},
                              {OpKind::release, 0, 0}},
                             2);
  Recorder recorder;
  const ReplayResult r = replay(t, recorder);
  CHECK(r.ok);
  CHECK(r.pairs == 3);
  CHECK(recorder.log() == std::vector<std::string>{"reset", "a100", "a200", "f100@4096",
                                                   "a300", "f200@8192", "f300@12288",
                                                   "meters"});
  CHECK(r.meters.reserved_now == 7u);
  CHECK(r.meters.reserved_peak == 9u);
  CHECK(r.median_ns >= 0);
  CHECK(r.p99_ns >= r.median_ns);
  CHECK(r.pairs_per_second > 0);
  CHECK(r.figures.peak_live == 500);
}

TEST_CASE("a failed allocation stops the replay and names the operation") {
  const Trace t = one_thread({{OpKind::allocate, 0, 100},
                              {OpKind::release, 0, 0},
                              {OpKind::allocate, 0, 64},
                              {OpKind::release, 0, 0}},
                             1);
  Recorder recorder;
  recorder.fail_allocation(2);
  const ReplayResult r = replay(t, recorder);
  CHECK_FALSE(r.ok);
  CHECK(r.error == "thread 0, operation 2: allocating 64 bytes failed: the recorder was told "
                   "to fail");
  CHECK(r.pairs == 1);
  const std::string json = result_json(t, "recorder", "x", r);
  CHECK(contains(json, "\"status\":\"failed\""));
  CHECK(contains(json, "\"error\":\"thread 0, operation 2: allocating 64 bytes failed"));
}

TEST_CASE("phase steps are consecutive operation pairs within the phase") {
  Trace t = one_thread({{OpKind::allocate, 0, 8},
                        {OpKind::allocate, 1, 8},
                        {OpKind::phase, 0, 0},
                        {OpKind::release, 0, 0},
                        {OpKind::allocate, 0, 8},
                        {OpKind::release, 1, 0},
                        {OpKind::allocate, 1, 8},
                        {OpKind::phase, 1, 0},
                        {OpKind::release, 0, 0},
                        {OpKind::release, 1, 0}},
                       2);
  t.phases = {"churn", "drain"};
  Recorder recorder;
  const ReplayResult r = replay(t, recorder);
  REQUIRE(r.phases.size() == 2);
  CHECK(r.phases[0].name == "churn");
  CHECK(r.phases[0].steps == 2);
  CHECK(r.phases[1].steps == 1);
}

TEST_CASE("a trace's threads run at the same time") {
  // Each thread's first allocation waits until both threads are inside the allocator.
  class Rendezvous final : public Recorder {
   public:
    void* allocate(std::uint64_t size) override {
      thread_local bool first = true;
      if (first) {
        first = false;
        inside_.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (inside_.load() < 2 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        met_ = met_ || inside_.load() >= 2;
      }
      return Recorder::allocate(size);
    }
    std::atomic<int> inside_{0};
    std::atomic<bool> met_{false};
  };
  const Trace t = one_buffer_loop(200, 1024, 2, GenOptions{});
  Rendezvous allocator;
  const ReplayResult r = replay(t, allocator);
  CHECK(r.ok);
  CHECK(r.pairs == 200);
  CHECK(allocator.met_.load());
}

TEST_CASE("each thread of a trace is prepared before the meters are reset and its clock starts") {
  // Note [Threads ready before the clock] in tools/bench/replay.cpp.
  class Prepared final : public Recorder {
   public:
    void prepare_thread() override {
      prepared_.fetch_add(1);
      note("prepare");
    }
    void* allocate(std::uint64_t size) override {
      thread_local bool first = true;
      if (first) {
        first = false;
        if (prepared_.load() != 2) early_ = true;
      }
      return Recorder::allocate(size);
    }
    std::atomic<int> prepared_{0};
    std::atomic<bool> early_{false};
  };
  const Trace t = one_buffer_loop(20, 1024, 2, GenOptions{});
  Prepared allocator;
  const ReplayResult r = replay(t, allocator);
  CHECK(r.ok);
  CHECK(allocator.prepared_.load() == 2);
  CHECK_FALSE(allocator.early_.load());
  const std::vector<std::string> log = allocator.log();
  REQUIRE(log.size() >= 3);
  CHECK(log[0] == "prepare");
  CHECK(log[1] == "prepare");
  CHECK(log[2] == "reset");

  // One thread: the replay runs on the calling thread, which prepares nothing.
  Prepared single;
  const ReplayResult one = replay(one_buffer_loop(5, 64, 1, GenOptions{}), single);
  CHECK(one.ok);
  CHECK(single.prepared_.load() == 0);
}

TEST_CASE("the JSON of a run carries every figure; unknown meters are null") {
  const Trace t = one_buffer_loop(10, 64, 1, GenOptions{});
  ReplayResult r = replay(t, *make_null_allocator());
  const std::string json = result_json(t, "harness", "lab\"el", r);
  for (const char* key :
       {"\"trace\":\"loop-64B\"", "\"allocator\":\"harness\"", "\"label\":\"lab\\\"el\"",
        "\"status\":\"ok\"", "\"threads\":1", "\"trace_pairs\":10", "\"pairs\":10",
        "\"median_ns\":", "\"p99_ns\":", "\"mean_ns\":", "\"pairs_per_second\":",
        "\"wall_seconds\":", "\"peak_live_bytes\":64", "\"peak_reserved_bytes\":null",
        "\"reserved_at_end_bytes\":null", "\"driver_allocs\":null", "\"driver_frees\":null",
        "\"event_records\":null", "\"phases\":[]", "\"timer\":", "\"harness_ns_per_pair\":"}) {
    CHECK_MESSAGE(contains(json, key), key << " in " << json);
  }
  CHECK(setup_failure_json("t", "cub", "", "no CUB") ==
        "{\"trace\":\"t\",\"allocator\":\"cub\",\"label\":\"\",\"status\":\"failed\","
        "\"error\":\"no CUB\"}");
  CHECK(json_string("a\"b\\c\nd") == "\"a\\\"b\\\\c\\u000ad\"");
}

TEST_CASE("parse_size: binary units, and nothing else") {
  std::uint64_t v = 0;
  CHECK((parse_size("512", v) && v == 512));
  CHECK((parse_size("64K", v) && v == 65536));
  CHECK((parse_size("16G", v) && v == (std::uint64_t{16} << 30)));
  CHECK((parse_size("2GiB", v) && v == (std::uint64_t{2} << 30)));
  for (const char* bad : {"", "G", "1.5G", "-1", "16X", "99999999999999999999", "20000000T"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_size(bad, v));
  }
}
