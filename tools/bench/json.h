// The one JSON helper the benchmark tools share: a string as a JSON string literal. Header-only,
// standard library only.
#pragma once

#include <cstdio>
#include <string>

namespace poolcuda::bench {

// `text` as a JSON string literal, quotes included.
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace poolcuda::bench
