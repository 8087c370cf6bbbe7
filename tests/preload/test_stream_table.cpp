// Preload suite, StreamTable on its own (no CUDA runtime, no preload): a handle value that the
// runtime hands out again after the stream was destroyed behind the hooks' back must replace
// the old entry, never appear twice, so that one cudaStreamDestroy removes it for good and the
// entry carries the new stream's flags and device.
#include <cstdio>

#include "check.h"
#include "interpose/stream_table.h"

namespace {

cudaStream_t handle(std::uintptr_t value) { return reinterpret_cast<cudaStream_t>(value); }

std::size_t entries_of(poolcuda::StreamTable& table, cudaStream_t stream,
                       poolcuda::TrackedStream* last) {
  auto hold = table.lock();
  std::size_t n = 0;
  for (const poolcuda::TrackedStream& s : table.streams()) {
    if (s.stream != stream) continue;
    ++n;
    *last = s;
  }
  return n;
}

}  // namespace

int main() {
  poolcuda::StreamTable table;
  poolcuda::TrackedStream entry;

  // Distinct streams are all kept.
  table.add(handle(0x1000), 0, cudaStreamNonBlocking);
  table.add(handle(0x2000), 0, cudaStreamDefault);
  CHECK(table.size() == 2);

  // The same value again (destroyed behind the hooks' back, then reused by the runtime on
  // another device, now blocking): one entry, with the new stream's properties.
  table.add(handle(0x1000), 1, cudaStreamDefault);
  CHECK_MSG(table.size() == 2, "a reused handle is listed twice");
  CHECK(entries_of(table, handle(0x1000), &entry) == 1);
  CHECK(entry.device == 1);
  CHECK(!entry.non_blocking);

  // One destroy removes it; a second finds nothing.
  CHECK(table.remove(handle(0x1000)));
  CHECK(entries_of(table, handle(0x1000), &entry) == 0);
  CHECK(!table.remove(handle(0x1000)));
  CHECK(table.size() == 1);

  // forget_device drops only that device's streams.
  table.add(handle(0x3000), 1, cudaStreamNonBlocking);
  table.forget_device(1);
  CHECK(table.size() == 1);
  CHECK(entries_of(table, handle(0x2000), &entry) == 1);

  std::printf("ok\n");
  return 0;
}
