// Tests of the POOLCUDA_CONF parser (being written).
#include <doctest/doctest.h>

#include "pools/config.h"

TEST_CASE("empty configuration gives the defaults") {
  CHECK(poolcuda::parse_config("").config.has_value());
}
