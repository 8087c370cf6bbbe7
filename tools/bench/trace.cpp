// The trace text format: parser, writer, validation and the trace's own figures. The parser
// reads the whole file at once and never throws on malformed input: every error names its line.
#include "tools/bench/trace.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <ostream>
#include <sstream>

namespace poolcuda::bench {
namespace {

constexpr std::string_view kMagic = "poolcuda-trace 1";

// Tracks which slots of each thread hold a live buffer while ops are checked in order.
class SlotChecker {
 public:
  explicit SlotChecker(std::size_t threads) : live_(threads) {}

  // Returns an empty string when `op` of thread `t` is legal, and applies it.
  std::string apply(std::size_t t, const Op& op, std::size_t phases) {
    std::vector<bool>& live = live_[t];
    if (op.kind == OpKind::phase) {
      return op.slot < phases ? std::string() : "phase index " + std::to_string(op.slot) +
                                                    " is out of range";
    }
    if (op.slot >= kMaxSlots) {
      return "slot " + std::to_string(op.slot) + " is not below " + std::to_string(kMaxSlots);
    }
    if (op.slot >= live.size()) live.resize(std::max<std::size_t>(op.slot + 1, live.size() * 2));
    if (op.kind == OpKind::allocate) {
      if (op.size == 0 || op.size > kMaxAllocation) {
        return "size " + std::to_string(op.size) + " is not in 1.." +
               std::to_string(kMaxAllocation);
      }
      if (live[op.slot]) return "slot " + std::to_string(op.slot) + " is already live";
      live[op.slot] = true;
    } else {
      if (!live[op.slot]) return "slot " + std::to_string(op.slot) + " is not live";
      live[op.slot] = false;
    }
    return {};
  }

  // The first thread and slot still live, as a message, or an empty string.
  std::string leftover() const {
    for (std::size_t t = 0; t < live_.size(); ++t) {
      for (std::size_t s = 0; s < live_[t].size(); ++s) {
        if (live_[t][s]) {
          return "the trace ends with slot " + std::to_string(s) + " of thread " +
                 std::to_string(t) + " still live";
        }
      }
    }
    return {};
  }

 private:
  std::vector<std::vector<bool>> live_;
};

// Splits one line into whitespace-separated fields (at most `max` of them; the last keeps the
// rest of the line when `rest` is set).
std::vector<std::string_view> fields(std::string_view line, std::size_t max, bool rest) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == line.size()) break;
    if (rest && out.size() + 1 == max) {
      std::size_t end = line.size();
      while (end > i && (line[end - 1] == ' ' || line[end - 1] == '\t')) --end;
      out.push_back(line.substr(i, end - i));
      break;
    }
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
    out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

bool parse_number(std::string_view text, std::uint64_t& out) {
  if (text.empty() || text.size() > 20) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

std::string at_line(std::size_t line, const std::string& message) {
  return "line " + std::to_string(line) + ": " + message;
}

}  // namespace

bool valid_label(std::string_view text) {
  if (text.empty() || text.size() > 64) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
  });
}

TraceFigures figures(const Trace& trace) {
  TraceFigures f;
  for (const ThreadOps& thread : trace.threads) {
    std::vector<std::uint64_t> sizes(thread.slots, 0);
    std::uint64_t live = 0, peak = 0;
    for (const Op& op : thread.ops) {
      if (op.kind == OpKind::allocate) {
        sizes[op.slot] = op.size;
        live += op.size;
        peak = std::max(peak, live);
        ++f.pairs;
        ++f.ops;
        f.bytes_allocated += op.size;
      } else if (op.kind == OpKind::release) {
        live -= sizes[op.slot];
        ++f.ops;
      }
    }
    f.thread_peak_live.push_back(peak);
    f.peak_live += peak;
  }
  return f;
}

std::string validate(const Trace& trace) {
  if (!valid_label(trace.name)) return "the name '" + trace.name + "' is not a valid label";
  if (trace.description.find('\n') != std::string::npos) return "the description has a newline";
  if (trace.threads.empty() || trace.threads.size() > kMaxThreads) {
    return "the thread count " + std::to_string(trace.threads.size()) + " is not in 1.." +
           std::to_string(kMaxThreads);
  }
  for (const std::string& label : trace.phases) {
    if (!valid_label(label)) return "the phase label '" + label + "' is not valid";
  }
  SlotChecker checker(trace.threads.size());
  for (std::size_t t = 0; t < trace.threads.size(); ++t) {
    std::uint32_t slots = 0;
    for (std::size_t i = 0; i < trace.threads[t].ops.size(); ++i) {
      const Op& op = trace.threads[t].ops[i];
      std::string error = checker.apply(t, op, trace.phases.size());
      if (!error.empty()) {
        return "thread " + std::to_string(t) + ", operation " + std::to_string(i) + ": " + error;
      }
      if (op.kind != OpKind::phase) slots = std::max(slots, op.slot + 1);
    }
    if (slots != trace.threads[t].slots) {
      return "thread " + std::to_string(t) + " declares " +
             std::to_string(trace.threads[t].slots) + " slots but uses " + std::to_string(slots);
    }
  }
  return checker.leftover();
}

void write_trace(const Trace& trace, std::ostream& out) {
  std::string buffer;
  buffer.reserve(1 << 20);
  auto flush = [&] {
    out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    buffer.clear();
  };
  buffer += kMagic;
  buffer += "\nname " + trace.name + "\n";
  if (!trace.description.empty()) buffer += "description " + trace.description + "\n";
  buffer += "seed " + std::to_string(trace.seed) + "\n";
  buffer += "threads " + std::to_string(trace.threads.size()) + "\n";
  for (std::size_t t = 0; t < trace.threads.size(); ++t) {
    buffer += "thread " + std::to_string(t) + "\n";
    for (const Op& op : trace.threads[t].ops) {
      switch (op.kind) {
        case OpKind::allocate:
          buffer += "a " + std::to_string(op.slot) + " " + std::to_string(op.size) + "\n";
          break;
        case OpKind::release:
          buffer += "f " + std::to_string(op.slot) + "\n";
          break;
        case OpKind::phase:
          buffer += "phase " + trace.phases[op.slot] + "\n";
          break;
      }
      if (buffer.size() > (1 << 20) - 128) flush();
    }
  }
  flush();
}

ParseOutcome parse_trace(std::string_view text) {
  ParseOutcome result;
  Trace trace;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  bool have_name = false, have_seed = false, have_threads = false, have_description = false;
  std::optional<SlotChecker> checker;
  ThreadOps* current = nullptr;
  std::size_t current_index = 0;
  auto fail = [&](const std::string& message) {
    result.error = at_line(line_no, message);
    return result;
  };
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1) {
      if (line != kMagic) return fail("expected '" + std::string(kMagic) + "'");
      continue;
    }
    const bool is_description = line.substr(0, 12) == "description " || line == "description";
    std::vector<std::string_view> f = fields(line, is_description ? 2 : 4, is_description);
    if (f.empty() || f[0][0] == '#') continue;
    const std::string_view key = f[0];
    if (key == "a" || key == "f" || key == "phase" || key == "thread") {
      if (!have_name || !have_threads) return fail("'name' and 'threads' must come first");
      if (!checker) checker.emplace(trace.threads.size());
    }
    std::uint64_t n = 0, size = 0;
    if (key == "a" || key == "f") {
      const std::size_t want = key == "a" ? 3 : 2;
      if (f.size() != want) {
        return fail(key == "a" ? "expected 'a SLOT SIZE'" : "expected 'f SLOT'");
      }
      if (!current) return fail("an operation before any 'thread' line");
      if (!parse_number(f[1], n) || n >= kMaxSlots) {
        return fail("slot '" + std::string(f[1]) + "' is not a number below " +
                    std::to_string(kMaxSlots));
      }
      if (key == "a" && !parse_number(f[2], size)) {
        return fail("size '" + std::string(f[2]) + "' is not a number");
      }
      Op op{key == "a" ? OpKind::allocate : OpKind::release, static_cast<std::uint32_t>(n), size};
      std::string error = checker->apply(current_index, op, trace.phases.size());
      if (!error.empty()) return fail(error);
      current->ops.push_back(op);
      current->slots = std::max(current->slots, op.slot + 1);
    } else if (key == "phase") {
      if (f.size() != 2 || !valid_label(f[1])) return fail("expected 'phase LABEL'");
      if (!current) return fail("an operation before any 'thread' line");
      auto it = std::find(trace.phases.begin(), trace.phases.end(), f[1]);
      if (it == trace.phases.end()) it = trace.phases.insert(it, std::string(f[1]));
      current->ops.push_back({OpKind::phase,
                              static_cast<std::uint32_t>(it - trace.phases.begin()), 0});
    } else if (key == "thread") {
      if (f.size() != 2 || !parse_number(f[1], n) || n >= trace.threads.size()) {
        return fail("expected 'thread K' with K below " + std::to_string(trace.threads.size()));
      }
      current_index = static_cast<std::size_t>(n);
      current = &trace.threads[current_index];
    } else if (key == "name" || key == "seed" || key == "threads" || key == "description") {
      if (checker) return fail("'" + std::string(key) + "' after the first operation");
      bool& seen = key == "name" ? have_name : key == "seed" ? have_seed
                 : key == "threads" ? have_threads : have_description;
      if (seen) return fail("'" + std::string(key) + "' given twice");
      seen = true;
      if (key == "description") {
        if (f.size() == 2) trace.description = std::string(f[1]);
      } else if (f.size() != 2) {
        return fail("expected '" + std::string(key) + " VALUE'");
      } else if (key == "name") {
        if (!valid_label(f[1])) return fail("name '" + std::string(f[1]) + "' is not valid");
        trace.name = std::string(f[1]);
      } else if (key == "seed") {
        if (!parse_number(f[1], trace.seed)) return fail("seed is not a number");
      } else {
        if (!parse_number(f[1], n) || n == 0 || n > kMaxThreads) {
          return fail("threads must be 1.." + std::to_string(kMaxThreads));
        }
        trace.threads.resize(static_cast<std::size_t>(n));
      }
    } else {
      return fail("unknown line '" + std::string(key) + "'");
    }
  }
  if (line_no == 0) return fail("empty file");
  if (!have_name || !have_threads) return fail("'name' and 'threads' are required");
  if (checker) {
    std::string leftover = checker->leftover();
    if (!leftover.empty()) return fail(leftover);
  }
  result.trace = std::move(trace);
  return result;
}

ParseOutcome read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {std::nullopt, path + ": cannot be read"};
  std::ostringstream text;
  text << in.rdbuf();
  ParseOutcome outcome = parse_trace(text.str());
  if (!outcome.trace) outcome.error = path + ": " + outcome.error;
  return outcome;
}

}  // namespace poolcuda::bench
