// The table of streams the program created (see stream_table.h). Streams are few and created
// rarely, so a vector under one mutex is the whole data structure.
//
// Depends on the CUDA runtime header only.
#include "interpose/stream_table.h"

#include <algorithm>

namespace poolcuda {

void StreamTable::add(cudaStream_t stream, int device, unsigned int flags) {
  std::lock_guard<RankedMutex> hold(mutex_);
  const TrackedStream entry{stream, device, (flags & cudaStreamNonBlocking) != 0, next_serial_++};
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const TrackedStream& s) { return s.stream == stream; });
  if (it != streams_.end()) {
    *it = entry;
  } else {
    streams_.push_back(entry);
  }
}

bool StreamTable::remove(cudaStream_t stream) {
  std::lock_guard<RankedMutex> hold(mutex_);
  TrackedStream removed;
  return remove_locked(stream, &removed);
}

bool StreamTable::remove_locked(cudaStream_t stream, TrackedStream* removed) {
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const TrackedStream& s) { return s.stream == stream; });
  if (it == streams_.end()) return false;
  *removed = *it;
  *it = streams_.back();
  streams_.pop_back();
  return true;
}

void StreamTable::forget_device(int device) {
  std::lock_guard<RankedMutex> hold(mutex_);
  std::erase_if(streams_, [&](const TrackedStream& s) { return s.device == device; });
}

std::size_t StreamTable::size() {
  std::lock_guard<RankedMutex> hold(mutex_);
  return streams_.size();
}

}  // namespace poolcuda
