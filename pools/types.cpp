// describe(Error): the one place an Error value becomes a human sentence. Used by log lines, the
// CLI and tests; depends on nothing but types.h.
#include "pools/types.h"

namespace poolcuda {

std::string describe(const Error& error) {
  const std::string value = std::to_string(error.value);
  switch (error.kind) {
    case ErrorKind::none:
      return "no error";
    case ErrorKind::buffer_too_big:
      return "buffer too big: no pool accepts " + value + " B";
    case ErrorKind::pool_capacity_exceeded:
      return "pool capacity exceeded (capacity " + value + " B)";
    case ErrorKind::pools_in_use:
      return "pools in use (" + value + " B still live in the dynamic pools)";
    case ErrorKind::out_of_memory:
      return "out of device memory (requested " + value + " B)";
    case ErrorKind::device_error:
      return "device error while allocating " + value + " B";
  }
  return "unknown error " + value;
}

}  // namespace poolcuda
