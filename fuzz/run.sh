#!/usr/bin/env bash
# Builds inprof's libFuzzer targets with clang (ASan + UBSan + libFuzzer)
# and runs each for a bounded time from the seed corpus in fuzz/seeds/.
#
#   fuzz/run.sh [BUILD_DIR]     default BUILD_DIR: build-fuzz
#
# Environment:
#   FUZZ_SECONDS   time per target (default 20; -max_total_time)
#   FUZZ_TARGETS   space-separated subset (default: all)
#   FUZZ_STEP      build (compile and link only), run (only run what is
#                  built) or all (default)
#   FUZZ_JOBS      targets run at once (default 2: the machine's two cores)
#   FUZZ_OPT       the targets' optimization (default -O1; the test command
#                  builds at -O0: its 5 s a target replay the seeds and
#                  search briefly, and -O0 compiles in half the time)
#   CXX            clang++ to use (default: clang++)
#
# Targets, one per parser of untrusted input:
#   options_fuzzer        INPROF_* environment (Options::FromLookup)
#   pprof_reader_fuzzer   pprof files, gzip or raw (DecodePprof)
#   pprof_writer_fuzzer   the pprof encoder, round trip through the reader
#   symbolizer_fuzzer     ELF/DWARF files (Symbolizer::SymbolizeFile), and the
#                         same bytes as a line program (internal::LineTable)
#   cfi_table_fuzzer      ELF call-frame information (BuildCfiTableFromFile)
#   debug_endpoint_fuzzer the live endpoint's requests and INPROF_HTTP_ADDR
#   agent_protocol_fuzzer what `inprof agent` reads from a connecting process
#                         (DecodeAgentMessage) and INPROF_AGENT_SOCKET
#   agent_stream_fuzzer   what `inprof agent` reads from a profiled process's
#                         shared memory (AgentRingReader, DecodeAgentOp,
#                         ReadAgentThreadArea)
#   got_scan_fuzzer       a loaded object's dynamic section, relocations and
#                         symbols, as the allocation hooks read them
#                         (internal::ScanGotSlots)
# Each is linked with only the sources it needs (compiled with coverage
# instrumentation) and the Debian libraries (GCC-built, libstdc++ ABI).
# New inputs go to BUILD_DIR/corpus/<target>; crashes to
# BUILD_DIR/artifacts/. Needs: clang, libclang-rt-14-dev (libFuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-20}
step=${FUZZ_STEP:-all}
jobs=${FUZZ_JOBS:-2}
cxx=${CXX:-clang++}
targets=${FUZZ_TARGETS:-options_fuzzer pprof_reader_fuzzer pprof_writer_fuzzer symbolizer_fuzzer cfi_table_fuzzer debug_endpoint_fuzzer agent_protocol_fuzzer agent_stream_fuzzer got_scan_fuzzer}

opt=${FUZZ_OPT:--O1}
case $opt in -O0|-O1|-O2|-O3) ;; *) echo "fuzz: FUZZ_OPT='$opt': expected -O0, -O1, -O2 or -O3" >&2; exit 2 ;; esac
# Objects per optimization level: a change of FUZZ_OPT compiles again.
obj_dir=$out/obj$opt
mkdir -p "$out/corpus" "$out/artifacts"
# lld where it is installed (the test command installs it): GNU ld takes
# about 4x its CPU for these links.
link_args=""
command -v ld.lld >/dev/null && link_args="-fuse-ld=lld"

absl="absl_status absl_statusor absl_strings absl_str_format absl_time
      absl_flat_hash_map absl_hash absl_synchronization absl_random_random"
# Line tables only (-gline-tables-only): a crash's stack names file and line
# all the same, and the build takes 6% less CPU than with full -g.
# -I.: the private headers under src/ are included by their path from the
# repository root, as in the Meson build.
cflags="-std=c++20 $opt -gline-tables-only -fno-omit-frame-pointer -Iinclude -I.
        -fsanitize=address,undefined -fno-sanitize-recover=undefined
        $(pkg-config --cflags $absl zlib libdw)"
libs="$(pkg-config --libs $absl zlib libdw) -lpthread -ldl"

# name -> sources besides the target itself
declare -A sources=(
  [options_fuzzer]="src/base/options.cc src/base/log.cc src/base/addresses.cc"
  [pprof_reader_fuzzer]="src/export/pprof_reader.cc src/export/pprof_rewrite.cc"
  [pprof_writer_fuzzer]="src/export/pprof_writer.cc src/export/pprof_reader.cc src/symbolize/symbolizer_dwfl.cc src/symbolize/debug_files_dwfl.cc src/symbolize/elf_symbols_dwfl.cc src/symbolize/process_scan_linux.cc src/symbolize/line_table.cc src/symbolize/line_table_libdw.cc src/symbolize/process_maps_linux.cc src/base/log.cc src/base/platform_linux.cc src/base/owned_fd_linux.cc src/base/contained.cc"
  [symbolizer_fuzzer]="src/symbolize/symbolizer_dwfl.cc src/symbolize/debug_files_dwfl.cc src/symbolize/elf_symbols_dwfl.cc src/symbolize/process_scan_linux.cc src/symbolize/line_table.cc src/symbolize/line_table_libdw.cc src/symbolize/process_maps_linux.cc src/base/log.cc src/base/owned_fd_linux.cc src/base/contained.cc src/base/platform_linux.cc"
  [cfi_table_fuzzer]="src/unwind/cfi_table.cc src/unwind/cfi_table_libdw.cc src/unwind/cfi_table_direct_linux.cc src/unwind/cfi_interpreter.cc src/base/log.cc src/base/owned_fd_linux.cc src/base/contained.cc src/base/platform_linux.cc"
  [debug_endpoint_fuzzer]="src/serve/debug_endpoint.cc src/base/addresses.cc src/export/pprof_reader.cc src/symbolize/process_maps_linux.cc src/base/log.cc src/base/owned_fd_linux.cc src/base/contained.cc src/base/platform_linux.cc"
  [agent_protocol_fuzzer]="src/agent/agent_protocol.cc src/base/addresses.cc"
  [agent_stream_fuzzer]="src/agent/agent_stream.cc"
  [got_scan_fuzzer]="src/alloc/got_scan_linux.cc"
)

# Compile every needed source once, two at a time, with coverage for
# libFuzzer.
build_targets() {
  local compile_list=() t src obj objs
  mkdir -p "$obj_dir"
  for t in $targets; do
    for src in fuzz/$t.cc ${sources[$t]}; do
      obj="$obj_dir/$(echo "$src" | tr '/' '_').o"
      if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
        compile_list+=("$src|$obj|-fsanitize=fuzzer-no-link")
      fi
    done
  done
  if ((${#compile_list[@]})); then
    printf '%s\n' "${compile_list[@]}" | sort -u |
      CXX="$cxx" CFLAGS="$cflags" xargs -P 2 -I{} bash -c '
        IFS="|" read -r src obj cov <<< "{}"
        echo "fuzz: compiling $src"
        $CXX $CFLAGS $cov -c "$src" -o "$obj"' || return 1
  fi
  for t in $targets; do
    objs=""
    for src in fuzz/$t.cc ${sources[$t]}; do
      objs+=" $obj_dir/$(echo "$src" | tr '/' '_').o"
    done
    # shellcheck disable=SC2086
    $cxx -fsanitize=fuzzer,address,undefined $link_args $objs $libs -o "$out/$t" || return 1
  done
}

# run_target NAME: runs one target for `seconds`, its corpus first (every
# seed and every input kept from earlier runs is replayed before new ones
# are tried). Prints its result; false when it found a crash.
run_target() {
  local t=$1
  mkdir -p "$out/corpus/$t"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$out/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
         -max_len=65536 -print_final_stats=1 \
         -artifact_prefix="$out/artifacts/$t-" \
         "$out/corpus/$t" "fuzz/seeds/${t%_fuzzer}" \
         > "$out/$t.log" 2>&1; then
    echo "fuzz: $t FAILED; last lines of $out/$t.log:"
    tail -40 "$out/$t.log"
    return 1
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added" \
    "$out/$t.log" | sed "s/^/fuzz: $t /"
}

if [ "$step" != run ]; then
  build_targets || { echo "fuzz: building the targets failed" >&2; exit 1; }
fi
[ "$step" = build ] && exit 0

echo "fuzz: running $(echo $targets | wc -w) targets for ${seconds}s each, $jobs at a time"
status=0
pids=()
for t in $targets; do
  run_target "$t" &
  pids+=($!)
  if ((${#pids[@]} >= jobs)); then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
