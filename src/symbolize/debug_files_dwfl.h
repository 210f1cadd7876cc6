// src/symbolize/debug_files_dwfl.h: separate debug files for the Linux
// symbolizer's libdwfl sessions (ElfSymbols, elf_symbols_dwfl.h): the Dwfl
// callbacks that find and check them offline (MakeCallbacks, used by
// symbolizer_dwfl.cc), and SessionFiles, what a session keeps of its files.
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
//
// Thread-safety: a SessionFiles belongs to its session and is used by the
// thread that uses the session (the Symbolizer is not thread-safe).
#ifndef INPROF_SRC_SYMBOLIZE_DEBUG_FILES_DWFL_H_
#define INPROF_SRC_SYMBOLIZE_DEBUG_FILES_DWFL_H_

#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <libelf.h>

#include <vector>

#include "inprof/base/owned_fd.h"

namespace inprof::internal {

// libdwfl's default debuginfo_path (libdwflP.h's DEFAULT_DEBUGINFO_PATH).
inline constexpr char kDefaultDebugInfoPath[] = ":.debug:/usr/lib/debug";

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
            SessionFiles& files);

// A separate debug file libdwfl opened on a descriptor it still holds:
// detached once `candidate` (an Elf the session can reach) is that file.
void SettleDebugFile(SessionFiles& files, Elf* candidate);

// Callbacks for sessions whose debug-info path is `*debuginfo_path` (null:
// the default). Offline only: see FindDebugInfoOffline.
Dwfl_Callbacks MakeCallbacks(char** debuginfo_path);

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_DEBUG_FILES_DWFL_H_
