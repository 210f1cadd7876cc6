#!/usr/bin/env python3
"""Precompiles the tests' shared header (tests/pch/inprof_test_pch.h).

Usage: build_pch.py COMPILE_COMMANDS REFERENCE_SOURCE HEADER OUT_HEADER DEPFILE
       [KEY...]

Meson builds a precompiled header per target, and every test is its own
target with one source: no saving. This builds one for all of them, with
the flags meson compiles REFERENCE_SOURCE (a test source that uses
test_util_dep, as every source given the header does) with, read from
COMPILE_COMMANDS. It copies HEADER to OUT_HEADER and writes OUT_HEADER.gch
beside it, where GCC looks when a source is compiled with
`-include OUT_HEADER`. A source whose flags differ (another -O, a
sanitizer) cannot use the .gch: GCC then parses OUT_HEADER itself, slower
but the same program (tests/meson.build passes -Wno-invalid-pch).

KEY...: the options that change the tests' flags; unused here, they are on
the command line so that Ninja builds the header again when one changes.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys


def main() -> int:
    compdb, reference, header, out_header, depfile = sys.argv[1:6]
    with open(compdb, encoding="utf-8") as f:
        entries = json.load(f)
    reference = os.path.abspath(reference)
    entry = None
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if path == reference:
            entry = e
            break
    if entry is None:
        print(f"build_pch: {reference} is not in {compdb}", file=sys.stderr)
        return 1
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    # ccache does not cache a precompiled header's build; run the compiler.
    while args and os.path.basename(args[0]).startswith("ccache"):
        args = args[1:]
    out_header = os.path.abspath(out_header)
    cmd = []
    skip = 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-o", "-MQ", "-MF", "-MT", "-include"):
            skip = 1
            continue
        if a in ("-c", "-MD", "-MMD") or a == entry["file"]:
            continue
        cmd.append(a)
    shutil.copyfile(header, out_header)
    cmd += ["-MD", "-MF", os.path.abspath(depfile), "-MQ", out_header + ".gch",
            "-x", "c++-header", out_header, "-o", out_header + ".gch"]
    return subprocess.run(cmd, cwd=entry["directory"]).returncode


if __name__ == "__main__":
    sys.exit(main())
