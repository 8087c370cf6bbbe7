// The CLI's side of talking to a running process: what /proc says about it (is the library
// loaded and ready, which signal does it answer, does the program handle or ignore that signal
// itself), whether it may be asked at all, and the request itself over the report channel
// (Note [Report channel] in interpose/report_channel.cpp).
//
// Depends on config/config.h and interpose/channel_protocol.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "interpose/channel_protocol.h"

namespace poolcuda::cli {

struct Target {
  long pid = 0;
  bool library_mapped = false;     // libpoolcuda.so is mapped (by name, or renamed: its marker)
  int ready_signal = 0;            // the signal of the readiness mark; 0 when there is none
  std::optional<std::string> conf; // POOLCUDA_CONF of the process's initial environment
  std::uint64_t caught = 0;        // SigCgt of /proc/PID/status: bit n-1 for signal n
  std::uint64_t ignored = 0;       // SigIgn
  long reporter_thread = 0;        // the thread named poolcuda-report; 0 when none
  // Uid: of /proc/PID/status: the user whose rights open files (the fourth figure), and the
  // effective one. -1 when unknown.
  long fs_uid = -1;
  long effective_uid = -1;
  // How many PID namespaces the process is seen from (the figures of NSpid:): more than this
  // command's when it runs in a container nested below ours. 0 when unknown.
  int pid_namespaces = 0;
  long pid_inside = 0;             // its PID in its own namespace (NSpid's last figure)
};

// Reads /proc/PID. Nothing, with `error` set, when the process does not exist or cannot be
// inspected by this user.
std::optional<Target> inspect(long pid, std::string* error);

// Why `target` must not be sent a request (nothing is sent then: a signal the library does not
// handle could kill the process or trigger its own handler), or empty, with `signal_number`
// set to the signal it answers.
std::string refusal(const Target& target, int* signal_number);

struct Answer {
  bool answered = false;  // false: `text` says why no answer came
  bool ok = false;        // the process's own verdict
  std::string text;       // the reply's payload
};

// Sends `request` to the reporter thread and waits up to `timeout` for the reply.
Answer ask(const Target& target, int signal_number, channel::Request request,
           std::chrono::milliseconds timeout);

}  // namespace poolcuda::cli
