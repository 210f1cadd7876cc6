#!/usr/bin/env python3
"""Lists every test a stage of the test command skipped, with its reason.

    scripts/skipped_tests.py STAGE=BUILD_DIR...

Reads each BUILD_DIR/meson-logs/testlog.json (what `meson test` wrote for
that stage) and prints, per skipped case, the stage, the test case and the
reason it gave: a GoogleTest case that called GTEST_SKIP (its "Skipped"
message, up to the "[  SKIPPED ]" line) or a whole test that exited 77 (its
last line of output). Then the count. scripts/quickstart.sh test ends with
this list, so that a skip is something the run says, never something that
passes unseen (docs/test_command.md says which skips are expected where).

Exit status 0 whatever was skipped; 1 when a log is missing or unreadable.
"""
import json
import os
import re
import sys

RUN = re.compile(r"^\[ RUN      \] (\S+)$")
SKIPPED = re.compile(r"^\[  SKIPPED \] (\S+) \(\d+ ms\)$")
WHERE = re.compile(r"^\S+:\d+: Skipped$")


def gtest_skips(stdout):
    """(case, reason) for each GTEST_SKIP in one binary's output."""
    out = []
    current, lines = None, []
    for line in stdout.splitlines():
        m = RUN.match(line)
        if m:
            current, lines = m.group(1), []
            continue
        m = SKIPPED.match(line)
        if m and m.group(1) == current:
            # The message follows "file:line: Skipped"; a test that failed
            # before its skip is a failure, not listed here.
            reason, seen = [], False
            for l in lines:
                if WHERE.match(l):
                    seen, reason = True, []
                elif seen and l.strip():
                    reason.append(l.strip())
            out.append((current, " ".join(reason) or "(no reason given)"))
            current = None
            continue
        if current is not None:
            lines.append(line)
    return out


def main(argv):
    rows, status = [], 0
    for arg in argv:
        stage, _, build = arg.partition("=")
        log = os.path.join(build, "meson-logs", "testlog.json")
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                entries = [json.loads(l) for l in f if l.strip()]
        except (OSError, ValueError) as e:
            print(f"skipped_tests: {log}: {e}", file=sys.stderr)
            status = 1
            continue
        for e in entries:
            name = e.get("name", "?").split(" / ")[-1]
            stdout = e.get("stdout") or ""
            if e.get("result") == "SKIP":
                last = [l.strip() for l in stdout.splitlines() if l.strip()]
                rows.append((stage, name, last[-1] if last else "exited 77"))
                continue
            for case, reason in gtest_skips(stdout):
                rows.append((stage, f"{name}: {case}", reason))
    print(f"skipped tests: {len(rows)}")
    for stage, case, reason in rows:
        print(f"  [{stage}] {case}\n      {reason}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
