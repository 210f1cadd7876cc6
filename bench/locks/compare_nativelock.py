#!/usr/bin/env python3
# Compares inprof's lock-wait profile with async-profiler's native lock profiling
# (its `nativelock` event: pthread_mutex_lock / pthread_rwlock_{rd,wr}lock hooked through
# the PLT, a wait sampled whenever the waits' running total overflows the threshold) on
# bench/locks/lock_sites, against the truth that lock_sites counts itself in the same run.
#
#   python3 bench/locks/compare_nativelock.py LIBASYNCPROFILER_SO LOCK_SITES \
#       [--rounds 3] [--scale 1] [--raw]
#
# e.g. python3 bench/locks/compare_nativelock.py \
#        /work/asprof-src/build/lib/libasyncProfiler.so build/bench/lock_sites
#
# Each round runs, alternating: lock_sites none; lock_sites inprof (INPROF_LOCK_PERIOD=1ms);
# lock_sites none under async-profiler with nativelock (default threshold, 10us), nativelock=1ms
# (inprof's default period) and nativelock=0 (every wait); the first round also runs inprof with
# INPROF_LOCK_PERIOD=1us (every wait). async-profiler is LD_PRELOADed and started with
#   ASPROF_COMMAND=start,nativelock[=T],traces=1000,file=OUT.txt
# whose text output gives, per stack, the total wait (ns) and the number of samples; a site's
# recorded contentions and delay are the sums over the stacks that have a frame naming the site
# (as lock_sites does for inprof's profile). Prints markdown tables: per mode and site, the
# truth, the profile and profile/truth (sums over the rounds; per-run ratio range), then wall
# and process CPU (lock_sites' own getrusage before exit; and the child's rusage at exit, which
# includes async-profiler's dump) against the unprofiled runs. Python 3 stdlib only.
import argparse
import os
import re
import subprocess
import sys
import tempfile

SITES = ["SiteSpinShort", "SiteSpinLong", "SiteSleep", "SiteWriter"]
SITE_RE = re.compile(r"^SITE site=(\w+) truth_contentions=(\d+) truth_delay_ms=([\d.]+)"
                     r"(?: profile_contentions=(\d+) profile_delay_ms=([\d.]+))?")
RESULT_RE = re.compile(r"^RESULT mode=\w+ wall_ms=(\d+) process_cpu_ms=(\d+)")
TRACE_RE = re.compile(r"^--- (\d+) ns \([^)]*\), (\d+) samples?$")
FRAME_RE = re.compile(r"^\s+\[\s*\d+\] (.*)$")

# name, lock_sites mode, INPROF_LOCK_PERIOD, async-profiler nativelock option, first round only
MODES = [
    ("none", "none", None, None, False),
    ("inprof 1ms", "inprof", "1ms", None, False),
    ("asprof nativelock (10us)", "none", None, "nativelock", False),
    ("asprof nativelock=1ms", "none", None, "nativelock=1ms", False),
    ("asprof nativelock=0", "none", None, "nativelock=0", False),
    ("inprof 1us", "inprof", "1us", None, True),
]


def parse_asprof_traces(path):
    """Per site: [samples, total ns] summed over the stacks that name the site."""
    sums = {s: [0, 0] for s in SITES}
    other = [0, 0]
    block = None  # [ns, samples, frames]

    def flush():
        if block is None:
            return
        for site in SITES:
            if any(site in f for f in block[2]):
                sums[site][0] += block[1]
                sums[site][1] += block[0]
                return
        other[0] += block[1]
        other[1] += block[0]

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = TRACE_RE.match(line)
            if m:
                flush()
                block = [int(m.group(1)), int(m.group(2)), []]
                continue
            m = FRAME_RE.match(line)
            if m and block is not None:
                block[2].append(m.group(1))
                continue
            flush()
            block = None
    flush()
    return sums, other


def run_once(lib, binary, scale, mode, workdir, index):
    name, arg, period, nativelock, _ = mode
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "ASPROF_COMMAND", "INPROF_LOCK_PERIOD", "INPROF_OUTPUT"):
        env.pop(k, None)
    out = None
    if period:
        env["INPROF_LOCK_PERIOD"] = period
        env["INPROF_OUTPUT"] = os.path.join(workdir, "inprof-%d.pb.gz" % index)
    if nativelock:
        out = os.path.join(workdir, "asprof-%d.txt" % index)
        env["LD_PRELOAD"] = lib
        env["ASPROF_COMMAND"] = "start,%s,traces=1000,file=%s" % (nativelock, out)
    proc = subprocess.Popen([binary, arg, str(scale)], env=env, cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit("%s failed (%d):\n%s%s" % (name, proc.returncode, stdout, stderr))
    r = {"mode": name, "sites": {}, "child_cpu_ms": (usage.ru_utime + usage.ru_stime) * 1e3}
    for line in stdout.splitlines():
        m = SITE_RE.match(line)
        if m:
            site = {"truth_c": int(m.group(2)), "truth_d": float(m.group(3))}
            if m.group(4) is not None:
                site["prof_c"] = int(m.group(4))
                site["prof_d"] = float(m.group(5))
            r["sites"][m.group(1)] = site
        m = RESULT_RE.match(line)
        if m:
            r["wall_ms"], r["cpu_ms"] = int(m.group(1)), int(m.group(2))
    if out:
        if not os.path.exists(out):
            sys.exit("%s: no async-profiler output %s\n%s%s" % (name, out, stdout, stderr))
        sums, other = parse_asprof_traces(out)
        for s in SITES:
            r["sites"][s]["prof_c"] = sums[s][0]
            r["sites"][s]["prof_d"] = sums[s][1] / 1e6
        r["other"] = (other[0], other[1] / 1e6)
    if "wall_ms" not in r or len(r["sites"]) != len(SITES):
        sys.exit("%s: unexpected output:\n%s%s" % (name, stdout, stderr))
    return r


def ratio(a, b):
    return "-" if b == 0 else "%.3f" % (a / b)


def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return "%.2f-%.2f" % (min(values), max(values))


def main():
    ap = argparse.ArgumentParser(description="lock_sites: inprof vs async-profiler nativelock")
    ap.add_argument("lib", help="path to libasyncProfiler.so")
    ap.add_argument("binary", help="path to the lock_sites binary")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--raw", action="store_true", help="also print every run")
    a = ap.parse_args()
    lib, binary = os.path.abspath(a.lib), os.path.abspath(a.binary)
    runs = []
    with tempfile.TemporaryDirectory(prefix="nativelock-") as workdir:
        for rnd in range(a.rounds):
            for mode in MODES:
                if mode[4] and rnd > 0:
                    continue
                r = run_once(lib, binary, a.scale, mode, workdir, len(runs))
                r["round"] = rnd + 1
                runs.append(r)
                print("round %d %-26s wall_ms=%d process_cpu_ms=%d" %
                      (rnd + 1, r["mode"], r["wall_ms"], r["cpu_ms"]), file=sys.stderr)
    if a.raw:
        print("| round | mode | site | truth cont | prof cont | truth delay ms | prof delay ms |")
        print("|---|---|---|---:|---:|---:|---:|")
        for r in runs:
            for s in SITES:
                x = r["sites"][s]
                print("| %d | %s | %s | %d | %s | %.1f | %s |" % (
                    r["round"], r["mode"], s, x["truth_c"], x.get("prof_c", "-"),
                    x["truth_d"], "%.1f" % x["prof_d"] if "prof_d" in x else "-"))
            if "other" in r:
                print("| %d | %s | (other stacks) | - | %d | - | %.1f |" %
                      (r["round"], r["mode"], r["other"][0], r["other"][1]))
        print()
    print("| mode | site | truth cont | prof cont | cont ratio (runs) | truth delay ms "
          "| prof delay ms | delay ratio (runs) |")
    print("|---|---|---:|---:|---|---:|---:|---|")
    for mode in MODES[1:]:
        mr = [r for r in runs if r["mode"] == mode[0]]
        for s in SITES:
            xs = [r["sites"][s] for r in mr]
            tc, pc = sum(x["truth_c"] for x in xs), sum(x["prof_c"] for x in xs)
            td, pd = sum(x["truth_d"] for x in xs), sum(x["prof_d"] for x in xs)
            rc = span([x["prof_c"] / x["truth_c"] if x["truth_c"] else None for x in xs])
            rd = span([x["prof_d"] / x["truth_d"] if x["truth_d"] else None for x in xs])
            print("| %s (%d) | %s | %d | %d | %s (%s) | %.1f | %.1f | %s (%s) |" % (
                mode[0], len(mr), s, tc, pc, ratio(pc, tc), rc, td, pd, ratio(pd, td), rd))
    print()
    base = [r for r in runs if r["mode"] == "none"]
    base_cpu = sum(r["cpu_ms"] for r in base) / len(base)
    base_child = sum(r["child_cpu_ms"] for r in base) / len(base)
    print("| mode | runs | wall_ms (each) | process_cpu_ms (each) | mean CPU / none "
          "| child CPU at exit / none |")
    print("|---|---:|---|---|---:|---:|")
    for mode in MODES:
        mr = [r for r in runs if r["mode"] == mode[0]]
        cpu = sum(r["cpu_ms"] for r in mr) / len(mr)
        child = sum(r["child_cpu_ms"] for r in mr) / len(mr)
        print("| %s | %d | %s | %s | %.3f | %.3f |" % (
            mode[0], len(mr), " ".join(str(r["wall_ms"]) for r in mr),
            " ".join(str(r["cpu_ms"]) for r in mr), cpu / base_cpu, child / base_child))


if __name__ == "__main__":
    main()
