#!/usr/bin/env bash
# The README's commands:
#   scripts/quickstart.sh demo     build and run the demo (profile a program, show the result)
#   scripts/quickstart.sh test     build and run the whole test suite, then again
#                                  under sanitizers, then the fuzzers, then the
#                                  Windows suite (cross-built, under Wine)
#   scripts/quickstart.sh windows  the Windows build: cross-build, test under
#                                  Wine, install into build-windows/prefix, run
#                                  the demo (scripts/windows.sh)
# Installs the Debian packages it needs when they are missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = windows ]; then
  exec bash scripts/windows.sh all
fi

packages=(g++ pkg-config meson ninja-build libabsl-dev libgtest-dev libgmock-dev
          libbenchmark-dev zlib1g-dev libprotobuf-dev protobuf-compiler libdw-dev libbz2-dev
          libcurl4-openssl-dev libmicrohttpd-dev golang-go clang libclang-rt-14-dev)
# What the tests use, so that a fresh Debian 12 machine runs every test (a
# test whose tool is missing skips with the package's name, and fails under
# CI=true: docs/test_command.md): the flame graph pages load in a real
# browser; gperftools' pprof reads the drop-in's GetHeapProfile text; dwz
# makes the alt file the symbolizer reads; gperftools' library and
# jemalloc's build the side-by-side bench targets (bench/meson.build), so
# that the build the suite checks is the one with every optional target;
# lld links the sanitizer builds and the fuzzers in a quarter of GNU ld's
# CPU (scripts/sanitizers.sh).
[ "${1:-}" = test ] && packages+=(chromium google-perftools dwz libgoogle-perftools-dev libjemalloc-dev lld)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "quickstart: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build=${INPROF_BUILD_DIR:-build}
# Warnings are errors only where asked (CI: .ci/run sets INPROF_WERROR=true),
# so a newer compiler never breaks a user's build.
[ -f "$build/build.ninja" ] || meson setup "$build" -Dwerror="${INPROF_WERROR:-false}" >/dev/null

case "${1:-}" in
  demo)
    ninja -C "$build" examples/demo src/cli/inprof >/dev/null
    mkdir -p "$build/demo-out"
    profile=${INPROF_OUTPUT:-$PWD/$build/demo-out/demo.pb.gz}
    INPROF_OUTPUT="$profile" "$build/examples/demo"
    # The same profile through the tool: a flame graph page to open in a
    # browser (one self-contained file).
    if [ -f "$profile" ]; then
      "$build/src/cli/inprof" flamegraph "$profile" -o "${profile%.pb.gz}.html" 2>/dev/null &&
        echo "Flame graph: ${profile%.pb.gz}.html (open it in a browser; also: $build/src/cli/inprof top $profile)"
    fi
    ;;
  test)
    # The stages: the plain suite, then the suite under ASan+UBSan and TSan
    # (INPROF_SANITIZERS, default "asan tsan"; "" skips), each fuzzer for
    # FUZZ_SECONDS (default 5; 0 skips), and the Windows suite under Wine
    # (INPROF_WINDOWS=0 skips; Abseil and GoogleTest are cross-built once and
    # cached in build-windows/, rm -rf it to rebuild).
    #
    # Tests mostly wait (sleeps, serial timing tests) while builds compute:
    # once the plain build is done, the later stages' builds run in the
    # background, in two chains, while the suites run in the foreground,
    # each as soon as its build is ready: the sanitizer builds (ASan, then
    # TSan), and beside them the fuzzers' and the Windows builds, which
    # take the CPU the others leave (the fuzzers' links and Abseil's CMake
    # steps use one core, the Wine prefix's creation less): one chain left
    # ~8% of two cores idle. Both at nice 5: a test that computes gets three
    # quarters of a core it shares with one build. Not lower: beside other
    # work at nice 0 (a busy CI machine, or two busy loops) a build at nice
    # 10 gets a tenth of a core, and the fuzzers' build took 813 s instead
    # of 90. The suites pass beside two busy loops, so the builds beside
    # them are no harm.
    #
    # Each stage's wall time and the CPU its processes used (user + system,
    # from bash's `times`) are printed as a table at the end: README's
    # "Where the test command's time goes".
    sanitizers=${INPROF_SANITIZERS-asan tsan}
    fuzz_seconds=${FUZZ_SECONDS:-5}
    windows=${INPROF_WINDOWS:-1}
    logs=$PWD/$build/test-logs
    rm -rf "$logs"
    mkdir -p "$logs"
    # The disk the stages write to: a clean clone's build folders take about
    # 1.8 GiB (plain), 2.4 (ASan), 0.8 (TSan), 0.1 (fuzzers) and 1.1
    # (Windows, with its Wine prefix), measured on 3c197f0. A full disk
    # shows up as a compiler's "No space left on device" deep in a stage's
    # log, so say it once, first, with the figures. Folders already there
    # count as written.
    need_mib=0
    [ -d "$build/tests" ] || need_mib=$((need_mib + 1850))
    for san in $sanitizers; do
      case $san in asan) mib=2450 ;; tsan) mib=850 ;; *) mib=1000 ;; esac
      [ -d "$build-$san/tests" ] || need_mib=$((need_mib + mib))
    done
    [ "$fuzz_seconds" = 0 ] || [ -d "$build-fuzz" ] || need_mib=$((need_mib + 100))
    [ "$windows" = 0 ] || [ -d "${INPROF_WINDOWS_DIR:-build-windows}/wine" ] || need_mib=$((need_mib + 1150))
    free_mib=$(df -Pm "$build" | awk 'NR == 2 { print $4 }')
    if [ -n "$free_mib" ] && [ "$free_mib" -lt $((need_mib + 512)) ]; then
      echo "quickstart: warning: $free_mib MiB free on the disk holding $PWD/$build;" \
        "the stages asked for will write about $need_mib MiB (INPROF_SANITIZERS=\"\"," \
        "INPROF_WINDOWS=0 or FUZZ_SECONDS=0 leave stages out)" >&2
    fi
    # cpu_now FILE: the CPU seconds of this shell's finished children, read
    # by `times` in this shell itself (a $(...) subshell has no children).
    cpu_now() {
      times >"$1"
      cpu=$(tail -1 "$1" | awk '{ split($1, u, "m"); split($2, s, "m");
        printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
    }
    table=()
    row() { table+=("$(printf '  %-30s %5ss wall %6ss CPU%s' "$1" "$2" "$3" "$4")"); }
    stage() {  # stage NAME COMMAND...: runs it in the foreground, records its times
      local name=$1 start=$SECONDS cpu cpu0 rc=0
      shift
      cpu_now "$logs/.times"
      cpu0=$cpu
      "$@" || rc=$?
      cpu_now "$logs/.times"
      row "$name" $((SECONDS - start)) $((cpu - cpu0)) "$([ $rc = 0 ] || echo '  FAILED')"
      return $rc
    }
    # await NAME: waits for a background build or suite, adds its row, prints its log
    # when it failed; false then.
    await() {
      local rc wall cpu
      while [ ! -f "$logs/$1.done" ]; do sleep 1; done
      read -r rc wall cpu <"$logs/$1.done"
      row "$1 (background)" "$wall" "$cpu" "$([ "$rc" = 0 ] || echo '  FAILED')"
      if [ "$rc" != 0 ]; then
        echo "quickstart: $1 failed; the end of $logs/$1.log:"
        tail -40 "$logs/$1.log"
        return 1
      fi
    }
    if ! stage "plain: build" ninja -C "$build"; then
      printf '%s\n' "${table[@]}"
      exit 1
    fi
    # The suites that ran, as STAGE=BUILD_DIR: their skipped tests are
    # listed at the end (scripts/test_report.py).
    ran=()
    # background NICE NAME COMMAND...: runs it with its times in $logs/NAME.done.
    background() {
      local niceness=$1 name=$2 start=$SECONDS cpu cpu0 rc=0
      shift 2
      cpu_now "$logs/.times-$name"
      cpu0=$cpu
      nice -n "$niceness" "$@" >"$logs/$name.log" 2>&1 || rc=$?
      cpu_now "$logs/.times-$name"
      echo "$rc $((SECONDS - start)) $((cpu - cpu0))" >"$logs/$name.done"
    }
    (
      for san in $sanitizers; do
        background 5 "$san: build" env INPROF_SANITIZERS="$san" INPROF_SANITIZER_STEP=build \
          bash scripts/sanitizers.sh "$build"
      done
    ) &
    builders=($!)
    (
      [ "$fuzz_seconds" = 0 ] || background 5 "fuzzers: build" env FUZZ_STEP=build FUZZ_OPT=-O0 bash fuzz/run.sh "$build-fuzz"
      [ "$windows" = 0 ] || background 5 "windows: build" bash scripts/windows.sh build
    ) &
    builders+=($!)
    # || true: under set -e a failing kill (the builder is done) in the EXIT
    # trap made the command exit 1 after every stage passed.
    trap 'kill "${builders[@]}" 2>/dev/null || true' EXIT
    status=0
    stage "plain: tests" meson test -C "$build" --print-errorlogs || status=1
    ran+=("plain=$build")
    # The later suites in the order their builds finish, so that a suite
    # whose build is done runs while the others still build rather than
    # after a suite still waiting for its own: what is left when the last
    # build ends is its suite alone.
    pending=()
    later=()  # suites running in the background, awaited after the loop
    for san in $sanitizers; do pending+=("$san"); done
    [ "$fuzz_seconds" = 0 ] || pending+=(fuzzers)
    [ "$windows" = 0 ] || pending+=(windows)
    while ((${#pending[@]})); do
      next=""
      while [ -z "$next" ]; do
        for p in "${pending[@]}"; do
          if [ -f "$logs/$p: build.done" ]; then next=$p; break; fi
        done
        [ -n "$next" ] || sleep 1
      done
      rest=()
      for p in "${pending[@]}"; do [ "$p" = "$next" ] || rest+=("$p"); done
      pending=("${rest[@]}")
      if ! await "$next: build"; then
        status=1
        continue
      fi
      case $next in
        fuzzers)
          stage "fuzzers: run" env FUZZ_STEP=run FUZZ_SECONDS="$fuzz_seconds" \
            bash fuzz/run.sh "$build-fuzz" || status=1 ;;
        windows)
          # Beside the next suite, awaited at the end: Wine's suite mostly
          # waits (run last and alone, both cores stood idle ~30 s of its
          # 60, docs/test_command.md).
          background 0 "windows: tests" bash scripts/windows.sh test &
          builders+=($!)
          later+=("windows: tests")
          ran+=("windows=${INPROF_WINDOWS_DIR:-build-windows}/build") ;;
        *)
          stage "$next: tests" env INPROF_SANITIZERS="$next" INPROF_SANITIZER_STEP=test \
            bash scripts/sanitizers.sh "$build" || status=1
          ran+=("$next=$build-$next") ;;
      esac
    done
    for name in "${later[@]}"; do
      # Its tests' lines and summary, from the first test on.
      if await "$name"; then sed -n '/^ *1\/[0-9]* /,$p' "$logs/$name.log"; else status=1; fi
    done
    wait "${builders[@]}" 2>/dev/null || true
    # Every skip, with the reason the test gave: a skip is a statement
    # about this machine or a sanitizer, never a pass (docs/test_command.md
    # lists the expected ones). Then the stages' times, then every failed
    # test with its failure lines: last, since a CI service may show only
    # the end of the log.
    echo
    python3 scripts/test_report.py skipped "${ran[@]}" || status=1
    echo
    echo "quickstart: where the time went (logs in $logs)"
    printf '%s\n' "${table[@]}"
    if [ "$status" != 0 ]; then
      echo
      python3 scripts/test_report.py failed "${ran[@]}" || true
    fi
    exit $status
    ;;
  *)
    echo "usage: $0 demo|test|windows" >&2
    exit 2
    ;;
esac
