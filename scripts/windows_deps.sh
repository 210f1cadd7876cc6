#!/usr/bin/env bash
# The Windows x64 cross toolchain and the libraries inprof's Windows build
# links, built once into a cache under the Windows build directory:
#
#   scripts/windows_deps.sh [DIR] [benchmark]
#                                     DIR defaults to build-windows; with
#                                     `benchmark`, Google Benchmark too
#
# Leaves:
#   DIR/prefix/                Abseil (Debian's source package), static, for
#                              x86_64-w64-mingw32, with pkg-config files: the
#                              prefix inprof's Windows build installs into,
#                              so that its inprof.pc finds what it requires
#   DIR/deps/prefix/           GoogleTest (Debian's libgtest-dev sources), for
#                              the tests only, and Google Benchmark (its source
#                              package) when asked, for bench/windows
#   DIR/cross-mingw64.ini      a Meson cross file: mingw-w64's posix-thread
#                              compilers, static runtime, pkg-config over the
#                              prefix and mingw-w64's zlib, Wine as the
#                              exe_wrapper (so `meson test` runs the .exe's)
#
# A library already in the prefix is not built again (its stamp file says
# which source it came from); rm -rf DIR/deps to start over. Installs the
# Debian packages it needs when they are missing and adds a deb-src entry
# for `apt-get source abseil` (needs root or sudo for both).
set -euo pipefail
cd "$(dirname "$0")/.."

# source_package NAME: `apt-get source NAME` into $deps/src; on failure, one
# line with apt-get's own last error (a full disk, an unreachable mirror).
source_package() {
  local out
  mkdir -p "$deps/src"
  if ! out=$(cd "$deps/src" && apt-get source -qq "$1" 2>&1 >/dev/null); then
    echo "windows: 'apt-get source $1' failed in $deps/src: $(printf '%s\n' "$out" | grep -v '^$' | tail -1)" >&2
    exit 1
  fi
}

dir=${1:-build-windows}
with_benchmark=${2:-}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
deps=$dir/deps
prefix=$dir/prefix
test_prefix=$deps/prefix
jobs=$(nproc)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

packages=(g++-mingw-w64-x86-64-posix libz-mingw-w64-dev wine64 cmake dpkg-dev
          meson ninja-build pkg-config libgtest-dev libgmock-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "windows: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian 12 has no mingw-w64 build of Abseil: its source package, built here.
if ! compgen -G "$deps/src/abseil-[0-9]*/CMakeLists.txt" >/dev/null; then
  if ! apt-get indextargets --format '$(CREATED_BY)' 2>/dev/null | grep -q '^Sources$'; then
    echo "windows: adding a deb-src entry (/etc/apt/sources.list.d/inprof-deb-src.sources)"
    # The same archives as the binary entries, for source packages.
    uris=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -m1 'debian$' | cut -d' ' -f2)
    $sudo tee /etc/apt/sources.list.d/inprof-deb-src.sources >/dev/null <<EOF
Types: deb-src
URIs: ${uris:-http://deb.debian.org/debian}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    $sudo apt-get update -qq
  fi
  mkdir -p "$deps/src"
  source_package abseil
fi
absl_src=$(compgen -G "$deps/src/abseil-[0-9]*/CMakeLists.txt" | head -1 | xargs dirname)

cat >"$deps/toolchain.cmake" <<'EOF'
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(CMAKE_C_COMPILER x86_64-w64-mingw32-gcc-posix)
set(CMAKE_CXX_COMPILER x86_64-w64-mingw32-g++-posix)
set(CMAKE_RC_COMPILER x86_64-w64-mingw32-windres)
set(CMAKE_FIND_ROOT_PATH /usr/x86_64-w64-mingw32)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
EOF

# cmake_build NAME SOURCE_DIR PREFIX [CMAKE ARGS...]: configure, build and
# install into PREFIX unless the same source was installed there already.
cmake_build() {
  local name=$1 src=$2
  shift 2
  local into=$1
  shift
  local stamp="$into/.$name.stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$src" ]; then return; fi
  echo "windows: building $name for x86_64-w64-mingw32 ($src)"
  local start=$SECONDS
  cmake -S "$src" -B "$deps/build-$name" -G Ninja \
    -DCMAKE_TOOLCHAIN_FILE="$deps/toolchain.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$into" \
    -DCMAKE_CXX_STANDARD=20 -DCMAKE_CXX_STANDARD_REQUIRED=ON \
    -DBUILD_SHARED_LIBS=OFF "$@" >"$deps/build-$name.log" 2>&1 &&
    cmake --build "$deps/build-$name" -j "$jobs" >>"$deps/build-$name.log" 2>&1 &&
    cmake --install "$deps/build-$name" >>"$deps/build-$name.log" 2>&1 || {
      echo "windows: building $name failed; see $deps/build-$name.log" >&2
      tail -20 "$deps/build-$name.log" >&2
      exit 1
    }
  echo "$src" >"$stamp"
  echo "windows: $name built in $((SECONDS - start)) s"
}

mkdir -p "$prefix" "$test_prefix"
# At -O1, not Release's -O3: compiling Abseil is most of the Windows
# stage's first run (223 s of ~345 s on two cores at -O3), and the suite and
# the demo need it correct, not fast.
cmake_build abseil "$absl_src" "$prefix" -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_TESTING=OFF \
  -DABSL_BUILD_TESTING=OFF -DABSL_ENABLE_INSTALL=ON -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG"
# Abseil's pkg-config files, as written for mingw-w64, do not link as they
# are: they wrap libraries in -Wl,--push-state,--as-needed / --pop-state
# pairs, which pkg-config deduplicates (ld then fails with "no state pushed
# before popping"); they name Windows libraries without -l, in quotes
# ("advapi32", "dbghelp", "bcrypt"); and they put those before the Abseil
# library that needs them, which a static link must not (undefined
# BCryptGenRandom). Each Libs: line becomes -L, the Abseil library, then
# the system libraries.
for pc in "$prefix"/lib/pkgconfig/absl_*.pc; do
  perl -i -pe '
    next unless s/^Libs:\s*//;
    s/-Wl,--(push-state,--as-needed|pop-state)//g;
    s/"?\b(advapi32|dbghelp|bcrypt)\b"?/-l$1/g;
    s/(^|\s)-l(advapi32|dbghelp|bcrypt)\b/$1-l$2/g;
    my @w = split " ";
    my @dirs = grep { /^-L/ } @w;
    my @absl = grep { /^-labsl_/ } @w;
    my @rest = grep { !/^-L/ && !/^-labsl_/ } @w;
    $_ = "Libs: " . join(" ", @dirs, @absl, @rest) . "\n";
  ' "$pc"
done
# GoogleTest at -O1 too: the tests need it correct, not fast.
cmake_build googletest /usr/src/googletest "$test_prefix" -DINSTALL_GTEST=ON -DBUILD_GMOCK=ON \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG"
if [ "$with_benchmark" = benchmark ]; then
  if ! compgen -G "$deps/src/benchmark-[0-9]*/CMakeLists.txt" >/dev/null; then
    source_package benchmark
  fi
  bench_src=$(compgen -G "$deps/src/benchmark-[0-9]*/CMakeLists.txt" | head -1 | xargs dirname)
  # Debian patched out the git version lookup; GIT_VERSION names the release.
  cmake_build benchmark "$bench_src" "$test_prefix" -DBENCHMARK_ENABLE_TESTING=OFF \
    -DGIT_VERSION="${bench_src##*benchmark-}" \
    -DBENCHMARK_ENABLE_GTEST_TESTS=OFF -DBENCHMARK_ENABLE_WERROR=OFF
  # shlwapi (Benchmark's CPU information) by name, after the library; and
  # the static library's define (its headers otherwise declare dllimport).
  grep -q -- '-lshlwapi' "$test_prefix/lib/pkgconfig/benchmark.pc" ||
    sed -i -E -e 's/^(Libs:.*)$/\1 -lshlwapi/' \
      -e 's/^(Cflags:.*)$/\1 -DBENCHMARK_STATIC_DEFINE/' "$test_prefix/lib/pkgconfig/benchmark.pc"
fi

cat >"$dir/cross-mingw64.ini" <<EOF
# Written by scripts/windows_deps.sh.
[binaries]
c = 'x86_64-w64-mingw32-gcc-posix'
cpp = 'x86_64-w64-mingw32-g++-posix'
ar = 'x86_64-w64-mingw32-ar'
strip = 'x86_64-w64-mingw32-strip'
windres = 'x86_64-w64-mingw32-windres'
# 'pkgconfig' is the name Debian 12's Meson (1.0) knows.
pkgconfig = 'pkg-config'
# Debian's wine64 package puts no wine64 on PATH.
exe_wrapper = '/usr/lib/wine/wine64'

[properties]
pkg_config_libdir = ['$prefix/lib/pkgconfig', '$test_prefix/lib/pkgconfig',
                     '/usr/x86_64-w64-mingw32/lib/pkgconfig']

[built-in options]
# One .exe with no DLL beside it: libgcc, libstdc++ and winpthreads linked in.
cpp_link_args = ['-static']
c_link_args = ['-static']

[host_machine]
system = 'windows'
cpu_family = 'x86_64'
cpu = 'x86_64'
endian = 'little'
EOF
echo "windows: toolchain ready: $dir/cross-mingw64.ini (Abseil in $prefix, GoogleTest in $test_prefix)"
