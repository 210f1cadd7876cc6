// src/symbolize/dbghelp_lookup_windows.h: the DbgHelp lookups of the
// Windows symbolizer (symbolizer_dbghelp_windows.cc): a DbgHelp session
// under a handle value of its own, a module loaded into it, and the frames
// at an address (inlined ones first), named by DbgHelp or else by the
// module's export and COFF symbol tables, with file:line from the module's
// DWARF line tables where it has them. Wine's DbgHelp and what it gets
// wrong: symbolizer_dbghelp_windows.cc.
//
// Defines: DbgHelpSession, FileHandle (OpenForReading), NoSearchPath,
// LoadModule, ModuleView, Resolve.
//
// Thread-safety: every DbgHelp call holds g_dbghelp_mu (DbgHelpLock,
// dbghelp_guard_windows.h), as the annotations say.
#ifndef INPROF_SRC_SYMBOLIZE_DBGHELP_LOOKUP_WINDOWS_H_
#define INPROF_SRC_SYMBOLIZE_DBGHELP_LOOKUP_WINDOWS_H_

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "inprof/symbolizer.h"
#include "src/symbolize/dbghelp_guard_windows.h"
#include "src/symbolize/dwarf_lines_windows.h"
#include "src/symbolize/pe_image_windows.h"
#include "src/symbolize/win32_text_windows.h"

namespace inprof::internal {

// One DbgHelp session: SymInitializeW under a handle value of its own (the
// address of a byte it owns, which no real handle equals), without invading
// the process: modules are loaded explicitly. Every call goes through
// Call(), which marks the session poisoned when DbgHelp faults.
class DbgHelpSession {
 public:
  DbgHelpSession() = default;
  DbgHelpSession(const DbgHelpSession&) = delete;
  DbgHelpSession& operator=(const DbgHelpSession&) = delete;
  // The owner calls End() (under the lock) before it goes.
  ~DbgHelpSession() = default;

  HANDLE handle() const { return reinterpret_cast<HANDLE>(token_.get()); }
  bool started() const { return started_; }
  // Whether DbgHelp faulted in a call of this session.
  bool poisoned() const { return poisoned_; }
  // Whether calls may be made.
  bool usable() const { return started_ && !poisoned_; }

  // `search_path`: null for DbgHelp's default.
  absl::Status Start(const std::wstring* search_path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
    if (started_) return absl::OkStatus();
    const HANDLE h = handle();
    const wchar_t* path = search_path != nullptr ? search_path->c_str() : nullptr;
    const Outcome outcome =
        Guarded([&] { return SymInitializeW(h, path, FALSE) != FALSE; });
    if (outcome != Outcome::kOk) {
      return absl::InternalError(absl::StrCat(
          "DbgHelp: SymInitializeW: ", outcome == Outcome::kFaulted
                                           ? "faulted"
                                           : WinError(GetLastError())));
    }
    started_ = true;
    return absl::OkStatus();
  }

  // Runs `call` (a lambda returning bool, see Guarded) unless the session
  // is not usable; a fault poisons the session.
  template <typename F>
  bool Call(F&& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
    if (!usable()) return false;
    const Outcome outcome = Guarded(call);
    if (outcome == Outcome::kFaulted) poisoned_ = true;
    return outcome == Outcome::kOk;
  }

  // SymCleanup, except for a poisoned session, which is left as it is.
  void End() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu) {
    const HANDLE h = handle();
    Call([&] { return SymCleanup(h) != FALSE; });
    if (poisoned_) {
      // DbgHelp may still hold the handle value: keep the byte.
      static_cast<void>(token_.release());
    }
    started_ = false;
  }

 private:
  std::unique_ptr<char> token_ = std::make_unique<char>();
  bool started_ = false;
  bool poisoned_ = false;
};

// An open file, closed on destruction.
class FileHandle {
 public:
  FileHandle() = default;
  explicit FileHandle(HANDLE h) : h_(h) {}
  FileHandle(FileHandle&& other) noexcept
      : h_(std::exchange(other.h_, INVALID_HANDLE_VALUE)) {}
  FileHandle& operator=(FileHandle&& other) noexcept {
    if (this != &other) {
      Close();
      h_ = std::exchange(other.h_, INVALID_HANDLE_VALUE);
    }
    return *this;
  }
  ~FileHandle() { Close(); }
  HANDLE get() const { return h_; }
  bool valid() const { return h_ != INVALID_HANDLE_VALUE; }

 private:
  void Close() {
    if (valid()) CloseHandle(h_);
    h_ = INVALID_HANDLE_VALUE;
  }
  HANDLE h_ = INVALID_HANDLE_VALUE;
};

// Opens `path` to read, letting others read, write and delete it meanwhile;
// invalid on failure.
FileHandle OpenForReading(const std::wstring& path);

// The search path of sessions holding images whose CodeView record names no
// PDB: empty, so that no directory is searched (see LoadModule).
const std::wstring& NoSearchPath();

// Loads the image at `path` into `session` at [base, base + size).
//
// Wine 8's DbgHelp looks for the PDB that an RSDS record names in the
// image's directory and in the search path, taking every file whose name
// ends with that name as a candidate. An empty name (what mingw-w64's ld
// --build-id writes) matches every file, and reading a file that is not a
// PDB frees uninitialized pointers (pdb_fetch_file_info), corrupting the
// heap. So an `unnamed_pdb` image goes to DbgHelp as an open file (kept in
// *file while loaded) under its bare name, leaving no directory to search,
// into a session whose search path is NoSearchPath().
absl::Status LoadModule(DbgHelpSession& session, const std::wstring& path,
                        bool unnamed_pdb, uint64_t base, uint32_t size,
                        FileHandle* file)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu);

// What one lookup needs of a module.
struct ModuleView {
  DbgHelpSession* session = nullptr;  // null: DbgHelp did not load it
  uint64_t base = 0;                  // where DbgHelp has it
  bool use_debug_info = true;
  // Its export and COFF symbol tables (read on first use).
  absl::FunctionRef<const NameTable*()> fallback_names;
  // Its DWARF line tables; null when it has none (or its debug info is not
  // to be used).
  const DwarfLines* dwarf = nullptr;
};

// Frames at `address`, innermost first; records in `caps` what was found.
std::vector<SourceFrame> Resolve(const ModuleView& m, uint64_t address,
                                 Symbolizer::ModuleCapabilities* caps)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_dbghelp_mu);

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_DBGHELP_LOOKUP_WINDOWS_H_
