// Where the CLI finds what `run` preloads: libpoolcuda.so (relative to this executable, or
// POOLCUDA_LIBRARY), the check that a file really is that library (an ELF shared object for
// this machine exporting the library's marker symbol, read from its dynamic symbol table), and
// where the program's CUDA comes from (a GPU, or the stand-in of a build tree).
//
// Depends on interpose/channel_protocol.h and the standard library; never loads the library.
#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cli.h"
#include "cli_paths.h"
#include "interpose/channel_protocol.h"

namespace poolcuda::cli {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kLibraryName = "libpoolcuda.so";

#if defined(__x86_64__)
constexpr int kMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kMachine = EM_AARCH64;
#else
constexpr int kMachine = EM_NONE;
#endif

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The installed layout: this executable is <prefix>/<bindir>/poolcuda and the library is
// <prefix>/<libdir>/libpoolcuda.so (or <libdir>/libpoolcuda.so when libdir is absolute).
std::optional<fs::path> installed_candidate(const fs::path& exe_dir) {
  const fs::path bindir = POOLCUDA_CLI_BINDIR;
  const fs::path libdir = POOLCUDA_CLI_LIBDIR;
  if (libdir.is_absolute()) return libdir / kLibraryName;
  if (bindir.is_absolute()) return std::nullopt;
  // Strip bindir's components from the end of exe_dir, checking that they match.
  fs::path prefix = exe_dir;
  std::vector<fs::path> parts(bindir.begin(), bindir.end());
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (it->empty() || *it == ".") continue;
    if (prefix.filename() != *it) return std::nullopt;
    prefix = prefix.parent_path();
  }
  return prefix / libdir / kLibraryName;
}

// Reads `size` bytes at `offset`; false on a short read (a truncated file).
bool read_at(int fd, void* out, std::size_t size, std::uint64_t offset) {
  auto* bytes = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, bytes, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

// Whether the dynamic symbol table defines `name`. Section headers are what a stripped
// library still has; a file without them cannot be checked and is refused.
bool defines_dynamic_symbol(int fd, const Elf64_Ehdr& header, std::string_view name) {
  if (header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shnum == 0 ||
      header.e_shnum > 4096) {
    return false;
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  if (!read_at(fd, sections.data(), sections.size() * sizeof(Elf64_Shdr), header.e_shoff)) {
    return false;
  }
  for (const Elf64_Shdr& section : sections) {
    if (section.sh_type != SHT_DYNSYM || section.sh_link >= sections.size() ||
        section.sh_entsize != sizeof(Elf64_Sym) || section.sh_size > (64u << 20)) {
      continue;
    }
    const Elf64_Shdr& strings = sections[section.sh_link];
    if (strings.sh_size > (64u << 20)) continue;
    std::vector<Elf64_Sym> symbols(section.sh_size / sizeof(Elf64_Sym));
    std::vector<char> names(strings.sh_size);
    if (!read_at(fd, symbols.data(), symbols.size() * sizeof(Elf64_Sym), section.sh_offset) ||
        !read_at(fd, names.data(), names.size(), strings.sh_offset)) {
      return false;
    }
    for (const Elf64_Sym& symbol : symbols) {
      if (symbol.st_shndx == SHN_UNDEF || symbol.st_name >= names.size()) continue;
      const char* start = names.data() + symbol.st_name;
      const std::string_view symbol_name(start, ::strnlen(start, names.size() - symbol.st_name));
      if (symbol_name == name) return true;
    }
  }
  return false;
}

}  // namespace

std::string check_library(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  Elf64_Ehdr header{};
  const bool read = read_at(fd, &header, sizeof header, 0);
  std::string why;
  if (!read || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
    why = path + " is not an ELF file, so it cannot be libpoolcuda.so";
  } else if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB) {
    why = path + " is not a 64-bit little-endian ELF object";
  } else if (header.e_type != ET_DYN) {
    why = path + " is an ELF file but not a shared object";
  } else if (header.e_machine != kMachine) {
    why = path + " is a shared object for another machine";
  } else if (!defines_dynamic_symbol(fd, header, channel::kMarkerSymbol)) {
    why = path + " is a shared object but not libpoolcuda.so (it does not export " +
          std::string(channel::kMarkerSymbol) + ")";
  }
  ::close(fd);
  return why;
}

LibraryLookup find_library() {
  LibraryLookup lookup;
  auto accept = [&lookup](const fs::path& path) {
    const std::string why = check_library(path.string());
    if (why.empty()) {
      lookup.path = path.string();
    } else {
      lookup.error = why;
    }
    return lookup;
  };
  if (const char* env = std::getenv("POOLCUDA_LIBRARY"); env != nullptr && *env != '\0') {
    std::error_code ec;
    const fs::path path = fs::absolute(env, ec);
    if (ec || !is_file(path)) {
      lookup.error = "POOLCUDA_LIBRARY is '" + std::string(env) + "', which is not a file";
      return lookup;
    }
    return accept(path.lexically_normal());
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    lookup.error = "cannot read /proc/self/exe (" + ec.message() +
                   ") to find libpoolcuda.so; set POOLCUDA_LIBRARY";
    return lookup;
  }
  const fs::path exe_dir = exe.parent_path();
  std::vector<fs::path> candidates;
  if (auto installed = installed_candidate(exe_dir)) candidates.push_back(*installed);
  // The build tree: build/tools/cli/poolcuda next to build/interpose/libpoolcuda.so.
  if (exe_dir.filename() == "cli" && exe_dir.parent_path().filename() == "tools")
    candidates.push_back(exe_dir.parent_path().parent_path() / "interpose" / kLibraryName);
  if (candidates.empty()) {
    lookup.error = "cannot find libpoolcuda.so: " + exe.string() +
                   " is neither installed with it nor in a build tree; set POOLCUDA_LIBRARY "
                   "to its path";
    return lookup;
  }
  std::string tried;
  for (const auto& candidate : candidates) {
    const fs::path normal = candidate.lexically_normal();
    if (is_file(normal)) return accept(normal);
    tried += (tried.empty() ? "" : ", ") + normal.string();
  }
  lookup.error = "cannot find libpoolcuda.so (tried " + tried +
                 "); set POOLCUDA_LIBRARY to its path";
  return lookup;
}

CudaSource find_cuda(const std::string& library, bool allow_stand_in) {
  CudaSource source;
  std::error_code ec;
  source.gpu = fs::exists("/dev/nvidiactl", ec) || fs::exists("/proc/driver/nvidia/version", ec);
  if (source.gpu) {
    source.description = "the GPU driver";
    return source;
  }
  // A build tree: build/interpose/libpoolcuda.so beside build/tests/simcuda/libcudart.so.13.
  const fs::path stand_in =
      (fs::path(library).parent_path().parent_path() / "tests" / "simcuda").lexically_normal();
  if (!allow_stand_in) {
    source.description = "no GPU found, stand-in not used (--no-stand-in)";
  } else if (is_file(stand_in / "libcudart.so.13")) {
    source.stand_in_dir = stand_in.string();
    source.description = "no GPU found, using the CUDA stand-in in " + source.stand_in_dir;
  } else {
    source.description = "no GPU found and no CUDA stand-in beside the library";
  }
  return source;
}

}  // namespace poolcuda::cli
