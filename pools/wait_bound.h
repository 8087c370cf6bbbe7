// WaitBound: the time limit of a wait inside a program's call whose end decides an answer (an
// out-of-memory recovery, a give-back before a retry, a free waiting for another thread's free
// of the same address), made to survive the process being stopped. Depends on nothing in
// poolcuda.
//
// Note [Stopped processes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A bound is wall time, and wall time runs on while the whole process is stopped (SIGSTOP or
// Ctrl-Z, a batch scheduler's suspend, a debugger, a frozen cgroup), and so does the device: the
// kernels, the fences, the driver's frees a release began all end meanwhile. A stop longer than
// the bound ends it with nothing looked at since, and on resume every thread runs again at once:
// a recovery whose flush timed out during the stop found the pages it released not yet with the
// driver (the release thread had not run yet either) and refused a cudaMalloc the plain run
// serves; a recovery past its end waited for no fence at all. So a bound is not over at the
// first look that finds it past: that look gives kGraceAfterBound more, counted from then, when
// the looking thread runs again, and so does every later look that finds it past by more than
// kStopSeen, which no wait of the library oversleeps while the process runs. A wait that timed out
// asks restarted() and tries once more when it did. Without a stop the bound costs
// kGraceAfterBound more once, only where the wait ran out anyway: a stream parked for good, a
// free that never returns.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace poolcuda {

class WaitBound {
 public:
  using Clock = std::chrono::steady_clock;
  // Far longer than a driver's free, a fence's query or a release thread's wake-up take once the
  // process runs, too short to matter beside the bounds (seconds).
  static constexpr std::chrono::milliseconds kGraceAfterBound{200};
  // More than a thread past its end oversleeps it while the process runs, under load included.
  static constexpr std::chrono::milliseconds kStopSeen{100};

  explicit WaitBound(Clock::duration length) : end_(Clock::now() + length) {}

  // Time left, zero once over (Note [Stopped processes]).
  Clock::duration left() {
    const Clock::time_point now = look();
    return now < end_ ? end_ - now : Clock::duration::zero();
  }
  std::uint32_t left_micros() {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(left()).count();
    return static_cast<std::uint32_t>(std::clamp<std::int64_t>(us, 0, UINT32_MAX));
  }
  bool over() { return left() == Clock::duration::zero(); }
  // Whether the bound was extended since the last call: a wait that timed out meanwhile may
  // have timed out during a stop, and gets one more try within what is left.
  bool restarted() {
    look();
    const bool was = restarted_;
    restarted_ = false;
    return was;
  }

 private:
  Clock::time_point look() {
    const Clock::time_point now = Clock::now();
    if (now >= end_ && (!graced_ || now - end_ > kStopSeen)) {
      end_ = now + kGraceAfterBound;
      graced_ = restarted_ = true;
    }
    return now;
  }

  Clock::time_point end_;
  bool graced_ = false;
  bool restarted_ = false;
};

}  // namespace poolcuda
