// src/symbolize/win32_text_windows.cc: see win32_text_windows.h.
#include "src/symbolize/win32_text_windows.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace inprof::internal {

std::string Narrow(const wchar_t* s, size_t n) {
  if (n == 0) return "";
  const int size = WideCharToMultiByte(CP_UTF8, 0, s, static_cast<int>(n),
                                       nullptr, 0, nullptr, nullptr);
  if (size <= 0) return "";
  std::string out(static_cast<size_t>(size), '\0');
  WideCharToMultiByte(CP_UTF8, 0, s, static_cast<int>(n), out.data(), size,
                      nullptr, nullptr);
  return out;
}

std::string Narrow(const std::wstring& s) { return Narrow(s.data(), s.size()); }

// UTF-8 to UTF-16; false when `s` is not valid UTF-8 or holds a NUL.
bool Widen(absl::string_view s, std::wstring* out) {
  out->clear();
  if (s.empty()) return true;
  if (s.find('\0') != absl::string_view::npos || s.size() > (1u << 30)) {
    return false;
  }
  const int size = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s.data(),
                                       static_cast<int>(s.size()), nullptr, 0);
  if (size <= 0) return false;
  out->resize(static_cast<size_t>(size));
  MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s.data(),
                      static_cast<int>(s.size()), out->data(), size);
  return true;
}

// FormatMessage's text for a Win32 error code, on one line.
std::string WinError(DWORD code) {
  wchar_t* buf = nullptr;
  const DWORD n = FormatMessageW(
      FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM |
          FORMAT_MESSAGE_IGNORE_INSERTS,
      nullptr, code, 0, reinterpret_cast<LPWSTR>(&buf), 0, nullptr);
  std::string text = n > 0 && buf != nullptr ? Narrow(buf, n) : "";
  if (buf != nullptr) LocalFree(buf);
  for (char& c : text) {
    if (c == '\r' || c == '\n') c = ' ';
  }
  text = std::string(absl::StripAsciiWhitespace(text));
  if (!absl::StrContains(text, absl::StrCat(code))) {
    absl::StrAppend(&text, text.empty() ? "" : " ", "(error ", code, ")");
  }
  return text;
}

absl::Status CannotRead(const std::string& path, absl::string_view reason) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot read symbols of ", path, ": ", reason));
}

}  // namespace inprof::internal
