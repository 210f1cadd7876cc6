#!/usr/bin/env python3
"""Checks that no file of the library outgrows what one reader takes in.

A header under include/ or src/ holds at most 500 lines and a source under
src/ at most 800 (issue 61's finish line: a file past them is split along
its parts, as pprof_reader.cc's rewrites and pipeline.cc's requests were).
The files still over them are named below with the size they may not
exceed, each with why: one that grows fails, one that shrinks under the
limit must leave the list (so the list only gets shorter).

  python3 scripts/check_sizes.py [REPO]   exit 0: clean; 1: each file over
"""
import os
import re
import sys

HEADER_LIMIT = 500
SOURCE_LIMIT = 800

# Known debts, at most these many lines, and why they are there.
KNOWN = {}

# The template's house rules (issue 61): the per-provider fan-out is the
# provider table's (internal/provider_table.h), looped over at run time,
# not a fold over an index_sequence in profiler.h; ProfilerBase reaches
# into the template through at most six virtual hooks.
HOUSE = [
    # (file, pattern, most lines that may match, what to do instead)
    ("include/inprof/profiler.h", r"index_sequence", 0,
     "loop over the provider table (ProfilerBase, profiler_providers.cc)"),
    ("include/inprof/internal/profiler_base.h", r"^\s*virtual ", 6,
     "add a ProviderOps or Shape::SlotOps entry instead of a hook"),
]


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = []
    for top in ("include", "src"):
        for root, _, files in os.walk(os.path.join(repo, top)):
            for name in files:
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, repo)
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = sum(1 for _ in f)
                limit = HEADER_LIMIT if name.endswith(".h") else SOURCE_LIMIT
                if rel in KNOWN:
                    if lines <= limit:
                        bad.append(f"{rel}: {lines} lines, under {limit}: take it off KNOWN")
                    elif lines > KNOWN[rel]:
                        bad.append(f"{rel}: {lines} lines, more than the {KNOWN[rel]} it may keep")
                elif lines > limit:
                    bad.append(f"{rel}: {lines} lines, more than {limit}: split it along its parts")
    for rel in KNOWN:
        if not os.path.exists(os.path.join(repo, rel)):
            bad.append(f"{rel}: named in KNOWN but gone: take it off")
    for rel, pattern, most, instead in HOUSE:
        path = os.path.join(repo, rel)
        if not os.path.exists(path):
            bad.append(f"{rel}: named in HOUSE but gone: take it off")
            continue
        with open(path, encoding="utf-8") as f:
            hits = sum(1 for line in f if re.search(pattern, line))
        if hits > most:
            bad.append(f"{rel}: {hits} lines match '{pattern}', at most {most}: {instead}")
    for line in bad:
        print(line)
    if not bad:
        print(f"every header within {HEADER_LIMIT} lines and every source within "
              f"{SOURCE_LIMIT}, but {len(KNOWN)} named debt(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
