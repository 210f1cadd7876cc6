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
# The tests load the flame graph pages in a real browser.
[ "${1:-}" = test ] && packages+=(chromium)
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
    # Each stage's wall time and the CPU its processes used (user + system,
    # from bash's `times`), as a table at the end: README's "Where the test
    # command's time goes".
    times_file=$(mktemp)
    child_cpu() {
      times >"$times_file"
      tail -1 "$times_file" | awk '{ split($1, u, "m"); split($2, s, "m");
        printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
    }
    table=()
    stage() {  # stage NAME COMMAND...: runs it, records its times, keeps going
      local name=$1 start=$SECONDS cpu0 rc=0
      shift
      cpu0=$(child_cpu)
      "$@" || rc=$?
      table+=("$(printf '  %-28s %5ss wall %6ss CPU%s' "$name" $((SECONDS - start)) \
        $(($(child_cpu) - cpu0)) "$([ $rc = 0 ] || echo '  FAILED')")")
      return $rc
    }
    status=0
    if ! stage "plain: build" ninja -C "$build"; then
      printf '%s\n' "${table[@]}"
      exit 1
    fi
    stage "plain: tests" meson test -C "$build" --print-errorlogs || status=1
    # Then the suite under ASan+UBSan and TSan (INPROF_SANITIZERS, default
    # "asan tsan"; "" skips) and each fuzzer for FUZZ_SECONDS (default 20; 0
    # skips).
    for san in ${INPROF_SANITIZERS-asan tsan}; do
      stage "$san: build and tests" env INPROF_SANITIZERS=$san bash scripts/sanitizers.sh "$build" || status=1
    done
    [ "${FUZZ_SECONDS:-20}" = 0 ] || stage "fuzzers: build and run" bash fuzz/run.sh "$build-fuzz" || status=1
    # The Windows suite (INPROF_WINDOWS=0 skips): Abseil and GoogleTest are
    # cross-built once and cached in build-windows/ (rm -rf it to rebuild).
    [ "${INPROF_WINDOWS:-1}" = 0 ] || stage "windows: build and tests" bash scripts/windows.sh test || status=1
    echo
    echo "quickstart: where the time went"
    printf '%s\n' "${table[@]}"
    rm -f "$times_file"
    exit $status
    ;;
  *)
    echo "usage: $0 demo|test|windows" >&2
    exit 2
    ;;
esac
