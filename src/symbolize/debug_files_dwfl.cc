// src/symbolize/debug_files_dwfl.cc: see debug_files_dwfl.h.
#include "src/symbolize/debug_files_dwfl.h"

#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {
namespace {

// Modules are always reported with an open file, so libdwfl has no reason to
// look for one; this keeps dwfl_build_id_find_elf (and its debuginfod
// fallback) out of the picture should it ever try.
int NoFindElf(Dwfl_Module*, void**, const char*, Dwarf_Addr, char**, Elf**) {
  errno = 0;
  return -1;
}

// Whether `elf`'s image is the file open at `fd`: same size and header.
bool ElfIsFile(Elf* elf, int fd) {
  size_t size = 0;
  const char* raw = elf_rawfile(elf, &size);
  struct stat st;
  if (raw == nullptr || fstat(fd, &st) != 0 ||
      static_cast<off_t>(size) != st.st_size) {
    return false;
  }
  unsigned char head[256];
  const size_t n = std::min(size, sizeof head);
  return pread(fd, head, n, 0) == static_cast<ssize_t>(n) &&
         std::memcmp(head, raw, n) == 0;
}

}  // namespace

bool Detach(Elf* elf, int fd, const internal::FdIdentity& identity,
            SessionFiles& files) {
  if (elf == nullptr || !internal::IsStillOurs(fd, identity)) return false;
  GElf_Ehdr ehdr;
  // libdwfl reads a relocatable object's file again, then closes it itself.
  if (gelf_getehdr(elf, &ehdr) == nullptr || ehdr.e_type == ET_REL) return false;
  if (elf_cntl(elf, ELF_C_FDREAD) != 0) return false;
  if (elf_begin(-1, ELF_C_READ_MMAP, elf) != elf) return false;
  files.detached.push_back(elf);
  close(fd);
  return true;
}

void SettleDebugFile(SessionFiles& files, Elf* candidate) {
  if (candidate == nullptr || candidate == files.main_elf) return;
  for (auto it = files.held.begin(); it != files.held.end(); ++it) {
    if (it->debug && internal::IsStillOurs(it->fd, it->identity) &&
        ElfIsFile(candidate, it->fd) &&
        Detach(candidate, it->fd, it->identity, files)) {
      files.held.erase(it);
      return;
    }
  }
}

namespace {

// An Elf and a Dwarf of the session's own for the dwz alt file open at `fd`
// (closed here), set as the module's alt.
void AdoptAltFile(Dwfl_Module* mod, int fd, SessionFiles& files) {
  Dwarf_Addr bias = 0;
  // libdwfl asks for the alt file once the module's Dwarf exists: this
  // returns it without looking for anything.
  Dwarf* dw = dwfl_module_getdwarf(mod, &bias);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  Dwarf* alt = nullptr;
  if (dw != nullptr && files.alt == nullptr && elf != nullptr &&
      elf_cntl(elf, ELF_C_FDREAD) == 0) {
    alt = dwarf_begin_elf(elf, DWARF_C_READ, nullptr);
  }
  close(fd);
  if (alt == nullptr) {
    if (elf != nullptr) elf_end(elf);
    return;
  }
  dwarf_setalt(dw, alt);
  files.alt = alt;
  files.alt_elf = elf;
  // The Dwarf being read is the debug file's when the module has one.
  SettleDebugFile(files, dwarf_getelf(dw));
}

// CRC-32 of the whole file, as .gnu_debuglink records it (zlib's polynomial).
bool FileCrc32(int fd, uint32_t* crc) {
  uLong value = crc32(0L, Z_NULL, 0);
  unsigned char buf[1 << 16];
  off_t offset = 0;
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof buf, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    value = crc32(value, buf, static_cast<uInt>(n));
    offset += n;
  }
  *crc = static_cast<uint32_t>(value);
  return true;
}

// Whether the debug file open at `fd` belongs to `mod`: same GNU build-id
// when the module has one, else the CRC the debuglink recorded.
bool DebugFileMatches(Dwfl_Module* mod, int fd, GElf_Word debuglink_crc) {
  const unsigned char* module_id = nullptr;
  GElf_Addr vaddr = 0;
  const int module_id_len = dwfl_module_build_id(mod, &module_id, &vaddr);
  if (module_id_len > 0) {
    Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
    if (elf == nullptr) return false;
    const void* debug_id = nullptr;
    const ssize_t debug_id_len = dwelf_elf_gnu_build_id(elf, &debug_id);
    const bool same = debug_id_len == module_id_len &&
                      std::memcmp(debug_id, module_id, module_id_len) == 0;
    elf_end(elf);
    return same;
  }
  uint32_t crc = 0;
  return debuglink_crc != 0 && FileCrc32(fd, &crc) && crc == debuglink_crc;
}

// Opens `candidate` if it exists, is not the module's own file, and matches.
int TryDebugFile(Dwfl_Module* mod, const std::string& candidate,
                 const struct stat& main_stat, GElf_Word debuglink_crc,
                 char** debuginfo_file_name) {
  int fd = open(candidate.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 ||
      (st.st_dev == main_stat.st_dev && st.st_ino == main_stat.st_ino) ||
      !DebugFileMatches(mod, fd, debuglink_crc)) {
    close(fd);
    return -1;
  }
  *debuginfo_file_name = strdup(candidate.c_str());
  if (*debuginfo_file_name == nullptr) {
    close(fd);
    return -1;
  }
  return fd;
}

// Dwfl_Callbacks::find_debuginfo without the network: libdwfl's build-id
// search (which also finds dwz "alt" files by build-id), then the
// .gnu_debuglink name in the directories of the debuginfo_path.
int SearchDebugInfo(Dwfl_Module* mod, void** userdata, const char* modname,
                    Dwarf_Addr base, const char* file_name,
                    const char* debuglink_file, GElf_Word debuglink_crc,
                    char** debuginfo_file_name);

// The dwz alt file at the path its .gnu_debugaltlink names (absolute, or
// relative to the directory of `file_name`, the file whose DWARF names it),
// if its build-id is the one the link records: where libdw would otherwise
// open it by itself, on a descriptor of its own.
int OpenAltFileByName(Dwfl_Module* mod, const char* file_name) {
  Dwarf_Addr bias = 0;
  Dwarf* dw = dwfl_module_getdwarf(mod, &bias);
  const char* altname = nullptr;
  const void* id = nullptr;
  const ssize_t id_len =
      dw != nullptr ? dwelf_dwarf_gnu_debugaltlink(dw, &altname, &id) : -1;
  if (id_len <= 0 || altname == nullptr || altname[0] == '\0') return -1;
  std::string path = altname;
  if (path[0] != '/') {
    if (file_name == nullptr) return -1;
    const std::string name(file_name);
    const size_t slash = name.rfind('/');
    path = absl::StrCat(slash == std::string::npos ? "." : name.substr(0, slash),
                        "/", path);
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  const void* file_id = nullptr;
  const bool same = elf != nullptr &&
                    dwelf_elf_gnu_build_id(elf, &file_id) == id_len &&
                    std::memcmp(file_id, id, static_cast<size_t>(id_len)) == 0;
  if (elf != nullptr) elf_end(elf);
  if (!same) {
    close(fd);
    return -1;
  }
  return fd;
}

// Dwfl_Callbacks::find_debuginfo: SearchDebugInfo's file, its descriptor
// handed to libdwfl and tracked (a separate debug file), or opened as the
// session's own alt file (a dwz alt file, whose descriptor libdwfl would
// close in any case; libdwfl is told none was found).
int FindDebugInfoOffline(Dwfl_Module* mod, void** userdata, const char* modname,
                         Dwarf_Addr base, const char* file_name,
                         const char* debuglink_file, GElf_Word debuglink_crc,
                         char** debuginfo_file_name) {
  auto* files = static_cast<SessionFiles*>(*userdata);
  if (files == nullptr || files->in_callback) {
    errno = 0;
    return -1;
  }
  files->in_callback = true;
  // libdwfl asks for the main file's debug file with the main file's own
  // .gnu_debuglink (or none), and for a dwz alt file with its name and no
  // CRC.
  GElf_Word main_crc = 0;
  const char* main_link =
      files->main_elf != nullptr
          ? dwelf_elf_gnu_debuglink(files->main_elf, &main_crc)
          : nullptr;
  const bool alt = debuglink_file != nullptr &&
                   !(main_link != nullptr &&
                     std::strcmp(main_link, debuglink_file) == 0 &&
                     main_crc == debuglink_crc);
  int fd = SearchDebugInfo(mod, userdata, modname, base, file_name,
                           debuglink_file, debuglink_crc, debuginfo_file_name);
  if (fd < 0 && alt) fd = OpenAltFileByName(mod, file_name);
  if (fd >= 0 && alt) {
    AdoptAltFile(mod, fd, *files);
    // Not found, as far as libdwfl knows; and no name to open by itself.
    std::free(*debuginfo_file_name);
    *debuginfo_file_name = nullptr;
    fd = -1;
  } else if (fd >= 0) {
    fd = internal::MoveAboveProgramRange(fd);
    files->held.push_back({fd, internal::IdentifyFd(fd), /*debug=*/true});
  }
  files->in_callback = false;
  errno = 0;
  return fd;
}

int SearchDebugInfo(Dwfl_Module* mod, void** userdata, const char* modname,
                    Dwarf_Addr base, const char* file_name,
                    const char* debuglink_file, GElf_Word debuglink_crc,
                    char** debuginfo_file_name) {
  errno = 0;
  int fd = dwfl_build_id_find_debuginfo(mod, userdata, modname, base,
                                        file_name, debuglink_file,
                                        debuglink_crc, debuginfo_file_name);
  if (fd >= 0) return fd;
  free(*debuginfo_file_name);
  *debuginfo_file_name = nullptr;
  // A .gnu_debuglink always carries a CRC; libdwfl passes 0 when it asks for
  // a dwz alt file, which only the build-id search above can validate.
  if (debuglink_file == nullptr || debuglink_crc == 0 || file_name == nullptr) {
    errno = 0;
    return -1;
  }
  struct stat main_stat{};
  if (stat(file_name, &main_stat) != 0) main_stat = {};

  // ElfSymbols::Open makes the module's userdata the session's files,
  // which carry the session's Dwfl_Callbacks::debuginfo_path.
  char* const* path_setting =
      static_cast<const SessionFiles*>(*userdata)->debuginfo_path;
  const std::string path = path_setting != nullptr && *path_setting != nullptr
                               ? *path_setting
                               : kDefaultDebugInfoPath;

  std::vector<std::string> dirs;
  const std::string name(file_name);
  if (const size_t slash = name.rfind('/'); slash != std::string::npos) {
    dirs.push_back(name.substr(0, slash));
  } else {
    dirs.push_back(".");
  }
  // A module loaded through a symlink may have its debug file next to the
  // target instead.
  if (char* canon = realpath(file_name, nullptr); canon != nullptr) {
    std::string real(canon);
    std::free(canon);
    if (const size_t slash = real.rfind('/');
        slash != std::string::npos && real.substr(0, slash) != dirs[0]) {
      dirs.push_back(real.substr(0, slash));
    }
  }
  for (const std::string& dir : dirs) {
    for (absl::string_view entry : absl::StrSplit(path, ':')) {
      if (!entry.empty() && (entry[0] == '+' || entry[0] == '-')) {
        entry.remove_prefix(1);  // CRC on/off flags: we always validate
      }
      std::string candidate;
      if (entry.empty()) {
        candidate = absl::StrCat(dir, "/", debuglink_file);
      } else if (entry[0] == '/') {
        if (dir.empty() || dir[0] != '/') continue;
        candidate = absl::StrCat(entry, dir, "/", debuglink_file);
      } else {
        candidate = absl::StrCat(dir, "/", entry, "/", debuglink_file);
      }
      fd = TryDebugFile(mod, candidate, main_stat, debuglink_crc,
                        debuginfo_file_name);
      if (fd >= 0) return fd;
    }
  }
  errno = 0;
  return -1;
}

}  // namespace

Dwfl_Callbacks MakeCallbacks(char** debuginfo_path) {
  return Dwfl_Callbacks{
      .find_elf = NoFindElf,
      .find_debuginfo = FindDebugInfoOffline,
      .section_address = dwfl_offline_section_address,
      .debuginfo_path = debuginfo_path,
  };
}

}  // namespace inprof::internal
