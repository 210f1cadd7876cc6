// libFuzzer target: ELF/DWARF module loading (Symbolizer::SymbolizeFile,
// elfutils libdwfl underneath), which reads whatever file a mapping names.
//
// The input is written to a memfd and symbolized by path
// (/proc/self/fd/N) at a few addresses: 0, the ELF entry point read from the
// input, and addresses around it. Checked: nothing crashes; a failure is an
// error status naming the path. The same bytes also go to the line-table
// reader and to the /proc/PID/maps parser.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "inprof/internal/line_table.h"
#include "inprof/internal/process_maps.h"
#include "inprof/symbolizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input as a .debug_line section too (the symbolizer's own
  // line-table reader), its first bytes also standing in for the string
  // sections: an error or a table, never a read outside the spans.
  {
    const std::span<const uint8_t> bytes(data, size);
    inprof::internal::LineSections sections{
        .debug_line = bytes,
        .debug_line_str = bytes.first(std::min<size_t>(size, 64)),
        .debug_str = bytes.first(std::min<size_t>(size, 32))};
    for (uint8_t address_size : {4, 8}) {
      auto table = inprof::internal::LineTable::Read(sections, 0, "/src",
                                                     address_size);
      if (table.ok()) {
        const std::string* file = nullptr;
        int line = 0;
        for (uint64_t a : {uint64_t{0}, uint64_t{0x1000}, ~uint64_t{0}}) {
          if (table->Find(a, &file, &line) && file != nullptr) {
            (void)file->size();
          }
        }
      }
    }
  }
  // The input as another process's /proc/PID/maps (what the agent's
  // symbolizer parses): entries that keep their order, or one error line.
  {
    auto maps = inprof::internal::ParseProcessMaps(
        absl::string_view(reinterpret_cast<const char*>(data), size));
    if (maps.ok()) {
      for (const auto& m : *maps) {
        if (m.limit < m.start) std::abort();
      }
    } else if (maps.status().message().find('\n') != absl::string_view::npos) {
      std::abort();
    }
  }
  static const int fd = memfd_create("inprof-fuzz-elf", 0);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::abort();
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  uint64_t entry = 0x1000;
  if (size >= 32) std::memcpy(&entry, data + 24, sizeof entry);  // e_entry
  const std::vector<uint64_t> addresses = {0, entry, entry + 0x10,
                                           entry - 0x10, 0x1000, 0x1100};
  auto frames = inprof::Symbolizer::SymbolizeFile(path, addresses);
  if (frames.ok()) {
    if (frames->size() != addresses.size()) {
      std::fprintf(stderr, "%zu frame lists for %zu addresses\n",
                   frames->size(), addresses.size());
      std::abort();
    }
  } else if (frames.status().message().find(path) == std::string::npos) {
    std::fprintf(stderr, "error does not name the file: %s\n",
                 std::string(frames.status().message()).c_str());
    std::abort();
  }
  return 0;
}
