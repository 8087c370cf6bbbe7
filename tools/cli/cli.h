// Shared declarations of the poolcuda command-line tool: the commands, their exit statuses and
// how the tool finds libpoolcuda.so. The tool depends on pools/config.h only (for the
// POOLCUDA_CONF grammar); it never loads the library itself and never calls CUDA.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace poolcuda::cli {

// Exit statuses shared by every command; the help text documents them.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // the command could not do what was asked
inline constexpr int kExitUsage = 2;       // bad arguments or an invalid configuration
inline constexpr int kExitCannotRun = 127; // `run`: the program or the library cannot be used

// Each command receives the arguments after its own name.
int run_command(std::span<char* const> args);
int report_command(std::span<char* const> args);

// Where libpoolcuda.so is: POOLCUDA_LIBRARY if set, else relative to this executable (installed
// layout, then build tree). `path` is absolute and names an existing file; otherwise `error`
// says what was tried.
struct LibraryLookup {
  std::string path;
  std::string error;
};
LibraryLookup find_library();

// check-conf: why the library could not write reports to `report_path` (a missing or unwritable
// directory, seen from the current directory), or an empty string when it could.
std::string report_path_problem(const std::string& report_path);

// Prints "poolcuda: <message>" on stderr.
void print_error(const std::string& message);

}  // namespace poolcuda::cli
