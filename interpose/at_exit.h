// What the library does when the process exits: the exit report (report_at_exit:1), the summary
// `poolcuda run` asks for, and a warning when the process loaded CUDA but none of its calls
// reached the library. Nothing at all from a process that never touched CUDA through the
// library (Note [Silent processes] in lifecycle.cpp), and never a wait for a pool lock without
// a bound (Note [Bounded snapshots] in snapshots.cpp).
//
// Depends on the snapshots, the report writer, the log and the configuration.
#pragma once

namespace poolcuda {

// Called once from an exit handler of the active copy of the library.
void run_exit_work();

}  // namespace poolcuda
