#include "inprof/alloc/got_scan.h"

#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace inprof::internal {

const char* const kAllocSymbolNames[kAllocSymbolCount] = {
    "malloc", "free", "calloc", "realloc", "reallocarray",
    "posix_memalign", "aligned_alloc", "memalign", "valloc", "pvalloc",
    "free_sized", "free_aligned_sized",
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm",
    "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
    "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    "dlopen", "dlmopen",
    "pthread_mutex_lock", "pthread_mutex_timedlock", "pthread_mutex_clocklock",
    "pthread_rwlock_rdlock", "pthread_rwlock_wrlock", "pthread_rwlock_timedrdlock",
    "pthread_rwlock_timedwrlock", "pthread_rwlock_clockrdlock", "pthread_rwlock_clockwrlock",
};

namespace {

#if defined(__x86_64__)
constexpr uint32_t kJumpSlot = R_X86_64_JUMP_SLOT;
constexpr uint32_t kGlobDat = R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
constexpr uint32_t kJumpSlot = R_AARCH64_JUMP_SLOT;
constexpr uint32_t kGlobDat = R_AARCH64_GLOB_DAT;
#else
#error "inprof's GOT patching (src/alloc) knows x86-64's and aarch64's relocations only"
#endif

// The names sorted, with their indexes, for a binary search per relocation.
struct SortedNames {
  std::array<std::pair<std::string_view, int>, kAllocSymbolCount> entries;
  SortedNames() {
    for (int i = 0; i < kAllocSymbolCount; ++i) entries[i] = {kAllocSymbolNames[i], i};
    std::sort(entries.begin(), entries.end());
  }
};
const SortedNames& Names() {
  static const SortedNames names;
  return names;
}

int ProtOfFlags(ElfW(Word) flags) {
  return ((flags & PF_R) ? PROT_READ : 0) | ((flags & PF_W) ? PROT_WRITE : 0) |
         ((flags & PF_X) ? PROT_EXEC : 0);
}

std::string ObjectName(const ObjectImage& image) {
  return image.name[0] != '\0' ? std::string(image.name) : std::string("the main program");
}

// The object's memory, bounds-checked against its PT_LOAD segments.
class ImageMemory {
 public:
  explicit ImageMemory(const ObjectImage& image) : image_(image) {}

  bool Contains(uintptr_t address, size_t size) const {
    return ImageContains(image_, address, size);
  }
  // A dynamic entry's address: glibc rewrites d_ptr in place to absolute
  // addresses on x86-64 and aarch64, but not in the vdso (read-only) nor on
  // every architecture; take whichever reading lies inside the object.
  uintptr_t Resolve(uintptr_t d_ptr, size_t size) const {
    if (image_.base != 0 && d_ptr <= UINTPTR_MAX - image_.base &&
        Contains(image_.base + d_ptr, size)) {
      return image_.base + d_ptr;
    }
    if (Contains(d_ptr, size)) return d_ptr;
    return 0;
  }
  template <typename T>
  T Read(uintptr_t address) const {
    T value;
    std::memcpy(&value, reinterpret_cast<const void*>(address), sizeof value);
    return value;
  }
  // The slot's page protection as the loader left it.
  int ProtAt(uintptr_t address) const {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    int prot = 0;
    for (size_t i = 0; i < image_.phnum; ++i) {
      const ElfW(Phdr)& ph = image_.phdrs[i];
      const uintptr_t start = image_.base + ph.p_vaddr;
      if (ph.p_type == PT_LOAD && address >= start && address - start < ph.p_memsz) {
        prot = ProtOfFlags(ph.p_flags);
      }
    }
    for (size_t i = 0; i < image_.phnum; ++i) {
      const ElfW(Phdr)& ph = image_.phdrs[i];
      if (ph.p_type != PT_GNU_RELRO) continue;
      // glibc's _dl_protect_relro: whole pages from the segment's start
      // (rounded down) to its end (rounded down).
      const uintptr_t start = (image_.base + ph.p_vaddr) & ~(page - 1);
      const uintptr_t end = (image_.base + ph.p_vaddr + ph.p_memsz) & ~(page - 1);
      if (address >= start && address < end) prot = PROT_READ;
    }
    return prot;
  }

 private:
  const ObjectImage& image_;
};

struct DynamicInfo {
  uintptr_t jmprel = 0, pltrelsz = 0, pltrel = 0;
  uintptr_t rela = 0, relasz = 0, relaent = sizeof(ElfW(Rela));
  uintptr_t symtab = 0, syment = sizeof(ElfW(Sym));
  uintptr_t strtab = 0, strsz = 0;
  bool has_rel = false;
};

}  // namespace

int AllocSymbolIndex(std::string_view name) {
  const auto& entries = Names().entries;
  auto it = std::lower_bound(entries.begin(), entries.end(), std::make_pair(name, -1));
  return it != entries.end() && it->first == name ? it->second : -1;
}

bool ImageContains(const ObjectImage& image, uintptr_t address, size_t size) {
  for (size_t i = 0; i < image.phnum; ++i) {
    const ElfW(Phdr)& ph = image.phdrs[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_R)) continue;
    const uintptr_t start = image.base + ph.p_vaddr;
    if (address >= start && address - start <= ph.p_memsz &&
        size <= ph.p_memsz - (address - start)) {
      return true;
    }
  }
  return false;
}

uintptr_t DynamicAddress(const ObjectImage& image) {
  for (size_t i = 0; i < image.phnum; ++i) {
    if (image.phdrs[i].p_type == PT_DYNAMIC) return image.base + image.phdrs[i].p_vaddr;
  }
  return 0;
}

absl::Status ScanGotSlots(const ObjectImage& image, std::vector<GotSlot>* slots) {
  const ElfW(Phdr)* dynamic = nullptr;
  for (size_t i = 0; i < image.phnum; ++i) {
    if (image.phdrs[i].p_type == PT_DYNAMIC) dynamic = &image.phdrs[i];
  }
  if (dynamic == nullptr) return absl::OkStatus();  // static, or not an ELF object of ours
  const ImageMemory memory(image);
  const auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(ObjectName(image), ": ", what, "; its allocation calls are not intercepted"));
  };
  const uintptr_t dyn_start = image.base + dynamic->p_vaddr;
  const size_t dyn_count = dynamic->p_memsz / sizeof(ElfW(Dyn));
  if (!memory.Contains(dyn_start, dyn_count * sizeof(ElfW(Dyn)))) {
    return invalid("its PT_DYNAMIC lies outside its PT_LOAD segments");
  }
  DynamicInfo info;
  for (size_t i = 0; i < dyn_count; ++i) {
    const auto entry = memory.Read<ElfW(Dyn)>(dyn_start + i * sizeof(ElfW(Dyn)));
    const uintptr_t v = entry.d_un.d_val;
    switch (entry.d_tag) {
      case DT_JMPREL: info.jmprel = v; break;
      case DT_PLTRELSZ: info.pltrelsz = v; break;
      case DT_PLTREL: info.pltrel = v; break;
      case DT_RELA: info.rela = v; break;
      case DT_RELASZ: info.relasz = v; break;
      case DT_RELAENT: info.relaent = v; break;
      case DT_REL: info.has_rel = true; break;
      case DT_SYMTAB: info.symtab = v; break;
      case DT_SYMENT: info.syment = v; break;
      case DT_STRTAB: info.strtab = v; break;
      case DT_STRSZ: info.strsz = v; break;
      default: break;
    }
    if (entry.d_tag == DT_NULL) break;
  }
  if (info.jmprel == 0 && info.rela == 0) {
    if (info.has_rel) return invalid("it has REL relocations (this platform uses RELA)");
    return absl::OkStatus();  // nothing relocated: the vdso, a data-only object
  }
  if (info.jmprel != 0 && info.pltrel != DT_RELA) {
    return invalid(absl::StrCat("its DT_PLTREL is ", info.pltrel, ", expected DT_RELA"));
  }
  if (info.relaent != sizeof(ElfW(Rela)) || info.syment != sizeof(ElfW(Sym))) {
    return invalid("its DT_RELAENT or DT_SYMENT is not this platform's entry size");
  }
  const uintptr_t strtab = memory.Resolve(info.strtab, info.strsz);
  if (info.symtab == 0 || info.strtab == 0 || info.strsz == 0 || strtab == 0) {
    return invalid("its DT_SYMTAB or DT_STRTAB is missing or outside its segments");
  }
  // The symbol table's size is not in the dynamic section: check each
  // symbol read; its start must be inside the object at least.
  const uintptr_t symtab = memory.Resolve(info.symtab, sizeof(ElfW(Sym)));
  if (symtab == 0) return invalid("its DT_SYMTAB lies outside its segments");

  std::vector<GotSlot> found;
  const auto scan = [&](uintptr_t table_ptr, uintptr_t table_size,
                        absl::string_view what) -> absl::Status {
    if (table_ptr == 0 || table_size == 0) return absl::OkStatus();
    if (table_size % sizeof(ElfW(Rela)) != 0) {
      return invalid(absl::StrCat("its ", what, " size is not a whole number of entries"));
    }
    const uintptr_t table = memory.Resolve(table_ptr, table_size);
    if (table == 0) return invalid(absl::StrCat("its ", what, " lies outside its segments"));
    for (uintptr_t off = 0; off < table_size; off += sizeof(ElfW(Rela))) {
      const auto rela = memory.Read<ElfW(Rela)>(table + off);
      const uint32_t type = ELF64_R_TYPE(rela.r_info);
      if (type != kJumpSlot && type != kGlobDat) continue;
      const uint64_t sym_index = ELF64_R_SYM(rela.r_info);
      if (sym_index == 0 || rela.r_addend != 0) continue;
      if (sym_index > (UINTPTR_MAX - symtab) / sizeof(ElfW(Sym))) {
        return invalid(absl::StrCat("a ", what, " entry's symbol index is out of range"));
      }
      const uintptr_t sym_at = symtab + sym_index * sizeof(ElfW(Sym));
      if (!memory.Contains(sym_at, sizeof(ElfW(Sym)))) {
        return invalid(absl::StrCat("a ", what, " entry's symbol lies outside its segments"));
      }
      const auto sym = memory.Read<ElfW(Sym)>(sym_at);
      if (sym.st_name >= info.strsz) {
        return invalid(absl::StrCat("a symbol's name lies outside its DT_STRTAB"));
      }
      const char* name = reinterpret_cast<const char*>(strtab + sym.st_name);
      const size_t max_length = info.strsz - sym.st_name;
      const size_t length = strnlen(name, max_length);
      if (length == max_length) return invalid("a symbol's name is not terminated in DT_STRTAB");
      const int index = AllocSymbolIndex(std::string_view(name, length));
      if (index < 0) continue;
      const uintptr_t slot = image.base + rela.r_offset;
      if (slot % alignof(uintptr_t) != 0 || !memory.Contains(slot, sizeof(uintptr_t))) {
        return invalid(absl::StrCat("the GOT slot of ", kAllocSymbolNames[index],
                                    " lies outside its segments"));
      }
      GotSlot g;
      g.address = slot;
      g.symbol = static_cast<AllocSymbol>(index);
      g.prot = memory.ProtAt(slot);
      g.symbol_value = sym.st_shndx == SHN_UNDEF ? sym.st_value : 0;
      g.own_definition = sym.st_shndx != SHN_UNDEF ? sym.st_value : 0;
      found.push_back(g);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = scan(info.jmprel, info.pltrelsz, "DT_JMPREL"); !s.ok()) return s;
  if (absl::Status s = scan(info.rela, info.relasz, "DT_RELA"); !s.ok()) return s;
  slots->insert(slots->end(), found.begin(), found.end());
  return absl::OkStatus();
}

absl::Status CheckInterceptable(const ObjectImage& main_program, uintptr_t global_malloc) {
  if (DynamicAddress(main_program) == 0 || global_malloc == 0) {
    return absl::UnimplementedError(
        "the program is a static executable: its allocation calls go through no GOT slot, "
        "so allocations cannot be seen (link it dynamically to profile them)");
  }
  return absl::OkStatus();
}

}  // namespace inprof::internal
