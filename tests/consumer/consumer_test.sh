#!/usr/bin/env bash
# inprof as its consumers get it, checked end to end:
#
#   consumer_test.sh install BUILD_DIR SOURCE_DIR
#     installs BUILD_DIR into a temporary root (meson install --destdir),
#     compiles tests/consumer/app.cc with README's command
#       g++ app.cc $(pkg-config --cflags --libs --static inprof) -o app
#     (pkg-config pointed at that root), runs it, and checks: the profile it
#     wrote decodes (go tool pprof -top when Go is there) and names
#     ConsumerWork; the program links neither libcurl nor libprotobuf and maps
#     libcurl only when an upload is configured; a configured upload whose
#     libcurl cannot be loaded says so in one line and the program finishes;
#     the installed `inprof run` finds its installed preload library; a
#     gperftools-API program links with `pkg-config ... inprof-gperftools`.
#   consumer_test.sh subproject SOURCE_DIR
#     builds the same program in a fresh Meson project that has inprof as a
#     subproject (dependency('inprof') with the fallback forced), with clang
#     where it is installed, and runs it.
set -euo pipefail

fail() { echo "consumer_test: FAIL: $*" >&2; exit 1; }

mode=$1
mkdir -p "${INPROF_TEST_TMPDIR:-/tmp}"
tmp=$(mktemp -d "${INPROF_TEST_TMPDIR:-/tmp}/consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

check_profile() {  # PROFILE
  [ -s "$1" ] || fail "no profile written at $1"
  if [ -n "${INPROF_GO:-}" ]; then
    top=$(HOME="$tmp" PPROF_TMPDIR="$tmp" "$INPROF_GO" tool pprof -top "$1" 2>&1) ||
      fail "go tool pprof cannot read $1: $top"
    grep -q ConsumerWork <<< "$top" || fail "ConsumerWork not in the profile: $top"
  fi
}

case "$mode" in
  install)
    build=$2
    src=$3
    meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null
    pc=$(find "$tmp/root" -name inprof.pc | head -1)
    [ -n "$pc" ] || fail "meson install put no inprof.pc under $tmp/root"
    export PKG_CONFIG_PATH
    PKG_CONFIG_PATH=$(dirname "$pc")
    export PKG_CONFIG_SYSROOT_DIR="$tmp/root"
    cp "$src/tests/consumer/app.cc" "$tmp/app.cc"
    cd "$tmp"
    # README's command, as printed there.
    g++ app.cc $(pkg-config --cflags --libs --static inprof) -o app ||
      fail "README's link command failed"
    needed=$(readelf -d app | grep NEEDED || true)
    for lib in libcurl libprotobuf; do
      if grep -q "$lib" <<< "$needed"; then fail "app links $lib: $needed"; fi
    done
    echo "consumer_test: app needs $(grep -c NEEDED <<< "$needed") libraries, loads $(ldd app | wc -l)"

    out=$(INPROF_OUTPUT="$tmp/app.pb.gz" ./app 2>&1) || fail "app failed: $out"
    grep -q "libcurl mapped: no" <<< "$out" || fail "libcurl mapped without an upload: $out"
    grep -q "libprotobuf mapped: no" <<< "$out" || fail "libprotobuf mapped: $out"
    check_profile "$tmp/app.pb.gz"

    # An upload configured (to a port nobody listens on): libcurl is loaded
    # then, and the program still finishes and writes its file.
    out=$(INPROF_OUTPUT="$tmp/up.pb.gz" INPROF_DATADOG=true INPROF_UPLOAD_RETRIES=0 \
          DD_TRACE_AGENT_URL=http://127.0.0.1:9 ./app 2>&1) ||
      fail "app with an upload failed: $out"
    grep -q "libcurl mapped: yes" <<< "$out" || fail "libcurl not loaded for an upload: $out"
    check_profile "$tmp/up.pb.gz"

    # The same with libcurl missing: one line says so, the program goes on.
    out=$(INPROF_OUTPUT="$tmp/nocurl.pb.gz" INPROF_DATADOG=true INPROF_UPLOAD_RETRIES=0 \
          DD_TRACE_AGENT_URL=http://127.0.0.1:9 INPROF_LIBCURL=/nonexistent/libcurl.so.4 \
          ./app 2>&1) || fail "app without libcurl failed: $out"
    grep -q "Datadog upload configured, but uploads need libcurl ('/nonexistent/libcurl.so.4', Debian package libcurl4), which cannot be loaded" <<< "$out" ||
      fail "no clear line about the missing libcurl: $out"
    check_profile "$tmp/nocurl.pb.gz"

    # The allocation profiler: README's "Where memory goes" link command;
    # 16 MiB kept live at one site, sampled every 64 KiB on average: the
    # chance that none of its 1,024 blocks of 16 KiB is sampled is
    # exp(-1024 * 16 / 64) = exp(-256).
    cp "$src/tests/consumer/heap_app.cc" "$tmp/heap_app.cc"
    g++ -std=c++20 heap_app.cc $(pkg-config --cflags --libs --static inprof-heap) -o heap_app ||
      fail "README's inprof-heap link command failed"
    out=$(INPROF_OUTPUT="$tmp/heap.pb.gz" INPROF_ALLOC_PERIOD=64KiB ./heap_app 2>&1) ||
      fail "heap_app failed: $out"
    [ -s "$tmp/heap.pb.gz" ] || fail "heap_app wrote no profile: $out"
    if [ -n "${INPROF_GO:-}" ]; then
      top=$(HOME="$tmp" PPROF_TMPDIR="$tmp" "$INPROF_GO" tool pprof -sample_index=inuse_space \
            -top "$tmp/heap.pb.gz" 2>&1) || fail "go tool pprof cannot read heap.pb.gz: $top"
      grep -q ConsumerAllocates <<< "$top" || fail "ConsumerAllocates not in inuse_space: $top"
    fi

    # The gperftools drop-in: a program written against
    # <gperftools/profiler.h>, linked with README's command for it.
    cp "$src/tests/gperftools/gperftools_program.cc" "$tmp/gp.cc"
    g++ -std=c++20 gp.cc $(pkg-config --cflags --libs --static inprof-gperftools) -o gp ||
      fail "README's inprof-gperftools link command failed"
    out=$(./gp api "$tmp/gp.prof" 2>&1) || fail "gperftools API program failed: $out"
    [ -s "$tmp/gp.prof" ] || fail "the gperftools API program wrote no profile: $out"
    if [ -n "${INPROF_GO:-}" ]; then
      top=$(HOME="$tmp" PPROF_TMPDIR="$tmp" "$INPROF_GO" tool pprof -top "$tmp/gp.prof" 2>&1) ||
        fail "go tool pprof cannot read gp.prof: $top"
      grep -q ApiThreadWork <<< "$top" || fail "ApiThreadWork not in gp.prof: $top"
    fi

    # The installed tool finds its installed preload library (bin/inprof ->
    # libdir/inprof/libinprof_preload.so) and profiles a program that
    # links nothing of inprof: the same app, told not to start its own.
    tool=$(find "$tmp/root" -path '*/bin/inprof' | head -1)
    [ -n "$tool" ] || fail "meson install put no bin/inprof under $tmp/root"
    out=$(INPROF_PRELOAD_LIBRARY= "$tool" run -o "$tmp/run-%p.pb.gz" -- /bin/sh -c 'exec true' 2>&1) ||
      fail "installed 'inprof run' failed: $out"
    grep -q "inprof run: wrote $tmp/run-" <<< "$out" ||
      fail "installed 'inprof run' wrote no profile: $out"
    ;;
  subproject)
    src=$2
    mkdir -p "$tmp/proj/subprojects"
    cp "$src/tests/consumer/subproject/meson.build" "$src/tests/consumer/app.cc" "$tmp/proj/"
    ln -s "$src" "$tmp/proj/subprojects/inprof"
    cd "$tmp/proj"
    # With clang where it is installed (the test command installs it for
    # the sanitizer builds): the plain build and consumer_install use GCC,
    # so this also checks that inprof builds with the other compiler a
    # consumer may have, and clang compiles the library at -O0 in 31 CPU-s
    # against GCC's 49.
    cc=(); command -v clang++ >/dev/null && command -v clang >/dev/null && cc=(CC=clang CXX=clang++)
    env "${cc[@]}" meson setup build --force-fallback-for=inprof -Doptimization=0 -Ddebug=false \
      >"$tmp/setup.log" 2>&1 ||
      { tail -20 "$tmp/setup.log"; fail "meson setup of a project using inprof as a subproject failed"; }
    ninja -C build app >"$tmp/ninja.log" 2>&1 ||
      { tail -30 "$tmp/ninja.log"; fail "building inprof as a subproject failed"; }
    out=$(INPROF_OUTPUT="$tmp/sub.pb.gz" ./build/app 2>&1) || fail "app failed: $out"
    grep -q "libcurl mapped: no" <<< "$out" || fail "libcurl mapped without an upload: $out"
    check_profile "$tmp/sub.pb.gz"
    echo "consumer_test: subproject build (${cc[1]:-CXX=c++}) ran and profiled"
    ;;
  *)
    fail "usage: consumer_test.sh install BUILD SRC | subproject SRC"
    ;;
esac
echo "consumer_test: $mode OK"
