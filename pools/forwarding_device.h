// ForwardingDevice: a Device that passes every call to another one. Test devices and the
// benchmark's metering device derive from it and override only what they do differently
// (releases that lag, a device that moves on during a flush, counters). `Inner` is the type the
// derived class needs to reach (HostDevice for its test controls, or any Device).
// allocate_if_room is not forwarded on purpose: the default calls this device's allocate(), so
// a derived device that counts or refuses allocations sees wide pages too.
#pragma once

#include "pools/device.h"

namespace poolcuda {

template <class Inner = Device>
class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(Inner& inner) : inner_(inner) {}
  AllocStatus allocate(std::uint64_t size, DevicePtr* out) override {
    return inner_.allocate(size, out);
  }
  void release(DevicePtr ptr, std::uint64_t size) override { inner_.release(ptr, size); }
  bool flush_releases(std::uint32_t max_microseconds) override {
    return inner_.flush_releases(max_microseconds);
  }
  std::uint64_t releasing_bytes() override { return inner_.releasing_bytes(); }
  std::uint64_t release_in_flight() override { return inner_.release_in_flight(); }
  std::uint64_t growth_room() override { return inner_.growth_room(); }
  DeviceMemoryInfo memory_info() override { return inner_.memory_info(); }
  std::uint64_t alignment() const override { return inner_.alignment(); }
  FenceHandle fence_record() override { return inner_.fence_record(); }
  FenceHandle fence_record_on(StreamToken stream, StreamToken& lane) override {
    return inner_.fence_record_on(stream, lane);
  }
  bool fence_passed(FenceHandle fence) override { return inner_.fence_passed(fence); }
  void fence_wait(FenceHandle fence) override { inner_.fence_wait(fence); }
  bool fence_wait_for(FenceHandle fence, std::uint32_t max_microseconds) override {
    return inner_.fence_wait_for(fence, max_microseconds);
  }
  void fence_destroy(FenceHandle fence) override { inner_.fence_destroy(fence); }
  bool synchronize() override { return inner_.synchronize(); }
  bool capture_active() override { return inner_.capture_active(); }

 protected:
  Inner& inner_;
};

}  // namespace poolcuda
