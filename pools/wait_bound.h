// WaitBound: the time limit of a wait inside a program's call whose end decides an answer (an
// out-of-memory recovery, a give-back before a retry, a trim of the managed slabs, a free waiting
// for another thread's free of the same address), made to survive the process being stopped.
// Depends on nothing in poolcuda.
//
// Note [Stopped processes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A bound is wall time, and wall time runs on while the whole process is stopped (SIGSTOP or
// Ctrl-Z, a batch scheduler's suspend, a debugger, a frozen cgroup), and so does the device: the
// kernels, the fences, the driver's frees a release began go on meanwhile. A stop longer than
// the bound ended it with nothing looked at since, and on resume every thread runs again at
// once: a recovery whose flush timed out during the stop found the pages it released not yet
// with the driver (the release thread had not run again either) and refused a cudaMalloc the
// plain run serves; a recovery past its end waited for no fence at all. So a look that finds
// the bound past by more than kStopSeen takes it for a stop and gives the whole bound again from
// then: the process may have used any part of it before the stop, and the wait gets at least
// its bound of running time. Nothing tells a stop from a thread that merely did not run for that
// long (a lock held across a slow driver call, a CPU quota), so this happens once per bound at
// most: each wait stays within about twice its bound. A look that finds the bound past by less
// (no stop, or one that ended about when the bound did) gives kGraceAfterBound (at most the
// bound's own length) once. A wait that timed out asks restarted() and tries again while either
// happened. Without a stop a bound costs the grace more, only where the wait ran out anyway (a
// stream parked for good, a free that never returns); a bound of zero never waits. The steps of
// one wait share its bound: a step with a bound of its own that spends it would look like a stop
// to the next look (recovery's give-back of managed slabs once did).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace poolcuda {

// `ClockType`: steady_clock, or a test's clock that it moves by hand.
template <class ClockType>
class BasicWaitBound {
 public:
  using Clock = ClockType;
  // Far longer than a driver's free, a fence's query or a release thread's wake-up take once the
  // process runs, short beside the bounds that decide answers (seconds).
  static constexpr std::chrono::milliseconds kGraceAfterBound{200};
  // More than a wait oversleeps its end while the process runs, under ordinary load.
  static constexpr std::chrono::milliseconds kStopSeen{100};

  explicit BasicWaitBound(typename Clock::duration length)
      : length_(length), end_(Clock::now() + length) {}

  // Time left, zero once over (Note [Stopped processes]).
  typename Clock::duration left() {
    const typename Clock::time_point now = look();
    return now < end_ ? end_ - now : Clock::duration::zero();
  }
  std::uint32_t left_micros() {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(left()).count();
    return static_cast<std::uint32_t>(std::clamp<std::int64_t>(us, 0, UINT32_MAX));
  }
  bool over() { return left() == Clock::duration::zero(); }
  // Whether the bound was extended since the last call: a wait that timed out meanwhile may
  // have timed out during a stop, and tries again within what is left.
  bool restarted() {
    look();
    const bool was = restarted_;
    restarted_ = false;
    return was;
  }
  // Runs `wait` (which waits within what is left and says whether what it waited for came)
  // until it came, again after each extension: true when it came.
  template <class Wait>
  bool retry(Wait wait) {
    bool came = false;
    do came = wait();
    while (!came && restarted());
    return came;
  }

 private:
  typename Clock::time_point look() {
    const typename Clock::time_point now = Clock::now();
    if (now < end_ || length_ <= Clock::duration::zero()) return now;
    if (now - end_ > kStopSeen && !stop_seen_) {
      stop_seen_ = true;
      end_ = now + length_;
    } else if (!graced_) {
      graced_ = true;
      end_ = now + std::min<typename Clock::duration>(kGraceAfterBound, length_);
    } else {
      return now;
    }
    restarted_ = true;
    return now;
  }

  typename Clock::duration length_;
  typename Clock::time_point end_;
  bool stop_seen_ = false;
  bool graced_ = false;
  bool restarted_ = false;
};

using WaitBound = BasicWaitBound<std::chrono::steady_clock>;

}  // namespace poolcuda
