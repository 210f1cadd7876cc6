// src/symbolize/process_scan_linux.cc: see process_scan_linux.h.
#include "src/symbolize/process_scan_linux.h"

#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "inprof/base/elf_notes.h"
#include "inprof/base/growth_safe_table.h"
#include "src/symbolize/elf_symbols_dwfl.h"

namespace inprof::internal {
namespace {

// The build-id, in hex, of one note segment mapped at [data, data + size).
std::string BuildIdFromNotes(const unsigned char* data, size_t size,
                             size_t align) {
  const std::string id = internal::GnuBuildIdFromNotes(data, size, align);
  return HexBytes(reinterpret_cast<const unsigned char*>(id.data()), id.size());
}

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

}  // namespace

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

ScanResult ScanProcess(pid_t pid, const std::vector<internal::MapsEntry>& maps) {
  ScanResult scan;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  internal::ThrowSafeSet<std::string> seen;  // dev:inode:path
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

}  // namespace inprof::internal
