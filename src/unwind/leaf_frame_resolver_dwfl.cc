#include "inprof/internal/leaf_frame_resolver.h"

#include "inprof/base/growth_safe_table.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <libelf.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>

#include "inprof/base/owned_fd.h"
#include "inprof/internal/dwarf_registers.h"

namespace inprof::internal {
namespace {

// x86-64 only (its DWARF register numbers: dwarf_registers.h). AArch64
// keeps a leaf's return address in x30, not on the stack; the handler would
// have to record lr instead. Not done yet.
#if defined(__x86_64__)
constexpr bool kSupported = true;
#else
constexpr bool kSupported = false;
#endif

// Only .eh_frame is needed, which lives in the loaded file itself: never
// look for separate debug files (and so never reach debuginfod) here.
int NoDebuginfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*,
                const char*, GElf_Word, char**) {
  return -1;
}

// dwfl_linux_proc_find_elf's file as an Elf that needs no descriptor:
// libdwfl would keep the descriptor for as long as the session lives and
// close that number at dwfl_end(), by which time the program may have
// closed it and reused the number for a file of its own (a daemon's
// close_range(3, ~0U, 0)). libelf has the file mapped (or read) and
// forgets the descriptor, which is closed here.
int FindElfWithoutDescriptor(Dwfl_Module* mod, void** userdata,
                             const char* module_name, Dwarf_Addr base,
                             char** file_name, Elf** elfp) {
  const int fd = dwfl_linux_proc_find_elf(mod, userdata, module_name, base,
                                          file_name, elfp);
  if (fd < 0) return fd;  // none, or an image from memory in *elfp
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP_PRIVATE, nullptr);
  if (elf != nullptr && elf_cntl(elf, ELF_C_FDREAD) != 0) {
    elf_end(elf);
    elf = nullptr;
  }
  close(fd);
  *elfp = elf;
  if (elf == nullptr) {
    // Unreadable: with a name left, libdwfl would open the file itself.
    std::free(*file_name);
    *file_name = nullptr;
  }
  return -1;
}

const Dwfl_Callbacks kCallbacks = {
    FindElfWithoutDescriptor, NoDebuginfo, nullptr, nullptr};

// Decodes a CFA expression of the form "breg N + offset".
bool CfaRegisterOffset(Dwarf_Op* ops, size_t nops, int* reg, int64_t* offset) {
  if (nops != 1) return false;
  if (ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg31) {
    *reg = ops[0].atom - DW_OP_breg0;
    *offset = static_cast<int64_t>(ops[0].number);
    return true;
  }
  if (ops[0].atom == DW_OP_bregx) {
    *reg = static_cast<int>(ops[0].number);
    *offset = static_cast<int64_t>(ops[0].number2);
    return true;
  }
  return false;
}

// Index into the words at sp that holds `pc`'s return address (its CFA is
// sp + 8 * (index + 1)), or -1 (a frame record, or nothing known).
int SlotFromCfi(Dwfl* dwfl, uint64_t pc) {
  int slot = -1;
  if (Dwfl_Module* module = dwfl_addrmodule(dwfl, pc)) {
    Dwarf_Addr bias = 0;
    Dwarf_CFI* cfi = dwfl_module_eh_cfi(module, &bias);
    if (cfi == nullptr) cfi = dwfl_module_dwarf_cfi(module, &bias);
    Dwarf_Frame* frame = nullptr;
    if (cfi != nullptr && dwarf_cfi_addrframe(cfi, pc - bias, &frame) == 0) {
      Dwarf_Op* ops = nullptr;
      size_t nops = 0;
      int reg = -1;
      int64_t offset = 0;
      if (dwarf_frame_cfa(frame, &ops, &nops) == 0 &&
          CfaRegisterOffset(ops, nops, &reg, &offset) && reg == kDwarfSp &&
          offset >= 8 && offset % 8 == 0 &&
          offset <= static_cast<int64_t>(8 * LeafFrameResolver::kStackWords)) {
        slot = static_cast<int>(offset / 8 - 1);
      }
      // An rbp-based CFA (kDwarfFp) means a frame record: slot -1.
      free(frame);
    }
  }
  return slot;
}

void ReadLoaderCounters(unsigned long long* adds, unsigned long long* subs) {
  struct Counters {
    unsigned long long adds = 0, subs = 0;
  } c;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) {
        auto* out = static_cast<Counters*>(data);
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
          out->adds = info->dlpi_adds;
          out->subs = info->dlpi_subs;
        }
        return 1;  // the counters are the same in every entry
      },
      &c);
  *adds = c.adds;
  *subs = c.subs;
}

}  // namespace

struct LeafFrameResolver::Session {
  Dwfl* dwfl = nullptr;
  ~Session() {
    if (dwfl != nullptr) dwfl_end(dwfl);
  }
};

LeafFrameResolver::LeafFrameResolver() = default;
LeafFrameResolver::~LeafFrameResolver() = default;

void LeafFrameResolver::Refresh() {
  if (!kSupported) return;
  unsigned long long adds = 0, subs = 0;
  ReadLoaderCounters(&adds, &subs);
  if (session_ != nullptr && adds == adds_ && subs == subs_) return;
  adds_ = adds;
  subs_ = subs;
  slots_.clear();  // a pc may now belong to another module
  auto session = std::make_unique<Session>();
  // /proc/PID/maps and auxv are read in a descriptor table of inprof's own
  // (RunWithOwnDescriptors): never on a number of the program's.
  int rc = -1;
  RunWithOwnDescriptors([&] {
    session->dwfl = dwfl_begin(&kCallbacks);
    if (session->dwfl == nullptr) return;
    dwfl_report_begin(session->dwfl);
    rc = dwfl_linux_proc_report(session->dwfl, getpid());
    dwfl_report_end(session->dwfl, nullptr, nullptr);
  });
  if (session->dwfl == nullptr || rc != 0) return;  // no /proc: insert nothing
  session_ = std::move(session);
}

bool LeafFrameResolver::InModule(uint64_t address) {
  if (session_ == nullptr) return false;
  return dwfl_addrmodule(session_->dwfl, address) != nullptr;
}

int LeafFrameResolver::ReturnAddressSlot(uint64_t pc) {
  if (session_ == nullptr) return -1;
  auto it = slots_.find(pc);
  if (it != slots_.end()) return it->second;
  // The module's file is opened (FindElfWithoutDescriptor) at its first
  // lookup: in inprof's own descriptor table.
  int slot = -1;
  RunWithOwnDescriptors([&] { slot = SlotFromCfi(session_->dwfl, pc); });
  internal::GrowthReserve reserve(slots_);  // growth_safe_table.h
  slots_.emplace(pc, static_cast<int8_t>(slot));
  return slot;
}

}  // namespace inprof::internal
