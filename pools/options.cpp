// format_size (see options.h): the largest binary unit that divides the count exactly, so that
// the text parses back to the same number.
#include "pools/options.h"

#include <array>
#include <string_view>

namespace poolcuda {

std::string format_size(std::uint64_t bytes) {
  constexpr std::array<std::string_view, 4> kUnits = {"TiB", "GiB", "MiB", "KiB"};
  for (std::size_t i = 0; i < kUnits.size(); ++i) {
    const int shift = 10 * static_cast<int>(kUnits.size() - i);
    const std::uint64_t unit = std::uint64_t{1} << shift;
    if (bytes != 0 && bytes % unit == 0) {
      return std::to_string(bytes >> shift) + std::string(kUnits[i]);
    }
  }
  return std::to_string(bytes) + "B";
}

}  // namespace poolcuda
