// Shared declarations of the poolcuda command-line tool: the commands, their exit statuses and
// how the tool finds and checks libpoolcuda.so. The tool depends on config/config.h (for the
// POOLCUDA_CONF grammar) and on interpose/channel_protocol.h (what it agrees on with the
// library); it never loads the library itself and never calls CUDA.
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
int trim_command(std::span<char* const> args);

// Where libpoolcuda.so is: POOLCUDA_LIBRARY if set, else relative to this executable (installed
// layout, then build tree). `path` is absolute and names a library check_library accepts;
// otherwise `error` says what was tried or what is wrong with the file.
struct LibraryLookup {
  std::string path;
  std::string error;
};
LibraryLookup find_library();

// check-conf: why the library could not write reports to `report_path` (a missing or unwritable
// directory, seen from the current directory), or an empty string when it could.
std::string report_path_problem(const std::string& report_path);

// Empty when `path` is a 64-bit ELF shared object for this machine that exports the library's
// marker symbol; otherwise why it cannot be the library.
std::string check_library(const std::string& path);

// Where the program's CUDA comes from: a GPU's driver, or (when no GPU is found) the CUDA
// stand-in beside `library` in a build tree, or nothing.
struct CudaSource {
  bool gpu = false;
  std::string stand_in_dir;  // set when the stand-in is used
  std::string description;   // for the start line
};
CudaSource find_cuda(const std::string& library, bool allow_stand_in);

// If `args[i]` is -h or --help, prints the command's help and returns true.
bool wants_help(std::string_view command, std::string_view arg);

// Prints "poolcuda: <message>" on stderr.
void print_error(const std::string& message);

}  // namespace poolcuda::cli
