// src/symbolize/win32_text_windows.h: text helpers of the Windows symbolizer
// and its PE reader: UTF-16 <-> UTF-8, a Win32 error's message, the
// "cannot read symbols of PATH: REASON" error.
//
// Thread-safety: the functions are reentrant.
#ifndef INPROF_SRC_SYMBOLIZE_WIN32_TEXT_WINDOWS_H_
#define INPROF_SRC_SYMBOLIZE_WIN32_TEXT_WINDOWS_H_

#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace inprof::internal {

// UTF-16 to UTF-8 ("" for an empty or unconvertible input).
std::string Narrow(const wchar_t* s, size_t n);
std::string Narrow(const std::wstring& s);
// UTF-8 to UTF-16; false when `s` is not valid UTF-8 or holds a NUL.
bool Widen(absl::string_view s, std::wstring* out);
// FormatMessage's text for a Win32 error code, on one line.
std::string WinError(DWORD code);
// FailedPrecondition: "cannot read symbols of PATH: REASON".
absl::Status CannotRead(const std::string& path, absl::string_view reason);

}  // namespace inprof::internal

#endif  // INPROF_SRC_SYMBOLIZE_WIN32_TEXT_WINDOWS_H_
