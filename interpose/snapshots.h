// Snapshots of every device's pools for a report, taken either on the calling thread (which may
// wait for each manager's lock) or by a helper thread within a time bound, for callers that must
// never wait for a lock without limit (the exit work, Note [Bounded snapshots] in
// snapshots.cpp); and the helper itself, for other work that may block (a trim's fence waits).
//
// Depends on the registry and pools/report.h only.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "pools/report.h"

namespace poolcuda {

struct Snapshots {
  std::vector<ManagerReport> reports;  // in device order
  std::vector<int> skipped;            // devices whose lock was not free within the bound
  std::chrono::milliseconds bound{0};  // the bound that was applied (0: none)
};

// Every device's snapshot, taken on this thread.
Snapshots take_snapshots();

// Every device's snapshot that a helper thread could take within `bound`; the others are
// listed in `skipped`.
Snapshots take_snapshots_within(std::chrono::milliseconds bound);

// Runs `work` on a helper thread with every signal blocked and waits at most `bound` for it:
// true when it finished. Work still running then finishes on its own, so it must own (or share)
// everything it touches. False too when no thread could be started (the work never runs).
bool run_within(std::chrono::milliseconds bound, std::function<void()> work);

}  // namespace poolcuda
