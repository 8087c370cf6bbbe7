// What a device buffer of the differential test must read back. A buffer's known bytes are
// runs of either one fill byte (a memset) or a window of the run's pattern (a copy from the
// host pattern, or from another buffer's pattern bytes); bytes never written are unknown and
// never checked. Buffers can be gigabytes: the runs cost nothing per byte, only the bytes a
// read-back checks are looked at.
//
// Plain C++; no CUDA.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace differential {

struct Mismatch {
  std::uint64_t offset = 0;
  unsigned got = 0;
  unsigned expected = 0;
};

class Shadow {
 public:
  // [begin, end) now reads `value`.
  void fill(std::uint64_t begin, std::uint64_t end, unsigned char value) {
    assign(begin, Run{end, false, value, 0});
  }
  // [begin, end) now reads pattern[offset + shift].
  void pattern(std::uint64_t begin, std::uint64_t end, std::int64_t shift) {
    assign(begin, Run{end, true, 0, shift});
  }
  // [to, to + n) now reads what `source` had at [from, from + n) (source is another buffer).
  void copy(const Shadow& source, std::uint64_t from, std::uint64_t to, std::uint64_t n) {
    std::vector<std::pair<std::uint64_t, Run>> copied;
    for (auto it = source.first_overlap(from); it != source.runs_.end() && it->first < from + n;
         ++it) {
      std::uint64_t begin = it->first < from ? from : it->first;
      std::uint64_t end = it->second.end > from + n ? from + n : it->second.end;
      Run run = it->second;
      run.end = end - from + to;
      run.shift += static_cast<std::int64_t>(from) - static_cast<std::int64_t>(to);
      copied.emplace_back(begin - from + to, run);
    }
    erase(to, to + n);
    for (const auto& [begin, run] : copied) runs_.emplace(begin, run);
  }
  // Compares n bytes read back from offset `begin` with what is known; true when they agree.
  bool check(const unsigned char* got, std::uint64_t begin, std::uint64_t n,
             const std::vector<unsigned char>& pattern, Mismatch* mismatch) const {
    for (auto it = first_overlap(begin); it != runs_.end() && it->first < begin + n; ++it) {
      std::uint64_t from = it->first < begin ? begin : it->first;
      std::uint64_t to = it->second.end > begin + n ? begin + n : it->second.end;
      for (std::uint64_t offset = from; offset < to; ++offset) {
        unsigned char expected =
            it->second.is_pattern
                ? pattern[static_cast<std::size_t>(static_cast<std::int64_t>(offset) +
                                                   it->second.shift)]
                : it->second.fill;
        if (got[offset - begin] != expected) {
          *mismatch = Mismatch{offset, got[offset - begin], expected};
          return false;
        }
      }
    }
    return true;
  }

 private:
  struct Run {
    std::uint64_t end;
    bool is_pattern;
    unsigned char fill;
    std::int64_t shift;
  };

  std::map<std::uint64_t, Run>::const_iterator first_overlap(std::uint64_t offset) const {
    auto it = runs_.upper_bound(offset);
    if (it != runs_.begin() && std::prev(it)->second.end > offset) --it;
    return it;
  }

  // Cuts the run that straddles `at` in two.
  void split(std::uint64_t at) {
    auto it = runs_.upper_bound(at);
    if (it == runs_.begin()) return;
    --it;
    if (it->first == at || it->second.end <= at) return;
    Run tail = it->second;
    it->second.end = at;
    runs_.emplace(at, tail);
  }

  void erase(std::uint64_t begin, std::uint64_t end) {
    split(begin);
    split(end);
    runs_.erase(runs_.lower_bound(begin), runs_.lower_bound(end));
  }

  void assign(std::uint64_t begin, const Run& run) {
    erase(begin, run.end);
    runs_.emplace(begin, run);
  }

  std::map<std::uint64_t, Run> runs_;  // begin -> run; no two overlap
};

}  // namespace differential
