// What libpoolcuda.so and the poolcuda CLI agree on: the names the library publishes in /proc,
// its marker symbol, the run summary's variable, and the report channel's wire format (the
// request word a queued signal carries and the framing of the reply). The protocol itself is Note [Report channel] in
// interpose/report_channel.cpp.
//
// Header-only constants and pure functions over the standard library: the CLI includes it
// without linking the library, and nothing here may depend on CUDA or on the pools.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace poolcuda::channel {

// The reporter thread's name, as /proc/PID/task/TID/comm shows it (15 characters, the most a
// thread name can have).
inline constexpr std::string_view kThreadName = "poolcuda-report";

// The readiness mark: a mapping of a memfd named kReadyMark followed by the signal number,
// which /proc/PID/maps shows as "/memfd:poolcuda-ready.10 (deleted)". It exists exactly while
// the library's handler for that signal is installed and the reporter thread listens.
inline constexpr std::string_view kReadyMark = "poolcuda-ready.";

// The symbol every libpoolcuda.so exports; `poolcuda run` refuses a library without it, and a
// second copy of the library in one process finds the first through it.
inline constexpr std::string_view kMarkerSymbol = "poolcuda_library_marker";

// Set by `poolcuda run` to the pid of the process it becomes: that process alone (not its
// children) writes a short summary at exit.
inline constexpr std::string_view kSummaryVariable = "POOLCUDA_RUN_SUMMARY";

enum class Request : std::uint8_t {
  report_text = 1,        // reply: the report as text
  report_json = 2,        // reply: the report as one JSON object
  report_configured = 3,  // write the report where report_path says; reply: where it went
  trim = 4,               // return idle pool memory to the driver; reply: what was released
  report_wide = 5,        // reply: the report as wide text (every detail)
};

// The request word, carried as si_value of a signal queued with si_code SI_QUEUE:
//   bits 56-63  kMagic
//   bits 52-55  the Request
//   bits 32-51  the asker's descriptor number of its reply pipe
//   bits  0-31  the low 32 bits of that pipe's inode number (what the library checks)
inline constexpr std::uint64_t kMagic = 0xC5;
inline constexpr int kMaxDescriptor = (1 << 20) - 1;

constexpr std::uint64_t encode(Request request, int descriptor, std::uint64_t inode) {
  return kMagic << 56 | (static_cast<std::uint64_t>(request) & 0xF) << 52 |
         (static_cast<std::uint64_t>(descriptor) & kMaxDescriptor) << 32 | (inode & 0xFFFFFFFFu);
}

struct Decoded {
  Request request = Request::report_text;
  int descriptor = -1;
  std::uint32_t inode_tag = 0;
};

// The request a word names, or nothing when the word is not one (another sender's value).
constexpr std::optional<Decoded> decode(std::uint64_t word) {
  if (word >> 56 != kMagic) return std::nullopt;
  const auto request = static_cast<std::uint8_t>(word >> 52 & 0xF);
  if (request < 1 || request > 5) return std::nullopt;
  return Decoded{static_cast<Request>(request), static_cast<int>(word >> 32 & kMaxDescriptor),
                 static_cast<std::uint32_t>(word & 0xFFFFFFFFu)};
}

// On the pipe the library writes kAck as soon as it takes the request, then one header line
// "poolcuda-reply ok|error LENGTH\n" and LENGTH bytes of payload, and closes its end.
inline constexpr std::string_view kAck = "poolcuda-ack\n";
inline constexpr std::string_view kReplyPrefix = "poolcuda-reply ";

inline std::string reply_header(bool ok, std::size_t length) {
  return std::string(kReplyPrefix) + (ok ? "ok " : "error ") + std::to_string(length) + "\n";
}

struct ReplyHeader {
  bool ok = false;
  std::size_t length = 0;       // payload bytes
  std::size_t header_size = 0;  // bytes of the header line, newline included
};

// Parses the header line at the start of `text`: nothing while the line is incomplete, a header
// with header_size 0 when the line is not a valid header.
inline std::optional<ReplyHeader> parse_reply_header(std::string_view text) {
  const auto end = text.find('\n');
  if (end == std::string_view::npos) {
    if (text.size() > 64) return ReplyHeader{};
    return std::nullopt;
  }
  std::string_view line = text.substr(0, end);
  ReplyHeader header;
  if (!line.starts_with(kReplyPrefix)) return header;
  line.remove_prefix(kReplyPrefix.size());
  if (line.starts_with("ok ")) {
    header.ok = true;
    line.remove_prefix(3);
  } else if (line.starts_with("error ")) {
    line.remove_prefix(6);
  } else {
    return header;
  }
  const auto [next, ec] = std::from_chars(line.data(), line.data() + line.size(), header.length);
  if (ec != std::errc() || next != line.data() + line.size()) return ReplyHeader{};
  header.header_size = end + 1;
  return header;
}

}  // namespace poolcuda::channel
