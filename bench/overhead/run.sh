#!/usr/bin/env bash
# Overhead and accuracy of inprof next to gperftools and `perf record`
# (bench/overhead/README.md). One command:
#
#   bash bench/overhead/run.sh [--quick] [--reps N] [--build-dir DIR] [--output FILE]
#                              [--workloads cpu-1,idle-1000] [--profilers inprof,perf] [--keep]
#
# As root, installs the Debian packages it needs when they are missing. Builds
# only the workload targets in DIR (default build-overhead, or
# $OVERHEAD_BUILD_DIR), then runs bench/overhead/overhead.py, which writes
# bench/overhead/results.md (with --quick: DIR/overhead-quick.md) and prints it.
set -euo pipefail
cd "$(dirname "$0")/../.."
command_line="bash bench/overhead/run.sh${*:+ $*}"

build=${OVERHEAD_BUILD_DIR:-build-overhead}
args=()
while (($#)); do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --build-dir=*) build=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

# The build's own packages, gperftools' libprofiler, perf, GNU time, Go (for
# reading profiles by hand with go tool pprof).
packages=(g++ pkg-config meson ninja-build python3 libabsl-dev libbenchmark-dev zlib1g-dev
          libprotobuf-dev protobuf-compiler libdw-dev libcurl4-openssl-dev
          libgoogle-perftools-dev linux-perf golang-go time)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -eq 0 ]; then
    echo "overhead: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  else
    echo "overhead: not root, not installing ${missing[*]}; missing peers are reported as unavailable" >&2
  fi
fi

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dtests=disabled -Dbenchmarks=enabled >/dev/null
elif pkg-config --exists libprofiler && ! grep -q 'overhead_workload_gperftools:' "$build/build.ninja"; then
  meson setup --reconfigure "$build" >/dev/null  # libprofiler was installed after setup
fi
targets=(bench/overhead/overhead_workload bench/overhead/overhead_workload_dropin)
grep -q 'overhead_workload_gperftools:' "$build/build.ninja" &&
  targets+=(bench/overhead/overhead_workload_gperftools)
ninja -C "$build" "${targets[@]}" >&2

exec python3 bench/overhead/overhead.py --build-dir "$build" --command "$command_line" \
  ${args[@]+"${args[@]}"}
