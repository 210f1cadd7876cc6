#include "inprof/base/log.h"

#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include <atomic>
#include <string>

namespace inprof::internal {
namespace {
std::atomic<LogSink> g_sink{nullptr};
// A thread with a descriptor table of its own: a pidfd of this process in
// that table, through which the program's stderr is fetched for a line.
thread_local int tls_stderr_pidfd = -1;

// The length of the valid UTF-8 sequence at the start of `s` (2-4), or 0.
// Overlong forms, surrogates and code points past U+10FFFF are invalid.
size_t Utf8SequenceLength(absl::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    length = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    length = 3;
    if (b0 == 0xe0) low = 0xa0;
    if (b0 == 0xed) high = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    length = 4;
    if (b0 == 0xf0) low = 0x90;
    if (b0 == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (s.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  return length;
}

void AppendHex(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out.push_back(kHex[c >> 4]);
  out.push_back(kHex[c & 0xf]);
}
}  // namespace

std::string EscapeForLog(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
      ++i;
      continue;
    }
    const size_t length = c >= 0x80 ? Utf8SequenceLength(text.substr(i)) : 0;
    // U+0080-U+009F (C2 80-C2 9F) are the C1 controls: CSI among them.
    const bool c1 = length == 2 && c == 0xc2 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    if (length == 0 || c1) {
      AppendHex(out, c);
      ++i;
      continue;
    }
    out.append(text.data() + i, length);
    i += length;
  }
  return out;
}

void Log(absl::string_view message) {
  std::string line = "inprof: ";
  line += EscapeForLog(message);
  line.push_back('\n');
  if (LogSink sink = g_sink.load(std::memory_order_acquire)) {
    sink(line);
    return;
  }
  WriteLineToStderr(line);
}

void WriteLineToStderr(absl::string_view line) {
  int fd = STDERR_FILENO;
  bool fetched = false;
#if defined(__linux__) && defined(SYS_pidfd_getfd)
  // The program's descriptor 2 now (it may have redirected it since this
  // thread's table was copied), as a descriptor of this thread's own table:
  // closing it afterwards touches nothing of the program's.
  if (tls_stderr_pidfd >= 0) {
    fd = static_cast<int>(syscall(SYS_pidfd_getfd, tls_stderr_pidfd,
                                  STDERR_FILENO, 0));
    if (fd < 0) return;  // the program has no stderr now
    fetched = true;
  }
#endif
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n <= 0) break;  // stderr closed: nothing useful to do
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (fetched) ::close(fd);
}

void UseProgramStderrThrough(int pidfd) noexcept { tls_stderr_pidfd = pidfd; }

int ProgramStderrPidfd() noexcept { return tls_stderr_pidfd; }

void SetLogSinkForTesting(LogSink sink) {
  g_sink.store(sink, std::memory_order_release);
}

}  // namespace inprof::internal
