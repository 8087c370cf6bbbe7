// The library's side of the report channel (Note [Report channel] in report_channel.cpp): a
// fixed array of request slots that the report signal's handler fills without a lock, and the
// reporter thread's answer to each request, written to the asker's own pipe.
//
// Depends on channel_protocol.h, the registry, the report writer and the log.
#pragma once

#include <atomic>
#include <cstdint>

namespace poolcuda {

struct ChannelRequest {
  int sender = 0;          // si_pid of the signal
  std::uint64_t word = 0;  // si_value: channel::encode's word
};

// Requests taken by the handler and not yet answered. push is async-signal-safe and lock-free
// (many handlers may run at once); pop is called by the reporter thread only.
class RequestSlots {
 public:
  static constexpr int kSlots = 16;

  // False when every slot is taken: the request is dropped (the asker sends it again).
  bool push(const ChannelRequest& request);
  bool pop(ChannelRequest* request);

 private:
  enum State : std::uint32_t { empty, writing, ready };
  struct Slot {
    std::atomic<std::uint32_t> state{empty};
    ChannelRequest request;
  };
  Slot slots_[kSlots];
};

// Answers one request on the reporter thread: checks the reply pipe it names, acknowledges,
// does what it asks and writes the reply. A request whose pipe is gone or is not the sender's
// is dropped with one log line; a reply nobody reads is abandoned after a bounded wait.
void serve_request(const ChannelRequest& request);

}  // namespace poolcuda
