#!/usr/bin/env python3
"""The tests a sanitizer stage runs, and the ninja targets they need.

  test_targets.py BUILD names   [--no-suite S]... [--skip NAME]...
  test_targets.py BUILD targets [--no-suite S]... [--skip NAME]...

`names` prints the selected tests' names (for `meson test NAME...`),
`targets` the files ninja must build for them: each test's program and
what it depends on (`depends :` in tests/meson.build), read from
`meson introspect`. scripts/sanitizers.sh builds only these, not the
tools, examples and tests a stage does not run.
"""
import argparse
import json
import os
import subprocess
import sys


def introspect(build, what):
    out = subprocess.run(["meson", "introspect", what, build], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("mode", choices=["names", "targets"])
    parser.add_argument("--no-suite", action="append", default=[])
    parser.add_argument("--skip", action="append", default=[])
    args = parser.parse_args()

    build = os.path.abspath(args.build)
    tests = []
    for test in introspect(build, "--tests"):
        suites = {s.split(":", 1)[-1] for s in test["suite"]}
        if suites & set(args.no_suite) or test["name"] in args.skip:
            continue
        tests.append(test)
    unknown = set(args.skip) - {t["name"] for t in introspect(build, "--tests")}
    if unknown:
        sys.exit("test_targets.py: no test named " + ", ".join(sorted(unknown)))

    if args.mode == "names":
        print("\n".join(t["name"] for t in tests))
        return
    files = {}
    for target in introspect(build, "--targets"):
        files[target["id"]] = target["filename"]
    wanted = set()
    for test in tests:
        for path in [test["cmd"][0]] + [f for d in test["depends"] for f in files.get(d, [])]:
            if path.startswith(build + os.sep):
                wanted.add(os.path.relpath(path, build))
    print("\n".join(sorted(wanted)))


if __name__ == "__main__":
    main()
