#!/usr/bin/env bash
# inprof for Windows x64: cross-built with mingw-w64, run under Wine.
#
#   scripts/windows.sh build   the toolchain and libraries (scripts/windows_deps.sh,
#                              cached), then inprof, its tests and the demo
#   scripts/windows.sh test    build, then the Windows suite under Wine (meson
#                              test), a program built against the installed
#                              prefix with pkg-config, and the demo's profile
#                              read by go tool pprof and protoc on this side
#   scripts/windows.sh demo    build, install into build-windows/prefix, run the
#                              demo under Wine and show its profile
#   scripts/windows.sh all     test, then demo (scripts/quickstart.sh windows)
#   scripts/windows.sh bench   the sampler's benchmarks and the overhead run,
#                              under Wine, in their own build (build-bench/)
#
# INPROF_WINDOWS_DIR (default build-windows) holds everything: the cached
# dependencies (deps/), the build (build/), the install (prefix/) and Wine's
# prefix (wine/, so ~/.wine is never touched). INPROF_WERROR=true turns
# warnings into errors (CI).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
dir=${INPROF_WINDOWS_DIR:-build-windows}
bash scripts/windows_deps.sh "$dir" "$([ "$mode" = bench ] && echo benchmark)"
dir=$(cd "$dir" && pwd)
build=$dir/build
prefix=$dir/prefix

export WINEPREFIX=$dir/wine WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
wine=/usr/lib/wine/wine64
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  # Once, before anything runs in parallel: Wine makes its prefix at the
  # first start (~10 s), and two first starts at once race.
  echo "windows: creating a Wine prefix in $WINEPREFIX"
  "$wine" cmd /c exit >/dev/null 2>&1 || true
fi

# At -O1, like Abseil beside it: the suite and the demo need the library
# correct, not fast (the benchmarks build at release in their own folder,
# build-bench/). The library took 98 CPU-s at -O2, 85 at -O1. Full -g
# stays: at -g1 GCC leaves out the classes around member functions, and
# the symbolizer then names LineTable::Find "Find".
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --cross-file "$dir/cross-mingw64.ini" --prefix "$prefix" \
    -Doptimization=1 \
    -Dbenchmarks=disabled -Dwerror="${INPROF_WERROR:-false}" >/dev/null
fi
ninja -C "$build" >"$build/ninja.log" || {
  echo "windows: the build failed; the end of $build/ninja.log:" >&2
  tail -40 "$build/ninja.log" >&2
  exit 1
}

run_tests() {
  # The Linux side's checks read the Windows profiles with go tool pprof
  # and protoc.
  local missing=()
  for p in golang-go protobuf-compiler; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "windows: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
  local status=0
  # One Wine server for the suite's parallel tests. Wine's own exits 3 s
  # after its last client, and a test that starts in that instant dies at
  # once with "wine client error:0: recvmsg: Connection reset by peer"
  # (autoregister_windows_test, once in a clean clone's run, 2026-11-28).
  # This one stays until 30 s after its last client: after whatever
  # server runs now has exited (-w), so that it is the one that serves.
  /usr/lib/wine/wineserver64 -w || true
  /usr/lib/wine/wineserver64 -p30 || true
  meson test -C "$build" --print-errorlogs || status=1
  # A consumer's program, compiled and linked against the installed prefix
  # as README says, then run under Wine.
  meson install -C "$build" --quiet >/dev/null
  bash tests/windows/consumer_check.sh "$prefix" "$dir/consumer" || status=1
  # What a Windows program wrote, read by the tools users read it with.
  bash tests/windows/pprof_check.sh "$build/examples/demo.exe" "$dir/pprof-check" || status=1
  return $status
}

run_demo() {
  meson install -C "$build" --quiet >/dev/null
  mkdir -p "$dir/demo-out"
  # The profile goes where Wine's Z: drive shows this directory.
  local profile=$dir/demo-out/demo.pb.gz
  INPROF_OUTPUT="Z:${profile//\//\\}" "$wine" "$build/examples/demo.exe"
  if command -v go >/dev/null && [ -f "$profile" ]; then
    echo
    echo "The same profile through go tool pprof (on this side):"
    go tool pprof -top -nodecount=8 "$profile" 2>/dev/null | sed -n '1,14p'
  fi
  echo
  echo "Installed for mingw-w64 programs: $prefix"
  echo "  x86_64-w64-mingw32-g++-posix app.cc \$(PKG_CONFIG_LIBDIR=$prefix/lib/pkgconfig:/usr/x86_64-w64-mingw32/lib/pkgconfig pkg-config --cflags --libs --static inprof) -static"
}

run_bench() {
  local bench_build=$dir/build-bench
  if [ ! -f "$bench_build/build.ninja" ]; then
    meson setup "$bench_build" --cross-file "$dir/cross-mingw64.ini" --buildtype=release \
      -Dtests=disabled -Dbenchmarks=enabled >/dev/null
  fi
  ninja -C "$bench_build" bench/windows/sampler_windows_benchmark.exe \
    bench/windows/overhead_windows.exe >/dev/null
  "$wine" "$bench_build/bench/windows/sampler_windows_benchmark.exe" \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
  "$wine" "$bench_build/bench/windows/overhead_windows.exe" 7 1500
  "$wine" "$bench_build/bench/windows/overhead_windows.exe" idle 100 2
  "$wine" "$bench_build/bench/windows/overhead_windows.exe" idle 1000 2
}

case "$mode" in
  build) ;;
  bench) run_bench ;;
  test) run_tests ;;
  demo) run_demo ;;
  all)
    status=0
    run_tests || status=1
    run_demo || status=1
    exit $status
    ;;
  *)
    echo "usage: $0 build|test|demo|all|bench" >&2
    exit 2
    ;;
esac
