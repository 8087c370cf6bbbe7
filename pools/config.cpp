// POOLCUDA_CONF parser (being written).
#include "pools/config.h"

namespace poolcuda {

ParseResult parse_config(std::string_view text) {
  ParseResult result;
  if (text.empty()) result.config = Config{};
  return result;
}

}  // namespace poolcuda
