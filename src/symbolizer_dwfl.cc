// Symbolizer on elfutils' libdwfl.
//
// The module map comes from dl_iterate_phdr (the loader's own list, so it
// agrees with what the process executes, including the vDSO). Each loaded
// ELF object gets its own Dwfl session holding exactly one module, opened
// lazily on the first lookup inside it and placed at bias 0, so that lookups
// use file virtual addresses (runtime address minus the load bias). One
// session per object keeps a broken file from affecting the others, lets
// SymbolizeFile() share the code with the live path, and makes unloading a
// module a matter of dropping its session.

#include "inprof/symbolizer.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
#include "inprof/internal/log.h"

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

// Finds NT_GNU_BUILD_ID in one note segment mapped at [data, data + size).
std::string BuildIdFromNotes(const unsigned char* data, size_t size,
                             size_t align) {
  const size_t a = align == 8 ? 8 : 4;  // gABI: notes are 4- or 8-aligned
  auto round_up = [a](size_t n) { return (n + a - 1) & ~(a - 1); };
  size_t pos = 0;
  while (size - pos >= sizeof(ElfW(Nhdr))) {
    ElfW(Nhdr) note;
    std::memcpy(&note, data + pos, sizeof note);
    const size_t name_pos = pos + sizeof note;
    if (note.n_namesz > size - name_pos) break;
    const size_t desc_pos = name_pos + round_up(note.n_namesz);
    if (desc_pos > size || note.n_descsz > size - desc_pos) break;
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 &&
        std::memcmp(data + name_pos, "GNU", 4) == 0 && note.n_descsz > 0) {
      return HexBytes(data + desc_pos, note.n_descsz);
    }
    pos = desc_pos + round_up(note.n_descsz);
  }
  return "";
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
void CallSite(Dwarf_Die* inlined, std::string* file, int64_t* line) {
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
  Dwarf_Die cu;
  if (dwarf_diecu(inlined, &cu, nullptr, nullptr) == nullptr) return;
  Dwarf_Files* files = nullptr;
  size_t nfiles = 0;
  if (dwarf_getsrcfiles(&cu, &files, &nfiles) != 0 || value >= nfiles) return;
  const char* name = dwarf_filesrc(files, value, nullptr, nullptr);
  if (name != nullptr) *file = name;
}

// Symbols and debug info of one ELF object: a Dwfl session with one module
// placed at bias 0.
class ElfSymbols {
 public:
  // Takes ownership of `fd` in all cases. `path` names the object in errors
  // and is where libdwfl looks for .gnu_debuglink files; `expected_build_id`
  // (if non-empty) must match the file's, so that a file replaced on disk
  // after loading is not used to name the old code.
  static absl::StatusOr<std::unique_ptr<ElfSymbols>> Open(
      int fd, const std::string& path, const std::string& expected_build_id) {
    absl::Status fits = CheckElfFits(fd, path);
    if (!fits.ok()) {
      close(fd);
      return fits;
    }
    static const Dwfl_Callbacks kCallbacks = {
        .find_elf = dwfl_build_id_find_elf,
        // .gnu_debuglink next to the file, and /usr/lib/debug/.build-id.
        // (libdw may also ask debuginfod when DEBUGINFOD_URLS is set.)
        .find_debuginfo = dwfl_standard_find_debuginfo,
        .section_address = dwfl_offline_section_address,
        .debuginfo_path = nullptr,
    };
    Dwfl* dwfl = dwfl_begin(&kCallbacks);
    if (dwfl == nullptr) {
      close(fd);
      return CannotRead(path, DwflError());
    }
    auto symbols = std::unique_ptr<ElfSymbols>(new ElfSymbols(dwfl));
    dwfl_report_begin(dwfl);
    Dwfl_Module* mod = dwfl_report_elf(dwfl, path.c_str(), path.c_str(), fd,
                                       /*base=*/0, /*add_p_vaddr=*/true);
    if (mod == nullptr) {
      close(fd);  // consumed only on success
      return CannotRead(path, DwflError());
    }
    if (dwfl_report_end(dwfl, nullptr, nullptr) != 0) {
      return CannotRead(path, DwflError());
    }
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

  ~ElfSymbols() { dwfl_end(dwfl_); }
  ElfSymbols(const ElfSymbols&) = delete;
  ElfSymbols& operator=(const ElfSymbols&) = delete;

  // Frames at file virtual address `addr`, innermost first; records in
  // `caps` what kinds of information were found.
  std::vector<SourceFrame> Lookup(uint64_t addr, Caps* caps) const {
    std::vector<SourceFrame> frames;

    // Out-of-line function: the symbol table (.symtab covers static
    // functions; .dynsym when stripped).
    std::string sym_function, sym_system;
    {
      GElf_Off offset = 0;
      GElf_Sym sym;
      const char* name = dwfl_module_addrinfo(mod_, addr, &offset, &sym,
                                              nullptr, nullptr, nullptr);
      // Code symbols only: data, section and version symbols (such as the
      // vDSO's "LINUX_2.6" at offset 0) would misname the address.
      const int type = GELF_ST_TYPE(sym.st_info);
      if (name != nullptr && name[0] != '\0' &&
          (type == STT_FUNC || type == STT_GNU_IFUNC || type == STT_NOTYPE)) {
        sym_system = name;
        sym_function = Demangle(name);
      }
    }

    // Innermost file:line from the line table.
    std::string line_file;
    int64_t line_number = 0;
    if (Dwfl_Line* line = dwfl_module_getsrc(mod_, addr); line != nullptr) {
      int lineno = 0;
      const char* file =
          dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
      if (file != nullptr) line_file = file;
      line_number = lineno > 0 ? lineno : 0;
    }

    // Chain of inlined subroutines and the enclosing subprogram, innermost
    // first. dwarf_getscopes stops at the innermost inlined instance (it
    // continues into the abstract origin), so the concrete parents come from
    // dwarf_getscopes_die on the innermost scope.
    std::vector<Dwarf_Die> chain;
    bool have_dwarf = false;
    Dwarf_Addr cu_bias = 0;
    if (Dwarf_Die* cu = dwfl_module_addrdie(mod_, addr, &cu_bias);
        cu != nullptr) {
      have_dwarf = true;
      Dwarf_Die* scopes = nullptr;
      const int n = dwarf_getscopes(cu, addr - cu_bias, &scopes);
      if (n > 0) {
        Dwarf_Die innermost = scopes[0];
        std::free(scopes);
        scopes = nullptr;
        const int m = dwarf_getscopes_die(&innermost, &scopes);
        for (int i = 0; i < m; ++i) {
          const int tag = dwarf_tag(&scopes[i]);
          if (tag == DW_TAG_inlined_subroutine) {
            chain.push_back(scopes[i]);
          } else if (tag == DW_TAG_subprogram) {
            chain.push_back(scopes[i]);
            break;
          }
        }
      }
      std::free(scopes);
    }

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
          CallSite(&chain[i], &file, &line);
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

  Dwfl* dwfl_;
  Dwfl_Module* mod_ = nullptr;
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

// One loaded ELF object as dl_iterate_phdr reports it.
struct LoadedObject {
  std::string path;       // ModuleInfo::path
  std::string open_path;  // file to read; empty for the vDSO
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

  bool symbolize = true;
  bool scanned = false;
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

  void Rebuild();
  int FindModule(uint64_t address) const;
  ElfSymbols* SymbolsOf(Object& object);
};

void Symbolizer::Impl::Rebuild() {
  ScanResult scan;
  dl_iterate_phdr(ScanCallback, &scan);
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
      fd.ok() ? ElfSymbols::Open(*fd, loaded.path, loaded.build_id)
              : absl::StatusOr<std::unique_ptr<ElfSymbols>>(fd.status());
  if (!symbols.ok()) {
    if (warned.insert(loaded.path).second) Warn(symbols.status());
    return nullptr;
  }
  object.symbols = *std::move(symbols);
  return object.symbols.get();
}

Symbolizer::Symbolizer(bool symbolize) : impl_(std::make_unique<Impl>()) {
  impl_->symbolize = symbolize;
  // libelf refuses to work until the application states its ELF version.
  elf_version(EV_CURRENT);
  impl_->Rebuild();
}

Symbolizer::~Symbolizer() = default;

void Symbolizer::Refresh() {
  auto [adds, subs] = LoaderCounters();
  if (impl_->scanned && adds == impl_->adds && subs == impl_->subs) return;
  impl_->Rebuild();
}

const std::vector<ModuleInfo>& Symbolizer::modules() const {
  return impl_->modules;
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
  absl::StatusOr<std::unique_ptr<ElfSymbols>> symbols =
      ElfSymbols::Open(fd, path, /*expected_build_id=*/"");
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
