#include "inprof/internal/log.h"

#include <unistd.h>

#include <atomic>
#include <string>

namespace inprof::internal {
namespace {
std::atomic<LogSink> g_sink{nullptr};
}  // namespace

void Log(absl::string_view message) {
  std::string line = "inprof: ";
  line.append(message.data(), message.size());
  line.push_back('\n');
  if (LogSink sink = g_sink.load(std::memory_order_acquire)) {
    sink(line);
    return;
  }
  WriteLineToStderr(line);
}

void WriteLineToStderr(absl::string_view line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // stderr closed: nothing useful to do
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void SetLogSinkForTesting(LogSink sink) {
  g_sink.store(sink, std::memory_order_release);
}

}  // namespace inprof::internal
