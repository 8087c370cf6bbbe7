// A strict JSON syntax checker for the report tests (RFC 8259 grammar; no extensions). It only
// answers "is this one complete JSON value", which is what a report reader needs first.
#pragma once

#include <cctype>
#include <string_view>

namespace preload_test {

class JsonChecker {
 public:
  explicit JsonChecker(std::string_view text) : text_(text) {}

  bool valid() {
    skip_space();
    if (!value(0)) return false;
    skip_space();
    return pos_ == text_.size();
  }

 private:
  bool value(int depth) {
    if (depth > 64 || pos_ >= text_.size()) return false;
    switch (text_[pos_]) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return string();
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: return number();
    }
  }

  bool object(int depth) {
    ++pos_;
    skip_space();
    if (peek('}')) return ++pos_, true;
    for (;;) {
      skip_space();
      if (!peek('"') || !string()) return false;
      skip_space();
      if (!peek(':')) return false;
      ++pos_;
      skip_space();
      if (!value(depth + 1)) return false;
      skip_space();
      if (peek('}')) return ++pos_, true;
      if (!peek(',')) return false;
      ++pos_;
    }
  }

  bool array(int depth) {
    ++pos_;
    skip_space();
    if (peek(']')) return ++pos_, true;
    for (;;) {
      skip_space();
      if (!value(depth + 1)) return false;
      skip_space();
      if (peek(']')) return ++pos_, true;
      if (!peek(',')) return false;
      ++pos_;
    }
  }

  bool string() {
    ++pos_;
    while (pos_ < text_.size()) {
      char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (pos_ >= text_.size()) return false;
        char e = text_[pos_++];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i) {
            if (pos_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[pos_++])))
              return false;
          }
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return false;
        }
      }
    }
    return false;
  }

  bool number() {
    std::size_t start = pos_;
    if (peek('-')) ++pos_;
    if (peek('0')) {
      ++pos_;
    } else if (!digits()) {
      return false;
    }
    if (peek('.')) {
      ++pos_;
      if (!digits()) return false;
    }
    if (peek('e') || peek('E')) {
      ++pos_;
      if (peek('+') || peek('-')) ++pos_;
      if (!digits()) return false;
    }
    return pos_ > start;
  }

  bool digits() {
    std::size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    return pos_ > start;
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  void skip_space() {
    while (pos_ < text_.size() && std::string_view(" \t\r\n").find(text_[pos_]) !=
                                      std::string_view::npos) {
      ++pos_;
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

inline bool valid_json(std::string_view text) { return JsonChecker(text).valid(); }

}  // namespace preload_test
