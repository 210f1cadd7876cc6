#!/usr/bin/env bash
# Regenerates the binary seeds checked in next to this script from
# seeds/src/. Run from anywhere; needs gcc, protoc, gzip, strip, objcopy.
set -euo pipefail
cd "$(dirname "$0")"
# symbolizer: a small shared object with DWARF (plain and compressed
# sections) and the same without debug information.
gcc -shared -fPIC -O1 -g -fno-omit-frame-pointer -nostdlib \
    -Wl,--build-id -Wl,-z,max-page-size=0x1000 -Wl,-z,noseparate-code \
    -o symbolizer/tiny-debug.so src/tiny.c
objcopy --compress-debug-sections=zlib symbolizer/tiny-debug.so \
    symbolizer/tiny-zdebug.so
strip -o symbolizer/tiny-stripped.so symbolizer/tiny-debug.so
# cfi_table: the same object with .eh_frame only, and with .debug_frame only.
mkdir -p cfi_table
strip -o cfi_table/tiny-eh-frame.so symbolizer/tiny-debug.so
gcc -shared -fPIC -O1 -g -fno-asynchronous-unwind-tables -nostdlib \
    -Wl,--build-id -Wl,-z,max-page-size=0x1000 -Wl,-z,noseparate-code \
    -o cfi_table/tiny-debug-frame.so src/tiny.c
# pprof_reader: the text profile encoded, raw and gzip-compressed (not *.pb.gz: .gitignore)
protoc --proto_path=../../proto --encode=perftools.profiles.Profile \
    profile.proto < src/profile.textproto > pprof_reader/profile.pb
gzip -9 -n -c pprof_reader/profile.pb > pprof_reader/profile-gzip.bin
