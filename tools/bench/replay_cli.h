// The command line every replayer program shares:
//
//   PROGRAM [--allocator NAME] [--label TEXT] [--device-memory SIZE] TRACE_FILE
//
// reads the trace, builds the allocator the program's factory names, replays and prints one
// JSON object (replay.h) on stdout. Exit status: 0 the replay completed; 1 an allocation or free
// failed (the JSON says which); 2 the allocator could not be set up (JSON too); 64 bad usage;
// 65 the trace file is missing or malformed (a message on stderr, nothing on stdout).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench/replay.h"

namespace poolcuda::bench {

struct ReplayArgs {
  std::string trace_path;
  std::string allocator;  // one of the program's names; the first one when not given
  std::string label;
  std::uint64_t device_memory = std::uint64_t{16} << 30;  // only programs that model a device
};

// Builds the allocator named in `args`; on failure returns null and sets `error`.
using AllocatorFactory =
    std::function<std::unique_ptr<ReplayAllocator>(const ReplayArgs& args, std::string& error)>;

int replay_main(int argc, char** argv, const char* program,
                const std::vector<std::string>& allocators, const AllocatorFactory& make);

// Parses "123", "64K", "16G", "16GiB" (binary units); false on anything else.
bool parse_size(const std::string& text, std::uint64_t& out);

}  // namespace poolcuda::bench
