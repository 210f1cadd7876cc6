#!/usr/bin/env python3
"""Lists every test a stage of the test command skipped, with its reason,
then every test that failed, with what it printed about the failure.

    scripts/test_report.py skipped|failed STAGE=BUILD_DIR...

Reads each BUILD_DIR/meson-logs/testlog.json (what `meson test` wrote for
that stage) and prints, per skipped case, the stage, the test case and the
reason it gave: a GoogleTest case that called GTEST_SKIP (its "Skipped"
message, up to the "[  SKIPPED ]" line) or a whole test that exited 77 (its
last line of output). Then the count. scripts/quickstart.sh test ends with
this list, so that a skip is something the run says, never something that
passes unseen (docs/test_command.md says which skips are expected where).

The failures come last, because a CI service often keeps only the end of a
long log: each failed GoogleTest case with its "Failure" lines (bounded),
or the last lines of a test that failed, timed out or crashed outside one.

Exit status 0 whatever was skipped or failed (the suites' own exit status
says that); 1 when a log is missing or unreadable.
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


FAILURE = re.compile(r"^\S+:\d+: Failure$")
FAILED = re.compile(r"^\[  FAILED  \] (\S+) \(\d+ ms\)$")
FAILED_RESULTS = ("FAIL", "TIMEOUT", "ERROR", "UNEXPECTEDPASS")
MAX_LINES = 12  # per failed case: a report that fits a CI excerpt


def gtest_failures(stdout):
    """(case, lines) for each failed GoogleTest case in one binary's output:
    its "file:line: Failure" blocks, at most MAX_LINES lines."""
    out = []
    current, lines, kept = None, [], False
    for line in stdout.splitlines():
        m = RUN.match(line)
        if m:
            current, lines, kept = m.group(1), [], False
            continue
        m = FAILED.match(line)
        if m and m.group(1) == current:
            out.append((current, lines))
            current = None
            continue
        if current is None:
            continue
        if FAILURE.match(line):
            kept = True
        if kept and len(lines) < MAX_LINES:
            lines.append(line.rstrip())
    return out


def failures(stage, entry):
    """(name, lines) for a test meson saw fail: its failed cases, or the
    end of its output when none is named (a crash, a timeout, a script)."""
    name = entry.get("name", "?").split(" / ")[-1]
    stdout = entry.get("stdout") or ""
    cases = gtest_failures(stdout)
    if cases:
        return [(f"[{stage}] {name}: {case}", lines) for case, lines in cases]
    tail = [l.rstrip() for l in stdout.splitlines() if l.strip()][-MAX_LINES:]
    result = entry.get("result", "?")
    code = entry.get("returncode")
    return [(f"[{stage}] {name} ({result}, exit code {code})", tail)]


def main(argv):
    if not argv or argv[0] not in ("skipped", "failed"):
        print("usage: test_report.py skipped|failed STAGE=BUILD_DIR...", file=sys.stderr)
        return 2
    what, argv = argv[0], argv[1:]
    rows, failed, status = [], [], 0
    for arg in argv:
        stage, _, build = arg.partition("=")
        log = os.path.join(build, "meson-logs", "testlog.json")
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                entries = [json.loads(l) for l in f if l.strip()]
        except (OSError, ValueError) as e:
            print(f"test_report: {log}: {e}", file=sys.stderr)
            status = 1
            continue
        for e in entries:
            if e.get("result") in FAILED_RESULTS:
                failed.extend(failures(stage, e))
            name = e.get("name", "?").split(" / ")[-1]
            stdout = e.get("stdout") or ""
            if e.get("result") == "SKIP":
                last = [l.strip() for l in stdout.splitlines() if l.strip()]
                rows.append((stage, name, last[-1] if last else "exited 77"))
                continue
            for case, reason in gtest_skips(stdout):
                rows.append((stage, f"{name}: {case}", reason))
    if what == "skipped":
        print(f"skipped tests: {len(rows)}")
        for stage, case, reason in rows:
            print(f"  [{stage}] {case}\n      {reason}")
    elif failed:
        print(f"failed tests: {len(failed)}")
        for title, lines in failed:
            print(f"  {title}")
            for l in lines:
                print(f"      {l}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
