// Symbolizer on elfutils' libdwfl.
//
// The module map comes from dl_iterate_phdr (the loader's own list, so it
// agrees with what the process executes, including the vDSO); for another
// process (Symbolizer::ForProcess), from its /proc/PID/maps (ScanProcess). Each loaded
// ELF object gets its own Dwfl session holding exactly one module, opened
// lazily on the first lookup inside it and placed at bias 0, so that lookups
// use file virtual addresses (runtime address minus the load bias). One
// session per object keeps a broken file from affecting the others, lets
// SymbolizeFile() share the code with the live path, and makes unloading a
// module a matter of dropping its session.
//
// Separate debug files are found by our own find_debuginfo callback rather
// than dwfl_standard_find_debuginfo: in elfutils 0.188 the standard one ends
// every unsuccessful search by dlopen()ing libdebuginfod and, when
// DEBUGINFOD_URLS is set (Debian sets it in /etc/profile.d), downloading the
// file over the network, inside the profiled process, for up to
// DEBUGINFOD_TIMEOUT per module.
//
// libdwfl keeps each file's descriptor for as long as its session lives and
// closes that number at dwfl_end(); by then the program may have closed it
// (a daemon's close_range(3, ~0U, 0)) and reused the number for a file of
// its own. So the sessions keep no descriptor: see SessionFiles.

#include "inprof/symbolizer.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <deque>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "inprof/internal/elf_notes.h"
#include "inprof/internal/line_table.h"
#include "inprof/internal/process_maps.h"
#include "inprof/internal/log.h"
#include "inprof/internal/owned_fd.h"

namespace inprof {
namespace {

using Caps = Symbolizer::ModuleCapabilities;

// Demangles an Itanium C++ ABI name; returns the input when it is not one.
std::string Demangle(const char* mangled) {
  if (mangled == nullptr) return "";
  if (mangled[0] != '_' || mangled[1] != 'Z') return mangled;
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) {
    std::free(demangled);
    return mangled;
  }
  std::string result(demangled);
  std::free(demangled);
  return result;
}

std::string HexBytes(const unsigned char* bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

// The build-id, in hex, of one note segment mapped at [data, data + size).
std::string BuildIdFromNotes(const unsigned char* data, size_t size,
                             size_t align) {
  const std::string id = internal::GnuBuildIdFromNotes(data, size, align);
  return HexBytes(reinterpret_cast<const unsigned char*>(id.data()), id.size());
}

// One line on stderr ("inprof: ..."); callers warn once per module.
void Warn(const absl::Status& status) {
  internal::Log(absl::StrReplaceAll(status.message(), {{"\n", " "}}));
}

absl::Status CannotRead(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot read symbols of ", path, ": ", reason));
}

std::string DwflError() {
  const char* msg = dwfl_errmsg(-1);
  return msg != nullptr ? msg : "unknown libdwfl error";
}

// Checks that the ELF headers, program headers, section headers and section
// contents all lie inside the file. libelf maps what it is given; a
// truncated file otherwise shows up later as missing symbols, or not at all.
absl::Status CheckElfFits(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return CannotRead(path, absl::StrCat("fstat: ", std::strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) {
    return CannotRead(path,
                      absl::StrCat("not an ELF file (", elf_errmsg(-1), ")"));
  }
  absl::Status status;
  auto fits = [size](uint64_t offset, uint64_t length) {
    return offset <= size && length <= size - offset;
  };
  GElf_Ehdr ehdr;
  size_t shnum = 0;
  if (elf_kind(elf) != ELF_K_ELF) {
    status = CannotRead(path, "not an ELF file (bad magic)");
  } else if (gelf_getehdr(elf, &ehdr) == nullptr) {
    status =
        CannotRead(path, absl::StrCat("bad ELF header (", elf_errmsg(-1), ")"));
  } else if (!fits(ehdr.e_phoff, uint64_t{ehdr.e_phnum} * ehdr.e_phentsize)) {
    status = CannotRead(
        path, absl::StrFormat("truncated or corrupt: program headers at "
                              "offset %u exceed the file size %u",
                              ehdr.e_phoff, size));
  } else if (ehdr.e_shoff != 0 &&
             !fits(ehdr.e_shoff, uint64_t{std::max<uint16_t>(ehdr.e_shnum, 1)} *
                                     ehdr.e_shentsize)) {
    // Checked on the raw header: libelf quietly reports no sections when the
    // table lies beyond the end of the file.
    status = CannotRead(
        path, absl::StrFormat("truncated or corrupt: %u section headers at "
                              "offset %u exceed the file size %u",
                              ehdr.e_shnum, ehdr.e_shoff, size));
  } else if (elf_getshdrnum(elf, &shnum) != 0) {
    status = CannotRead(
        path, absl::StrCat("bad section header count (", elf_errmsg(-1), ")"));
  } else if (shnum > 0 &&
             !fits(ehdr.e_shoff, uint64_t{shnum} * ehdr.e_shentsize)) {
    status = CannotRead(
        path, absl::StrFormat("truncated or corrupt: %u section headers at "
                              "offset %u exceed the file size %u",
                              shnum, ehdr.e_shoff, size));
  } else {
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr;
         scn = elf_nextscn(elf, scn)) {
      GElf_Shdr shdr;
      if (gelf_getshdr(scn, &shdr) == nullptr) {
        status = CannotRead(
            path, absl::StrCat("bad section header (", elf_errmsg(-1), ")"));
        break;
      }
      if (shdr.sh_type != SHT_NOBITS && !fits(shdr.sh_offset, shdr.sh_size)) {
        status = CannotRead(
            path, absl::StrFormat("truncated or corrupt: section %u ends at "
                                  "offset %u beyond the file size %u",
                                  elf_ndxscn(scn),
                                  shdr.sh_offset + shdr.sh_size, size));
        break;
      }
    }
  }
  elf_end(elf);
  return status;
}

// Name of a subprogram or inlined-subroutine DIE: the demangled linkage name
// when there is one (qualified, with parameters, like the symbol table's),
// else DW_AT_name. Follows DW_AT_abstract_origin and DW_AT_specification.
void DieName(Dwarf_Die* die, std::string* function, std::string* system_name) {
  Dwarf_Attribute attr;
  const char* linkage = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) != nullptr ||
      dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr) != nullptr) {
    linkage = dwarf_formstring(&attr);
  }
  if (linkage != nullptr) {
    *function = Demangle(linkage);
    *system_name = linkage;
    return;
  }
  const char* name = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr) {
    name = dwarf_formstring(&attr);
  }
  *function = name != nullptr ? name : "";
  *system_name = *function;
}

// DW_AT_call_file / DW_AT_call_line of an inlined-subroutine DIE.
// `lines`: the unit's line table as our reader read it (its file table is
// the one DW_AT_call_file indexes), or null to ask libdw, whose
// dwarf_getsrcfiles decodes the unit's whole line program for it.
void CallSite(Dwarf_Die* inlined, const internal::LineTable* lines,
              std::string* file, int64_t* line) {
  file->clear();
  *line = 0;
  Dwarf_Attribute attr;
  Dwarf_Word value = 0;
  if (dwarf_attr(inlined, DW_AT_call_line, &attr) != nullptr &&
      dwarf_formudata(&attr, &value) == 0 &&
      value <= static_cast<Dwarf_Word>(std::numeric_limits<int64_t>::max())) {
    *line = static_cast<int64_t>(value);
  }
  if (dwarf_attr(inlined, DW_AT_call_file, &attr) == nullptr ||
      dwarf_formudata(&attr, &value) != 0) {
    return;
  }
  if (lines != nullptr) {
    if (const std::string* name = lines->File(value); name != nullptr) {
      *file = *name;
    }
    return;
  }
  Dwarf_Die cu;
  if (dwarf_diecu(inlined, &cu, nullptr, nullptr) == nullptr) return;
  Dwarf_Files* files = nullptr;
  size_t nfiles = 0;
  if (dwarf_getsrcfiles(&cu, &files, &nfiles) != 0 || value >= nfiles) return;
  const char* name = dwarf_filesrc(files, value, nullptr, nullptr);
  if (name != nullptr) *file = name;
}

// libdwfl's default debuginfo_path (libdwflP.h's DEFAULT_DEBUGINFO_PATH).
constexpr char kDefaultDebugInfoPath[] = ":.debug:/usr/lib/debug";

// Modules are always reported with an open file, so libdwfl has no reason to
// look for one; this keeps dwfl_build_id_find_elf (and its debuginfod
// fallback) out of the picture should it ever try.
int NoFindElf(Dwfl_Module*, void**, const char*, Dwarf_Addr, char**, Elf**) {
  errno = 0;
  return -1;
}

// The files of one session (ElfSymbols) and what keeps libdwfl from closing
// a descriptor number that may no longer be inprof's. libdwfl closes a
// file's descriptor when its session ends, if its elf_end() is the last
// reference to the file's Elf. So as soon as the session can reach the Elf
// of a file libdwfl opened, it detaches it (Detach: libelf has mapped or
// read the whole file and forgets the descriptor; a reference of the
// session's own makes libdwfl's elf_end() not the last) and closes the
// descriptor itself, right away: the main file when it is reported, a
// separate debug file once the symbol table or the DWARF shows its Elf
// (SettleDebugFile). A dwz alt file (whose descriptor libdwfl closes in any
// case) is never handed to libdwfl: the session opens it as an Elf and a
// Dwarf of its own, set as the module's alt. A descriptor that cannot be
// detached (a relocatable object, whose descriptor libdwfl closes itself)
// stays libdwfl's, and the session ends only if that number is still
// inprof's; otherwise the session is left allocated (counted in the log):
// the program's file matters more than the memory.
struct SessionFiles {
  char* const* debuginfo_path = nullptr;  // Dwfl_Callbacks::debuginfo_path
  Elf* main_elf = nullptr;  // the module's (libdwfl's)
  // Detached Elfs: the session's own references, ended after dwfl_end().
  std::vector<Elf*> detached;
  // Descriptors libdwfl still holds, with what they were when opened.
  struct Held {
    int fd = -1;
    internal::FdIdentity identity;
    bool debug = false;  // the separate debug file's (SettleDebugFile)
  };
  std::vector<Held> held;
  // The dwz alt file, when the debug info has one.
  Elf* alt_elf = nullptr;
  Dwarf* alt = nullptr;
  bool in_callback = false;
};

// Makes `elf`, which libdwfl opened on `fd`, independent of `fd` and closes
// `fd` (see SessionFiles). False, nothing changed, when libelf cannot read
// the whole file or `fd` is not inprof's any more.
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

// A separate debug file libdwfl opened on a descriptor it still holds:
// detached once `candidate` (an Elf the session can reach) is that file.
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

// The module's symbols (.symtab, else .dynsym, plus a MiniDebugInfo table)
// sorted by address, for the symbol "closest" to an address as
// dwfl_module_addrinfo() defines it: the nearest symbol at or below it whose
// st_size covers it, global binding preferred; failing that, the nearest
// sizeless one (assembly labels) in the same section that no sized symbol
// overlaps. dwfl_module_addrinfo() scans the whole table on each call (tens
// of microseconds per address in a large program).
class SymbolTable {
 public:
  explicit SymbolTable(Dwfl_Module* mod) : mod_(mod) {
    const int count = dwfl_module_getsymtab(mod);
    symtab_count_ = count > 0 ? count : 0;
    // Room for every symbol at once: a large table grown by doubling costs
    // its copies and fresh pages each time (on the export's critical path).
    if (count > 0) entries_.reserve(static_cast<size_t>(count) + 64);
    for (int i = 0; i < count; ++i) {
      GElf_Sym sym;
      GElf_Addr value = 0;
      GElf_Word shndx = 0;
      Elf* elf = nullptr;
      Dwarf_Addr bias = 0;
      const char* name =
          dwfl_module_getsym_info(mod, i, &sym, &value, &shndx, &elf, &bias);
      const int type = GELF_ST_TYPE(sym.st_info);
      if (name == nullptr || name[0] == '\0' || sym.st_shndx == SHN_UNDEF ||
          type == STT_SECTION || type == STT_FILE || type == STT_TLS) {
        continue;
      }
      Entry e;
      e.start = value;
      e.size = Clamp32(sym.st_size);
      if (e.size != 0) {
        e.extent = e.size;
      } else if (const uint64_t end =
                     SectionEnd(elf, shndx, value, sym.st_value);
                 end > value) {
        e.extent = Clamp32(end - value);
      }
      e.type = static_cast<uint8_t>(type);
      e.binding = static_cast<uint8_t>(BindingRank(GELF_ST_BIND(sym.st_info)));
      e.order = static_cast<uint32_t>(i);
      entries_.push_back(e);
    }
    AddPltEntries(mod);
    std::sort(entries_.begin(), entries_.end(),
              [](const Entry& a, const Entry& b) {
                return a.start != b.start ? a.start < b.start
                                          : a.order < b.order;
              });
    // reach_[i]: the furthest any symbol in entries_[0..i] extends (sizeless
    // ones count as their own address), for stopping backward scans.
    reach_.resize(entries_.size());
    uint64_t reach = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      reach = std::max(reach, entries_[i].start + entries_[i].size);
      reach_[i] = reach;
    }
  }

  // The symbol's name and type (STT_*), or nullptr.
  const char* Find(uint64_t addr, int* type) const {
    auto it = std::upper_bound(
        entries_.begin(), entries_.end(), addr,
        [](uint64_t a, const Entry& e) { return a < e.start; });
    if (it == entries_.begin()) return nullptr;
    const size_t last = static_cast<size_t>(it - entries_.begin()) - 1;
    // Any symbol at or below addr ending past a sizeless one hides it.
    const uint64_t min_label = reach_[last];
    const Entry* sized = nullptr;
    const Entry* sizeless = nullptr;
    for (size_t i = last + 1; i-- > 0;) {
      if (reach_[i] <= addr) break;  // nothing at or before i reaches addr
      const Entry& e = entries_[i];
      if (sized != nullptr && e.start < sized->start) break;
      if (e.size != 0 && addr - e.start < e.size) {
        if (sized == nullptr || Better(e, *sized)) sized = &e;
      }
    }
    if (sized == nullptr) {
      for (size_t i = last + 1; i-- > 0;) {
        const Entry& e = entries_[i];
        if (e.start < min_label) break;
        if (sizeless != nullptr && e.start < sizeless->start) break;
        if (e.size == 0 && addr - e.start < e.extent &&
            (sizeless == nullptr || e.binding > sizeless->binding ||
             (e.binding == sizeless->binding && e.order < sizeless->order))) {
          sizeless = &e;
        }
      }
    }
    const Entry* best = sized != nullptr ? sized : sizeless;
    if (best == nullptr) return nullptr;
    *type = best->type;
    return NameOf(*best);
  }

 private:
  // 24 bytes: a system library's table holds 10,000 of them (libc with its
  // debug file), built at the last export of every short run, where the
  // fresh pages and the sort cost more than reading the symbols. The name
  // is read back from the module's table for the one symbol a lookup
  // returns.
  struct Entry {
    uint64_t start = 0;
    uint32_t size = 0;    // st_size; 0: a sizeless label
    uint32_t extent = 0;  // sized: size; sizeless: to its section's end
    uint32_t order = 0;   // index in the module's table; PLT stubs after it
    uint8_t type = 0;     // STT_*
    uint8_t binding = 0;  // higher is preferred
  };
  static_assert(sizeof(Entry) == 24);

  static uint32_t Clamp32(uint64_t v) {
    return v > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(v);
  }

  // libelf's string for a symbol of the table (stable while the module is
  // open), or the PLT stub's own name.
  const char* NameOf(const Entry& e) const {
    if (e.order >= symtab_count_) {
      return plt_names_[e.order - symtab_count_].c_str();
    }
    GElf_Sym sym;
    GElf_Addr value = 0;
    GElf_Word shndx = 0;
    Elf* elf = nullptr;
    Dwarf_Addr bias = 0;
    return dwfl_module_getsym_info(mod_, static_cast<int>(e.order), &sym,
                                   &value, &shndx, &elf, &bias);
  }

  // PLT stubs have no symbols of their own; name them "<function>@plt" as
  // objdump and perf do. Entry i of .rela.plt (a JUMP_SLOT relocation naming
  // a .dynsym symbol) is the stub at .plt.sec + 16 i when the object has
  // that section (IBT builds), else .plt + 16 (i + 1) (.plt's first entry
  // calls the resolver). Lazily bound or not, the stubs are where they are.
  void AddPltEntries(Dwfl_Module* mod) {
    Dwarf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(mod, &bias);
    if (elf == nullptr) return;
    size_t shstrndx = 0;
    if (elf_getshdrstrndx(elf, &shstrndx) != 0) return;
    Elf_Scn* rela = nullptr;
    GElf_Shdr rela_hdr{}, plt_hdr{}, plt_sec_hdr{};
    bool have_plt = false, have_plt_sec = false;
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr;
         scn = elf_nextscn(elf, scn)) {
      GElf_Shdr hdr;
      if (gelf_getshdr(scn, &hdr) == nullptr) continue;
      const char* name = elf_strptr(elf, shstrndx, hdr.sh_name);
      if (name == nullptr) continue;
      if (std::strcmp(name, ".rela.plt") == 0 && hdr.sh_type == SHT_RELA) {
        rela = scn;
        rela_hdr = hdr;
      } else if (std::strcmp(name, ".plt") == 0) {
        plt_hdr = hdr;
        have_plt = true;
      } else if (std::strcmp(name, ".plt.sec") == 0) {
        plt_sec_hdr = hdr;
        have_plt_sec = true;
      }
    }
    if (rela == nullptr || (!have_plt && !have_plt_sec)) return;
    Elf_Scn* dynsym = elf_getscn(elf, rela_hdr.sh_link);
    GElf_Shdr dynsym_hdr;
    Elf_Data* rela_data = elf_getdata(rela, nullptr);
    Elf_Data* sym_data = dynsym != nullptr ? elf_getdata(dynsym, nullptr) : nullptr;
    if (rela_data == nullptr || sym_data == nullptr ||
        gelf_getshdr(dynsym, &dynsym_hdr) == nullptr ||
        rela_hdr.sh_entsize == 0) {
      return;
    }
    constexpr uint64_t kStub = 16;
    const uint64_t base =
        have_plt_sec ? plt_sec_hdr.sh_addr : plt_hdr.sh_addr + kStub;
    const uint64_t limit = have_plt_sec ? plt_sec_hdr.sh_addr + plt_sec_hdr.sh_size
                                        : plt_hdr.sh_addr + plt_hdr.sh_size;
    const size_t n = rela_hdr.sh_size / rela_hdr.sh_entsize;
    for (size_t i = 0; i < n; ++i) {
      GElf_Rela r;
      if (gelf_getrela(rela_data, static_cast<int>(i), &r) == nullptr) break;
      const uint64_t start = base + kStub * i;
      if (start + kStub > limit) break;
      if (GELF_R_TYPE(r.r_info) != R_X86_64_JUMP_SLOT) continue;
      GElf_Sym sym;
      if (gelf_getsym(sym_data, static_cast<int>(GELF_R_SYM(r.r_info)), &sym) ==
          nullptr) {
        continue;
      }
      const char* name = elf_strptr(elf, dynsym_hdr.sh_link, sym.st_name);
      if (name == nullptr || name[0] == '\0') continue;
      Entry e;
      e.start = start + bias;
      e.size = kStub;
      e.extent = kStub;
      e.type = STT_FUNC;
      e.binding = static_cast<uint8_t>(BindingRank(STB_LOCAL));
      e.order = symtab_count_ + static_cast<uint32_t>(plt_names_.size());
      plt_names_.push_back(absl::StrCat(name, "@plt"));
      entries_.push_back(e);
    }
  }

  static int BindingRank(int bind) {
    switch (bind) {
      case STB_GLOBAL:
        return 3;
      case STB_WEAK:
        return 2;
      case STB_LOCAL:
        return 1;
      default:
        return 0;
    }
  }

  // Between two sized symbols at the same address that both cover it: the
  // global one, then the smaller, then the first in the table.
  static bool Better(const Entry& a, const Entry& b) {
    if (a.binding != b.binding) return a.binding > b.binding;
    if (a.size != b.size) return a.size < b.size;
    return a.order < b.order;
  }

  // End of the section holding a sizeless symbol, in the symbol's adjusted
  // address space; absolute symbols cover only their own address.
  static uint64_t SectionEnd(Elf* elf, GElf_Word shndx, uint64_t value,
                             uint64_t st_value) {
    if (shndx == SHN_UNDEF || shndx >= SHN_LORESERVE || elf == nullptr) {
      return value + 1;
    }
    GElf_Shdr shdr;
    Elf_Scn* scn = elf_getscn(elf, shndx);
    if (scn == nullptr || gelf_getshdr(scn, &shdr) == nullptr ||
        st_value < shdr.sh_addr) {
      return value + 1;
    }
    return value + (shdr.sh_addr + shdr.sh_size - st_value);
  }

  Dwfl_Module* mod_;
  uint32_t symtab_count_ = 0;
  std::vector<std::string> plt_names_;  // "<function>@plt", by order
  std::vector<Entry> entries_;  // by address, then table order
  std::vector<uint64_t> reach_;
};

// The functions (DW_TAG_subprogram) and inlined instances
// (DW_TAG_inlined_subroutine) of one compilation unit that have code, with
// their address ranges and nesting. dwarf_getscopes() walks the tree on
// every call, which costs milliseconds per address in the CUs of
// template-heavy C++ (measured with bench/symbolizer_benchmark: 3-4 ms per
// address before this index). The index is built in two steps: the CU's
// functions (one walk of the CU's top levels, not of their bodies), then a
// function's inside (its inlined instances and blocks) the first time an
// address falls in it: an export that names a few addresses in a large CU
// reads the few functions it needs (the last export of a short run spent
// 4 ms reading every function body of one CU).
class CuScopes {
 public:
  explicit CuScopes(Dwarf_Die* cu) {
    Collect(cu, -1, 0, &ranges_, /*expand=*/false);
    SortRanges(&ranges_);
  }

  // Appends the chain at DWARF address `pc`: inlined instances innermost
  // first, then the enclosing function. Empty when no function covers pc.
  void Chain(uint64_t pc, std::vector<Dwarf_Die>* chain) {
    int node = Innermost(ranges_, pc);
    if (node >= 0 && !nodes_[node].inlined) {
      if (!nodes_[node].expanded) Expand(node);
      const int inner = Innermost(inner_[nodes_[node].inner], pc);
      if (inner >= 0) node = inner;
    }
    for (int n = node; n >= 0; n = nodes_[n].parent) {
      chain->push_back(nodes_[n].die);
      if (!nodes_[n].inlined) break;
    }
  }

 private:
  struct Node {
    Dwarf_Die die;
    int parent;        // index into nodes_; -1: none
    bool inlined;      // DW_TAG_inlined_subroutine, else a subprogram
    bool expanded;     // its inside is indexed (in inner_[inner])
    size_t inner;
    size_t first_range;  // [first_range, end_range) in node_ranges_
    size_t end_range;
  };
  struct Range {
    uint64_t low;
    uint64_t high;  // exclusive
    int node;
  };

  // Deeper nesting only comes from corrupt DWARF; stop before the stack
  // does.
  static constexpr int kMaxDepth = 256;

  static void SortRanges(std::vector<Range>* ranges) {
    std::sort(ranges->begin(), ranges->end(),
              [](const Range& a, const Range& b) {
                return a.low != b.low ? a.low < b.low : a.node < b.node;
              });
  }

  bool Covers(int node, uint64_t pc) const {
    for (size_t i = nodes_[node].first_range; i < nodes_[node].end_range;
         ++i) {
      if (node_ranges_[i].low <= pc && pc < node_ranges_[i].high) return true;
    }
    return false;
  }

  // The innermost node of `ranges` (sorted) covering pc, or -1. Ranges nest
  // (a scope's code lies inside its parent's), so it is the last range
  // starting at or before pc or one of that range's ancestors.
  int Innermost(const std::vector<Range>& ranges, uint64_t pc) const {
    auto it = std::upper_bound(
        ranges.begin(), ranges.end(), pc,
        [](uint64_t a, const Range& r) { return a < r.low; });
    // A few ranges back, in case a sibling's range begins inside a scope
    // split into several ranges.
    for (int tries = 0; tries < 8 && it != ranges.begin(); ++tries) {
      --it;
      for (int n = it->node; n >= 0; n = nodes_[n].parent) {
        if (Covers(n, pc)) return n;
      }
    }
    return -1;
  }

  // Indexes the inside of function `node`.
  void Expand(int node) {
    std::vector<Range> inner;
    Dwarf_Die die = nodes_[node].die;  // nodes_ grows below
    Collect(&die, node, 1, &inner, /*expand=*/true);
    SortRanges(&inner);
    nodes_[node].expanded = true;
    nodes_[node].inner = inner_.size();
    inner_.push_back(std::move(inner));
  }

  // Adds the scopes under `parent_die` to nodes_ and their ranges to
  // *ranges; without `expand`, a function's inside is left for Expand().
  void Collect(Dwarf_Die* parent_die, int parent, int depth,
               std::vector<Range>* ranges, bool expand) {
    if (depth > kMaxDepth) return;
    Dwarf_Die child;
    if (dwarf_child(parent_die, &child) != 0) return;
    do {
      const int tag = dwarf_tag(&child);
      int node = parent;
      switch (tag) {
        case DW_TAG_subprogram:
        case DW_TAG_inlined_subroutine: {
          const size_t first = node_ranges_.size();
          Dwarf_Addr base = 0, start = 0, end = 0;
          ptrdiff_t offset = 0;
          while ((offset = dwarf_ranges(&child, offset, &base, &start, &end)) >
                 0) {
            if (start < end) {
              node_ranges_.push_back(
                  {start, end, static_cast<int>(nodes_.size())});
            }
          }
          // Declarations and abstract instances have no code of their own
          // and nothing concrete inside.
          if (node_ranges_.size() == first) continue;
          node = static_cast<int>(nodes_.size());
          nodes_.push_back({child, parent, tag == DW_TAG_inlined_subroutine,
                            expand, 0, first, node_ranges_.size()});
          ranges->insert(ranges->end(), node_ranges_.begin() + first,
                         node_ranges_.end());
          if (!expand) continue;  // its inside: on first use
          break;
        }
        case DW_TAG_lexical_block:
        case DW_TAG_namespace:
        case DW_TAG_module:
        case DW_TAG_class_type:
        case DW_TAG_structure_type:
        case DW_TAG_union_type:
        case DW_TAG_try_block:
        case DW_TAG_catch_block:
          break;  // may hold functions: look inside
        default:
          continue;  // types, variables, parameters: no code inside
      }
      Collect(&child, node, depth + 1, ranges, expand);
    } while (dwarf_siblingof(&child, &child) == 0);
  }

  std::vector<Node> nodes_;
  std::vector<Range> node_ranges_;  // grouped by node
  std::vector<Range> ranges_;       // the CU's functions', sorted by low
  std::vector<std::vector<Range>> inner_;  // an expanded function's inside
};

// Callbacks for sessions whose debug-info path is `*debuginfo_path` (null:
// the default). Offline only: see FindDebugInfoOffline.
Dwfl_Callbacks MakeCallbacks(char** debuginfo_path) {
  return Dwfl_Callbacks{
      .find_elf = NoFindElf,
      .find_debuginfo = FindDebugInfoOffline,
      .section_address = dwfl_offline_section_address,
      .debuginfo_path = debuginfo_path,
  };
}

// Heap bytes one cache entry holds (its node, frames and out-of-line
// strings) plus its slot in the hash table.
size_t EntryBytes(const SymbolizedAddress& entry) {
  auto string_bytes = [](const std::string& s) {
    // Strings up to the small-string capacity live inside the object.
    return s.capacity() > std::string().capacity() ? s.capacity() + 1 : 0;
  };
  size_t bytes = sizeof(SymbolizedAddress) + sizeof(uint64_t) +
                 sizeof(std::unique_ptr<SymbolizedAddress>) +
                 entry.frames.capacity() * sizeof(SourceFrame);
  for (const SourceFrame& f : entry.frames) {
    bytes += string_bytes(f.function) + string_bytes(f.system_name) +
             string_bytes(f.file);
  }
  return bytes;
}

// The distribution's libraries, whose debug info comes (if at all) from a
// separate, compressed debug file.
bool IsSystemLibrary(const std::string& path) {
  for (const char* dir : {"/lib/", "/usr/lib/", "/lib64/", "/usr/lib64/"}) {
    if (path.rfind(dir, 0) == 0) return true;
  }
  return false;
}

// Symbols and debug info of one ELF object: a Dwfl session with one module
// placed at bias 0.
class ElfSymbols {
 public:
  // Takes ownership of `fd` in all cases. `path` names the object in errors
  // and is where .gnu_debuglink files are looked for; `expected_build_id`
  // (if non-empty) must match the file's, so that a file replaced on disk
  // after loading is not used to name the old code. `callbacks` (from
  // MakeCallbacks) must outlive the session.
  static absl::StatusOr<std::unique_ptr<ElfSymbols>> Open(
      int fd, const std::string& path, const std::string& expected_build_id,
      const Dwfl_Callbacks* callbacks) {
    absl::Status fits = CheckElfFits(fd, path);
    if (!fits.ok()) {
      close(fd);
      return fits;
    }
    Dwfl* dwfl = dwfl_begin(callbacks);
    if (dwfl == nullptr) {
      close(fd);
      return CannotRead(path, DwflError());
    }
    auto symbols = std::unique_ptr<ElfSymbols>(new ElfSymbols(dwfl));
    SessionFiles& files = symbols->files_;
    files.debuginfo_path = callbacks->debuginfo_path;
    dwfl_report_begin(dwfl);
    Dwfl_Module* mod = dwfl_report_elf(dwfl, path.c_str(), path.c_str(), fd,
                                       /*base=*/0, /*add_p_vaddr=*/true);
    if (mod == nullptr) {
      close(fd);  // consumed only on success
      return CannotRead(path, DwflError());
    }
    // libdwfl holds `fd` from here on: detached now if it can be (see
    // SessionFiles), else tracked.
    Dwarf_Addr main_bias = 0;
    files.main_elf = dwfl_module_getelf(mod, &main_bias);
    const internal::FdIdentity identity = internal::IdentifyFd(fd);
    if (!Detach(files.main_elf, fd, identity, files)) {
      files.held.push_back({fd, identity, /*debug=*/false});
    }
    if (dwfl_report_end(dwfl, nullptr, nullptr) != 0) {
      return CannotRead(path, DwflError());
    }
    void** userdata = nullptr;
    dwfl_module_info(mod, &userdata, nullptr, nullptr, nullptr, nullptr,
                     nullptr, nullptr);
    if (userdata != nullptr) *userdata = &files;
    symbols->mod_ = mod;
    if (!expected_build_id.empty()) {
      const unsigned char* bits = nullptr;
      GElf_Addr vaddr = 0;
      const int len = dwfl_module_build_id(mod, &bits, &vaddr);
      if (len > 0) {
        std::string on_disk = HexBytes(bits, static_cast<size_t>(len));
        if (on_disk != expected_build_id) {
          return CannotRead(
              path,
              absl::StrCat("build-id on disk ", on_disk,
                           " differs from the loaded one ", expected_build_id,
                           " (file replaced after loading)"));
        }
      }
    }
    return symbols;
  }

  ~ElfSymbols() {
    // dwfl_end() closes the descriptors libdwfl still holds: only if each
    // is still inprof's (see SessionFiles).
    for (const SessionFiles::Held& held : files_.held) {
      if (!internal::IsStillOurs(held.fd, held.identity)) {
        internal::NoteDescriptorTaken(
            held.fd, "a module file libdwfl holds; its session is left "
                     "allocated rather than let libdwfl close that number");
        return;
      }
    }
    dwfl_end(dwfl_);
    for (Elf* elf : files_.detached) elf_end(elf);
    if (files_.alt != nullptr) dwarf_end(files_.alt);
    if (files_.alt_elf != nullptr) elf_end(files_.alt_elf);
  }
  // False: names from the symbol table only; the debug info (and a separate
  // debug file) is never opened.
  void set_use_debug_info(bool on) { use_debug_info_ = on; }
  ElfSymbols(const ElfSymbols&) = delete;
  ElfSymbols& operator=(const ElfSymbols&) = delete;

  // Frames at file virtual address `addr`, innermost first; records in
  // `caps` what kinds of information were found.
  std::vector<SourceFrame> Lookup(uint64_t addr, Caps* caps) {
    std::vector<SourceFrame> frames;

    // Out-of-line function: the symbol table (.symtab covers static
    // functions; .dynsym when stripped).
    std::string sym_function, sym_system;
    {
      if (symbols_ == nullptr) {
        symbols_ = std::make_unique<SymbolTable>(mod_);
        // A debug file libdwfl opened for its .symtab: that table's Elf.
        if (!files_.held.empty()) {
          GElf_Sym sym;
          GElf_Addr value = 0;
          GElf_Word shndx = 0;
          Elf* elf = nullptr;
          Dwarf_Addr bias = 0;
          if (dwfl_module_getsymtab(mod_) > 0 &&
              dwfl_module_getsym_info(mod_, 0, &sym, &value, &shndx, &elf,
                                      &bias) != nullptr) {
            SettleDebugFile(files_, elf);
          }
        }
      }
      int type = STT_NOTYPE;
      const char* name = symbols_->Find(addr, &type);
      // Code symbols only: data, section and version symbols (such as the
      // vDSO's "LINUX_2.6" at offset 0) would misname the address.
      if (name != nullptr && name[0] != '\0' &&
          (type == STT_FUNC || type == STT_GNU_IFUNC || type == STT_NOTYPE)) {
        sym_system = name;
        sym_function = Demangle(name);
      }
    }

    Dwarf_Addr cu_bias = 0;
    Dwarf_Die* const cu =
        use_debug_info_ ? dwfl_module_addrdie(mod_, addr, &cu_bias) : nullptr;
    // A debug file libdwfl opened for its DWARF (loaded by now): its Elf.
    if (use_debug_info_ && !files_.held.empty()) {
      Dwarf_Addr dw_bias = 0;
      if (Dwarf* dw = dwfl_module_getdwarf(mod_, &dw_bias); dw != nullptr) {
        SettleDebugFile(files_, dwarf_getelf(dw));
      }
    }

    const internal::LineTable* const lines =
        cu != nullptr ? LinesOf(cu) : nullptr;

    // Innermost file:line from the unit's line table.
    std::string line_file;
    int64_t line_number = 0;
    if (cu != nullptr) {
      if (lines != nullptr) {
        const std::string* file = nullptr;
        int lineno = 0;
        if (lines->Find(addr - cu_bias, &file, &lineno)) {
          if (file != nullptr) line_file = *file;
          line_number = lineno > 0 ? lineno : 0;
        }
      } else if (Dwfl_Line* line = dwfl_module_getsrc(mod_, addr);
                 line != nullptr) {
        int lineno = 0;
        const char* file =
            dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
        if (file != nullptr) line_file = file;
        line_number = lineno > 0 ? lineno : 0;
      }
    }

    // Chain of inlined subroutines and the enclosing subprogram, innermost
    // first, from the CU's scope index.
    std::vector<Dwarf_Die> chain;
    const bool have_dwarf = cu != nullptr;
    if (cu != nullptr) ScopesOf(cu).Chain(addr - cu_bias, &chain);

    if (chain.empty()) {
      if (!sym_function.empty() || !line_file.empty()) {
        frames.push_back({.function = sym_function,
                          .system_name = sym_system,
                          .file = line_file,
                          .line = line_number});
      }
    } else {
      std::string file = line_file;
      int64_t line = line_number;
      for (size_t i = 0; i < chain.size(); ++i) {
        SourceFrame frame;
        const bool outermost =
            i + 1 == chain.size() && dwarf_tag(&chain[i]) == DW_TAG_subprogram;
        if (outermost && !sym_function.empty()) {
          frame.function = sym_function;
          frame.system_name = sym_system;
        } else {
          DieName(&chain[i], &frame.function, &frame.system_name);
        }
        frame.file = file;
        frame.line = line;
        frames.push_back(std::move(frame));
        if (dwarf_tag(&chain[i]) == DW_TAG_inlined_subroutine) {
          CallSite(&chain[i], lines, &file, &line);
        }
      }
      // No enclosing subprogram DIE (unusual DWARF): the symbol is the caller.
      if (dwarf_tag(&chain.back()) == DW_TAG_inlined_subroutine) {
        frames.push_back({.function = sym_function,
                          .system_name = sym_system,
                          .file = file,
                          .line = line});
      }
    }

    for (const SourceFrame& f : frames) {
      if (!f.function.empty()) caps->has_functions = true;
      if (!f.file.empty()) caps->has_filenames = true;
      if (f.line > 0) caps->has_line_numbers = true;
    }
    // Debug info was read, so the inline chain (possibly of length one) is
    // complete for this address.
    if (have_dwarf) caps->has_inline_frames = true;
    return frames;
  }

 private:
  explicit ElfSymbols(Dwfl* dwfl) : dwfl_(dwfl) {}
  bool use_debug_info_ = true;

  // The scope index of `cu`, built on first use.
  CuScopes& ScopesOf(Dwarf_Die* cu) {
    std::unique_ptr<CuScopes>& slot = cu_scopes_[dwarf_dieoffset(cu)];
    if (slot == nullptr) slot = std::make_unique<CuScopes>(cu);
    return *slot;
  }

  // The line table of `cu`, read on first use by our own reader; null
  // where that reader declined the unit (libdw's dwfl_module_getsrc then
  // answers).
  const internal::LineTable* LinesOf(Dwarf_Die* cu) {
    auto [it, inserted] = line_tables_.try_emplace(dwarf_dieoffset(cu));
    if (inserted) {
      absl::StatusOr<internal::LineTable> table = internal::LineTable::ReadUnit(cu);
      if (table.ok()) {
        it->second = std::make_unique<internal::LineTable>(*std::move(table));
      }
    }
    return it->second.get();
  }

  Dwfl* dwfl_;
  Dwfl_Module* mod_ = nullptr;
  SessionFiles files_;  // the module's userdata points here
  std::unique_ptr<SymbolTable> symbols_;  // built on first use
  absl::flat_hash_map<Dwarf_Off, std::unique_ptr<internal::LineTable>>
      line_tables_;
  // By CU DIE offset. Dwarf_Dies stay valid while dwfl_ lives.
  absl::flat_hash_map<Dwarf_Off, std::unique_ptr<CuScopes>> cu_scopes_;
};

// The vDSO has no file: copy its image into a memfd for libdwfl.
absl::StatusOr<int> VdsoImageFd(const unsigned char* image, size_t size) {
  int fd = memfd_create("inprof-vdso", MFD_CLOEXEC);
  if (fd < 0) {
    return CannotRead("[vdso]",
                      absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, image + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return CannotRead("[vdso]", absl::StrCat("write: ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

// A descriptor shared by the module maps that name the same object.
struct OpenFile {
  explicit OpenFile(int f) : fd(f) {}
  ~OpenFile() { close(fd); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  int fd;
};

// One loaded ELF object as dl_iterate_phdr reports it (or, for another
// process, as its /proc/PID/maps shows it).
struct LoadedObject {
  std::string path;       // ModuleInfo::path
  std::string open_path;  // file to read; empty for the vDSO
  // Another process's object: the file it mapped, opened while it ran (so
  // that it can be read after the process exited or the file was replaced).
  std::shared_ptr<OpenFile> file;
  std::string open_error;  // why it could not be opened (another process)
  uint64_t bias = 0;      // dlpi_addr
  std::string build_id;
  const unsigned char* vdso_image = nullptr;  // set for the vDSO
  size_t vdso_size = 0;
  std::vector<ModuleInfo> segments;  // executable PT_LOADs
};

struct ScanResult {
  std::vector<LoadedObject> objects;
  unsigned long long adds = 0;
  unsigned long long subs = 0;
};

// The kernel maps the whole vDSO file, section headers included, in whole
// pages, while its PT_LOAD covers only the allocated sections. Extends the
// image to the section header table when that lies in the same pages.
size_t VdsoImageSize(uint64_t ehdr_address, uint64_t load_filesz) {
  const auto* ehdr = reinterpret_cast<const ElfW(Ehdr)*>(ehdr_address);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t mapped = (load_filesz + page - 1) / page * page;
  const uint64_t shdr_end =
      ehdr->e_shoff + uint64_t{ehdr->e_shnum} * ehdr->e_shentsize;
  return shdr_end > load_filesz && shdr_end <= mapped ? shdr_end : load_filesz;
}

std::string MainProgramPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

int ScanCallback(dl_phdr_info* info, size_t size, void* arg) {
  auto* scan = static_cast<ScanResult*>(arg);
  if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
    scan->adds = info->dlpi_adds;
    scan->subs = info->dlpi_subs;
  }
  LoadedObject obj;
  obj.bias = info->dlpi_addr;
  const uint64_t vdso_ehdr = getauxval(AT_SYSINFO_EHDR);
  const bool is_vdso =
      vdso_ehdr != 0 &&
      reinterpret_cast<uint64_t>(info->dlpi_phdr) ==
          vdso_ehdr + reinterpret_cast<const ElfW(Ehdr)*>(vdso_ehdr)->e_phoff;
  if (is_vdso) {
    obj.path = "[vdso]";
  } else if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
    obj.path = info->dlpi_name;
    obj.open_path = obj.path;
  } else if (scan->objects.empty()) {
    // The main program: its dlpi_name is "". Read it through /proc/self/exe,
    // which stays valid even if the file was replaced or deleted.
    obj.path = MainProgramPath();
    obj.open_path = "/proc/self/exe";
    if (obj.path.empty()) obj.path = obj.open_path;
  } else {
    return 0;  // nameless and not the vDSO: nothing to attribute it to
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_NOTE && obj.build_id.empty()) {
      obj.build_id = BuildIdFromNotes(
          reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr),
          ph.p_filesz, ph.p_align);
    } else if (ph.p_type == PT_LOAD) {
      if (is_vdso && ph.p_offset == 0) {
        obj.vdso_image = reinterpret_cast<const unsigned char*>(vdso_ehdr);
        obj.vdso_size = VdsoImageSize(vdso_ehdr, ph.p_filesz);
      }
      if ((ph.p_flags & PF_X) != 0 && ph.p_memsz > 0) {
        ModuleInfo m;
        m.path = obj.path;
        m.start = info->dlpi_addr + ph.p_vaddr;
        m.limit = m.start + ph.p_memsz;
        m.file_offset = ph.p_offset;
        obj.segments.push_back(std::move(m));
      }
    }
  }
  for (ModuleInfo& m : obj.segments) m.build_id = obj.build_id;
  if (!obj.segments.empty()) scan->objects.push_back(std::move(obj));
  return 0;
}

// The loader's add/remove counters, read by stopping at the first object.
std::pair<unsigned long long, unsigned long long> LoaderCounters() {
  std::pair<unsigned long long, unsigned long long> counters{0, 0};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* arg) -> int {
        auto* c =
            static_cast<std::pair<unsigned long long, unsigned long long>*>(
                arg);
        if (size >=
            offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
          c->first = info->dlpi_adds;
          c->second = info->dlpi_subs;
        }
        return 1;
      },
      &counters);
  return counters;
}

// Another process's objects, from its /proc/PID/maps: every file mapped
// executable (and its vDSO), grouped by file. Each file is opened through
// /proc/PID/map_files/ -- the very inode the process mapped, even when the
// path now names another file -- or, where that is refused, by its path
// under /proc/PID/root with its device and inode checked against the maps
// line: a file replaced on disk is never read for the code it replaced.
ScanResult ScanProcess(pid_t pid, const std::vector<internal::MapsEntry>& maps) {
  ScanResult scan;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  absl::flat_hash_set<std::string> seen;  // dev:inode:path
  for (const internal::MapsEntry& entry : maps) {
    if (!entry.executable) continue;
    LoadedObject obj;
    obj.path = entry.path;
    Elf* elf = nullptr;
    std::shared_ptr<OpenFile> file;
    if (entry.path == "[vdso]") {
      // The same kernel maps the same vDSO image into every process: read
      // ours.
      const uint64_t vdso = getauxval(AT_SYSINFO_EHDR);
      if (vdso == 0) continue;
      const auto* ehdr = reinterpret_cast<const ElfW(Ehdr)*>(vdso);
      const auto* phdr = reinterpret_cast<const ElfW(Phdr)*>(vdso + ehdr->e_phoff);
      for (int i = 0; i < ehdr->e_phnum; ++i) {
        if (phdr[i].p_type == PT_LOAD && phdr[i].p_offset == 0) {
          obj.vdso_image = reinterpret_cast<const unsigned char*>(vdso);
          obj.vdso_size = VdsoImageSize(vdso, phdr[i].p_filesz);
          obj.bias = entry.start - (phdr[i].p_vaddr & ~(page - 1));
        }
        if (phdr[i].p_type == PT_NOTE && obj.build_id.empty()) {
          obj.build_id = BuildIdFromNotes(
              reinterpret_cast<const unsigned char*>(vdso + phdr[i].p_offset),
              phdr[i].p_filesz, phdr[i].p_align);
        }
      }
      if (obj.vdso_image == nullptr) continue;
      for (int i = 0; i < ehdr->e_phnum; ++i) {
        if (phdr[i].p_type == PT_LOAD && (phdr[i].p_flags & PF_X) != 0) {
          ModuleInfo m;
          m.path = obj.path;
          m.start = obj.bias + phdr[i].p_vaddr;
          m.limit = m.start + phdr[i].p_memsz;
          m.file_offset = phdr[i].p_offset;
          m.build_id = obj.build_id;
          obj.segments.push_back(std::move(m));
        }
      }
      scan.objects.push_back(std::move(obj));
      continue;
    }
    if (entry.path.empty() || entry.path.front() != '/' || entry.inode == 0) continue;
    if (!seen.insert(absl::StrCat(entry.dev_major, ":", entry.dev_minor, ":",
                                  entry.inode, ":", entry.path))
             .second) {
      continue;  // another executable mapping of an object already listed
    }
    int fd = open(absl::StrFormat("/proc/%d/map_files/%x-%x", pid, entry.start,
                                  entry.limit)
                      .c_str(),
                  O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      fd = open(absl::StrCat("/proc/", pid, "/root", entry.path).c_str(),
                O_RDONLY | O_CLOEXEC);
      struct stat st;
      if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_ino != entry.inode ||
                      major(st.st_dev) != entry.dev_major ||
                      minor(st.st_dev) != entry.dev_minor)) {
        close(fd);
        fd = -1;
        obj.open_error = "the file at that path is not the one the process "
                         "mapped (replaced on disk)";
      } else if (fd < 0) {
        obj.open_error = std::strerror(errno);
      }
    }
    if (fd >= 0) {
      file = std::make_shared<OpenFile>(fd);
      elf = elf_begin(fd, ELF_C_READ, nullptr);
    }
    // Where the process placed the file: the PT_LOAD this mapping shows.
    bool placed = false;
    size_t phnum = 0;
    if (elf != nullptr && elf_kind(elf) == ELF_K_ELF && elf_getphdrnum(elf, &phnum) == 0) {
      for (size_t i = 0; i < phnum; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr) continue;
        if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) != 0 &&
            (ph.p_offset & ~(page - 1)) == entry.offset) {
          obj.bias = entry.start - (ph.p_vaddr & ~(page - 1));
          placed = true;
        }
      }
      const void* id = nullptr;
      const ssize_t id_len = dwelf_elf_gnu_build_id(elf, &id);
      if (id_len > 0) {
        obj.build_id = HexBytes(static_cast<const unsigned char*>(id),
                                static_cast<size_t>(id_len));
      }
    }
    if (placed) {
      for (size_t i = 0; i < phnum; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr) continue;
        if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0 || ph.p_memsz == 0) continue;
        ModuleInfo m;
        m.path = obj.path;
        m.start = obj.bias + ph.p_vaddr;
        m.limit = m.start + ph.p_memsz;
        m.file_offset = ph.p_offset;
        m.build_id = obj.build_id;
        obj.segments.push_back(std::move(m));
      }
    } else {
      // Unreadable: the mapping itself, so that its addresses are still
      // attributed to it (module + offset).
      ModuleInfo m;
      m.path = obj.path;
      m.start = entry.start;
      m.limit = entry.limit;
      m.file_offset = entry.offset;
      obj.bias = entry.start - entry.offset;
      obj.segments.push_back(std::move(m));
      if (obj.open_error.empty()) obj.open_error = "not an ELF object it can place";
    }
    if (elf != nullptr) elf_end(elf);
    obj.file = placed ? std::move(file) : nullptr;
    scan.objects.push_back(std::move(obj));
  }
  return scan;
}

}  // namespace

struct Symbolizer::Impl {
  struct Object {
    LoadedObject loaded;
    bool open_attempted = false;
    std::unique_ptr<ElfSymbols> symbols;  // null: not opened or unreadable
    Caps caps;
  };
  struct Range {
    uint64_t start;
    uint64_t limit;
    int module;
  };

  Impl() : callbacks(MakeCallbacks(&debuginfo_path_ptr)) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Declared before `objects`: the sessions point at them.
  std::string debuginfo_path = kDefaultDebugInfoPath;
  char* debuginfo_path_ptr = debuginfo_path.data();
  const Dwfl_Callbacks callbacks;

  bool symbolize = true;
  bool system_debug_info = true;
  bool scanned = false;
  size_t max_cached_bytes = kDefaultMaxCachedBytes;
  size_t cached_bytes = 0;
  unsigned long long adds = 0;
  unsigned long long subs = 0;
  std::vector<ModuleInfo> modules;
  std::vector<int> module_object;  // module index -> objects index
  std::vector<Object> objects;
  std::vector<Range> ranges;  // sorted by start
  // Keyed by the address looked up (address - 1 for return addresses).
  // unique_ptr keeps references returned by Lookup stable across rehashes.
  absl::flat_hash_map<uint64_t, std::unique_ptr<SymbolizedAddress>> cache;
  absl::flat_hash_set<std::string> warned;  // paths already warned about
  // Another process's symbolizer (ForProcess): its pid, and the maps text
  // the module list was built from.
  pid_t pid = 0;
  std::string maps_text;

  void Rebuild();
  void Rebuild(ScanResult scan);
  int FindModule(uint64_t address) const;
  ElfSymbols* SymbolsOf(Object& object);
};

void Symbolizer::Impl::Rebuild() {
  ScanResult scan;
  if (pid != 0) {
    std::string text;
    auto maps = internal::ReadProcessMaps(pid, &text);
    // Gone (or unreadable): the modules it had stay, opened or not. A
    // process that exited but was not reaped yet (a zombie) reads as empty
    // maps: gone too (every live process maps at least its program).
    if (!maps.ok() || (scanned && (maps->empty() || text == maps_text))) {
      scanned = true;
      return;
    }
    scan = ScanProcess(pid, *maps);
    if (scanned) {
      // A process exiting while it is read: its maps still list files that
      // it no longer has (map_files and /proc/PID/root say ENOENT). What it
      // had stays; the next Refresh() reads again.
      for (const LoadedObject& o : scan.objects) {
        if (o.file == nullptr && o.vdso_image == nullptr &&
            o.open_error == std::strerror(ENOENT)) {
          return;
        }
      }
    }
    maps_text = std::move(text);
  } else {
    dl_iterate_phdr(ScanCallback, &scan);
  }
  Rebuild(std::move(scan));
}

void Symbolizer::Impl::Rebuild(ScanResult scan) {
  adds = scan.adds;
  subs = scan.subs;
  scanned = true;

  // Carry over opened sessions of objects that are still loaded at the same
  // place with the same contents.
  auto key = [](const LoadedObject& o) {
    return absl::StrCat(o.path, "|", o.bias, "|", o.build_id);
  };
  absl::flat_hash_map<std::string, size_t> old_by_key;
  for (size_t i = 0; i < objects.size(); ++i) {
    old_by_key[key(objects[i].loaded)] = i;
  }
  absl::flat_hash_map<std::string, int> new_module_by_key;  // key|start
  std::vector<Object> new_objects;
  std::vector<ModuleInfo> new_modules;
  std::vector<int> new_module_object;
  for (LoadedObject& loaded : scan.objects) {
    Object object;
    if (auto it = old_by_key.find(key(loaded)); it != old_by_key.end()) {
      Object& old = objects[it->second];
      object.open_attempted = old.open_attempted;
      object.symbols = std::move(old.symbols);
      object.caps = old.caps;
    }
    for (const ModuleInfo& m : loaded.segments) {
      new_module_by_key[absl::StrCat(key(loaded), "|", m.start)] =
          static_cast<int>(new_modules.size());
      new_modules.push_back(m);
      new_module_object.push_back(static_cast<int>(new_objects.size()));
    }
    object.loaded = std::move(loaded);
    new_objects.push_back(std::move(object));
  }

  // Renumber cached results of modules that are still there; drop those of
  // unloaded modules and of unmapped addresses (a new module may cover them).
  std::vector<int> remap(modules.size(), -1);
  for (size_t i = 0; i < modules.size(); ++i) {
    const Object& old = objects[module_object[i]];
    auto it = new_module_by_key.find(
        absl::StrCat(key(old.loaded), "|", modules[i].start));
    if (it != new_module_by_key.end()) remap[i] = it->second;
  }
  for (auto it = cache.begin(); it != cache.end();) {
    const int old_module = it->second->module;
    const int new_module = old_module >= 0 ? remap[old_module] : -1;
    if (new_module < 0) {
      cached_bytes -= EntryBytes(*it->second);
      cache.erase(it++);
    } else {
      it->second->module = new_module;
      ++it;
    }
  }

  objects = std::move(new_objects);
  modules = std::move(new_modules);
  module_object = std::move(new_module_object);
  ranges.clear();
  for (size_t i = 0; i < modules.size(); ++i) {
    ranges.push_back({modules[i].start, modules[i].limit, static_cast<int>(i)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
}

int Symbolizer::Impl::FindModule(uint64_t address) const {
  auto it =
      std::upper_bound(ranges.begin(), ranges.end(), address,
                       [](uint64_t a, const Range& r) { return a < r.start; });
  if (it == ranges.begin()) return -1;
  --it;
  return address < it->limit ? it->module : -1;
}

ElfSymbols* Symbolizer::Impl::SymbolsOf(Object& object) {
  if (object.open_attempted) return object.symbols.get();
  object.open_attempted = true;
  const LoadedObject& loaded = object.loaded;
  absl::StatusOr<int> fd;
  if (loaded.vdso_image != nullptr) {
    fd = VdsoImageFd(loaded.vdso_image, loaded.vdso_size);
  } else if (loaded.file != nullptr) {
    const int f = dup(loaded.file->fd);
    if (f >= 0) {
      fd = f;
    } else {
      fd = CannotRead(loaded.path, std::strerror(errno));
    }
  } else if (!loaded.open_error.empty()) {
    fd = CannotRead(loaded.path, loaded.open_error);
  } else if (loaded.open_path.empty()) {
    fd = CannotRead(loaded.path, "no file backs this module");
  } else {
    int f = open(loaded.open_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f >= 0) {
      fd = f;
    } else {
      fd = CannotRead(loaded.path, std::strerror(errno));
    }
  }
  absl::StatusOr<std::unique_ptr<ElfSymbols>> symbols =
      fd.ok() ? ElfSymbols::Open(*fd, loaded.path, loaded.build_id, &callbacks)
              : absl::StatusOr<std::unique_ptr<ElfSymbols>>(fd.status());
  if (!symbols.ok()) {
    if (warned.insert(loaded.path).second) Warn(symbols.status());
    return nullptr;
  }
  object.symbols = *std::move(symbols);
  if (!system_debug_info && IsSystemLibrary(loaded.path)) {
    object.symbols->set_use_debug_info(false);
  }
  return object.symbols.get();
}

Symbolizer::Symbolizer(bool symbolize) : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
  // libelf refuses to work until the application states its ELF version.
  elf_version(EV_CURRENT);
  impl_->Rebuild();
}

Symbolizer::~Symbolizer() = default;

Symbolizer::Symbolizer(pid_t pid, bool symbolize) : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
  impl_->pid = pid;
  elf_version(EV_CURRENT);
}

absl::StatusOr<std::unique_ptr<Symbolizer>> Symbolizer::ForProcess(pid_t pid,
                                                                   bool symbolize) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("symbolizer: pid ", pid, " is not a process"));
  }
  auto maps = internal::ReadProcessMaps(pid);
  if (!maps.ok()) return maps.status();
  auto symbolizer = std::unique_ptr<Symbolizer>(new Symbolizer(pid, symbolize));
  symbolizer->impl_->Rebuild();
  return symbolizer;
}

void Symbolizer::Refresh() {
  if (impl_->cached_bytes > impl_->max_cached_bytes) {
    impl_->cache = {};  // also gives the table's memory back
    impl_->cached_bytes = 0;
  }
  if (impl_->pid != 0) {
    impl_->Rebuild();  // re-reads the maps; a no-op when they did not change
    return;
  }
  auto [adds, subs] = LoaderCounters();
  if (impl_->scanned && adds == impl_->adds && subs == impl_->subs) return;
  impl_->Rebuild();
}

const std::vector<ModuleInfo>& Symbolizer::modules() const {
  return impl_->modules;
}

void Symbolizer::set_system_debug_info(bool on) {
  impl_->system_debug_info = on;
}

void Symbolizer::SetDebugInfoPath(absl::string_view path) {
  impl_->debuginfo_path = std::string(path);
  impl_->debuginfo_path_ptr = impl_->debuginfo_path.data();
}

size_t Symbolizer::cached_addresses() const { return impl_->cache.size(); }

size_t Symbolizer::cached_bytes() const { return impl_->cached_bytes; }

size_t Symbolizer::max_cached_bytes() const {
  return impl_->max_cached_bytes;
}

void Symbolizer::set_max_cached_bytes(size_t max) {
  impl_->max_cached_bytes = max;
}

const SymbolizedAddress& Symbolizer::Lookup(uint64_t address,
                                            bool is_return_address) {
  // A return address follows its call; address - 1 is inside the call, which
  // names the right function and line even when the call is the last
  // instruction of a function.
  const uint64_t lookup =
      is_return_address && address > 0 ? address - 1 : address;
  std::unique_ptr<SymbolizedAddress>& slot = impl_->cache[lookup];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<SymbolizedAddress>();
  slot->module = impl_->FindModule(lookup);
  if (slot->module >= 0 && impl_->symbolize) {
    Impl::Object& object = impl_->objects[impl_->module_object[slot->module]];
    if (ElfSymbols* symbols = impl_->SymbolsOf(object); symbols != nullptr) {
      slot->frames = symbols->Lookup(lookup - object.loaded.bias, &object.caps);
    }
  }
  impl_->cached_bytes += EntryBytes(*slot);
  return *slot;
}

Symbolizer::ModuleCapabilities Symbolizer::Capabilities(int module) const {
  if (module < 0 || static_cast<size_t>(module) >= impl_->modules.size()) {
    return {};
  }
  return impl_->objects[impl_->module_object[module]].caps;
}

absl::StatusOr<std::vector<std::vector<SourceFrame>>> Symbolizer::SymbolizeFile(
    const std::string& path, const std::vector<uint64_t>& file_addresses) {
  elf_version(EV_CURRENT);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CannotRead(path, std::strerror(errno));
  static const Dwfl_Callbacks kCallbacks = MakeCallbacks(nullptr);
  absl::StatusOr<std::unique_ptr<ElfSymbols>> symbols =
      ElfSymbols::Open(fd, path, /*expected_build_id=*/"", &kCallbacks);
  if (!symbols.ok()) return symbols.status();
  std::vector<std::vector<SourceFrame>> result;
  result.reserve(file_addresses.size());
  Caps caps;
  for (uint64_t address : file_addresses) {
    result.push_back((*symbols)->Lookup(address, &caps));
  }
  return result;
}

}  // namespace inprof
