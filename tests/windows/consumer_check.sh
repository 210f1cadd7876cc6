#!/usr/bin/env bash
# A mingw-w64 program built against the installed Windows prefix the way
# README says (pkg-config --static inprof), run under Wine: its profile
# must name its own function.
#   tests/windows/consumer_check.sh PREFIX WORKDIR
set -euo pipefail
prefix=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
cat >"$work/app.cc" <<'CC'
#include <inprof/inprof.h>

#include <thread>

__attribute__((noinline)) double ConsumerWork() {
  volatile double x = 0;
  for (int i = 0; i < 60'000'000; ++i) x = x + i * 0.5;
  return x;
}

int main() {
  inprof::DefaultProfiler profiler(inprof::Options::FromEnv());
  inprof::ScopedProfiler running(profiler);
  auto self = profiler.RegisterThread("main");
  std::thread worker([&] {
    auto registration = profiler.RegisterThread("worker");
    ConsumerWork();
  });
  worker.join();
  return running.start_status().ok() ? 0 : 1;
}
CC
export PKG_CONFIG_LIBDIR=$prefix/lib/pkgconfig:/usr/x86_64-w64-mingw32/lib/pkgconfig
# shellcheck disable=SC2046  # pkg-config's words are meant to split
x86_64-w64-mingw32-g++-posix -O1 "$work/app.cc" -o "$work/app.exe" \
  $(pkg-config --cflags --libs --static inprof) -static
INPROF_OUTPUT="Z:${work//\//\\}\\app.pb.gz" /usr/lib/wine/wine64 "$work/app.exe"
if [ ! -s "$work/app.pb.gz" ]; then
  echo "windows consumer check: FAIL: app.exe wrote no profile ($work/app.pb.gz)" >&2
  exit 1
fi
if ! command -v go >/dev/null; then
  echo "windows consumer check: FAIL: go (golang-go) is not installed: nothing read the profile" >&2
  exit 1
fi
if ! HOME=$work go tool pprof -top "$work/app.pb.gz" 2>/dev/null | grep -q ConsumerWork; then
  echo "windows consumer check: FAIL: ConsumerWork is not in the profile" >&2
  HOME=$work go tool pprof -top "$work/app.pb.gz" >&2 || true
  exit 1
fi
echo "windows consumer check: ok (a program built with pkg-config --static inprof against $prefix)"
