// Note [Lock order] (pools/lock_order.h): in debug builds a lock taken while a lock of the same
// or a higher rank is held fails an assertion at once, so the first test that breaks the order
// finds it; taken in order, locks nest freely, and a try-lock may break the order (it cannot
// deadlock).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <mutex>

#include "pools/lock_order.h"

using namespace poolcuda;

namespace {

// Runs `body` in a forked child; returns the signal that ended it, or 0 when it exited.
template <typename Body>
int child_signal(Body body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("locks_taken_in_rank_order_nest") {
  RankedMutex capture(LockRank::capture), manager(LockRank::manager),
      table(LockRank::stream_table), device(LockRank::device);
  std::lock_guard a(capture);
  std::lock_guard b(manager);
  std::lock_guard c(table);
  std::lock_guard d(device);
  CHECK(true);
}

TEST_CASE("a_try_lock_may_break_the_order") {
  RankedMutex manager(LockRank::manager), report(LockRank::report);
  std::lock_guard a(manager);
  REQUIRE(report.try_lock());
  report.unlock();
}

#ifndef NDEBUG
TEST_CASE("a_lock_taken_out_of_order_fails_at_once_in_debug_builds") {
  const int signal = child_signal([] {
    RankedMutex manager(LockRank::manager), capture(LockRank::capture);
    std::lock_guard a(manager);
    std::lock_guard b(capture);  // capture ranks below manager
  });
  CHECK(signal == SIGABRT);
  // Two locks of one rank at once are refused too (two managers' locks are never nested).
  const int same = child_signal([] {
    RankedMutex one(LockRank::manager), two(LockRank::manager);
    std::lock_guard a(one);
    std::lock_guard b(two);
  });
  CHECK(same == SIGABRT);
}
#endif

}  // TEST_SUITE
