#!/usr/bin/env python3
"""The live heap's peak per site, side by side (bench/alloc/peak_sites.cc).

    python3 bench/alloc/compare_peak.py BUILD_DIR [--runs N] [--scale S]
        [--old-cli PATH] [--period SIZE] [--out DIR]

Runs peak_sites N times (default 3) each way, interleaved:
  plain      peak_sites
  inprof     inprof run --alloc=SIZE -o FILE -- peak_sites (512KiB by default)
  inprof-old the same with PATH's inprof (--old-cli: a build without the
             peak tracking), for the CPU the tracking costs
  heaptrack  heaptrack -o FILE peak_sites (every call traced)

Per run: the process tree's CPU (user+sys, wait4) and wall time; per site,
the profile's peak (inprof: `go tool pprof -sample_index=peak_inuse_space`;
heaptrack: heaptrack_print's "peak" cost per stack) against the truth the
program prints. Prints medians; the 1-sd column is a 512 KiB sampler's
spread for the site's blocks at the peak.
"""
import argparse
import glob
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import site_truth  # noqa: E402

SITES = ["SiteA", "SiteB", "SiteC", "SiteE", "SiteF"]


def run_measured(cmd, env):
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)}: exit {os.waitstatus_to_exitcode(status)}\n"
                 f"{err.decode(errors='replace')}")
    return out.decode(), ru.ru_utime + ru.ru_stime, wall


def bernstein_bound(n, size, period, chance=1e-6):
    """How far a sampled estimate of n blocks of `size` bytes may stray from
    its truth, in bytes, with a chance of at most `chance` a side: each block
    sampled with p = 1 - exp(-size/period), weighing size/p (variance
    size^2 (1-p)/p, range size/p); Bernstein's inequality, as
    tests/util/stat_bounds.h computes it."""
    if n == 0:
        return 0.0
    p = -math.expm1(-size / period)
    variance = n * size * size * (1 - p) / p
    rng = size / p
    l = math.log(1 / chance)
    b = 2 * l * rng / 3
    return (b + math.sqrt(b * b + 8 * l * variance)) / 2


def parse_size(text):
    m = re.fullmatch(r"(\d+)\s*(B|K|KiB|KB|M|MiB|MB|G|GiB|GB)?", text.strip())
    if not m:
        sys.exit(f"--period={text}: expected a size such as 512KiB")
    unit = (m.group(2) or "B")[0]
    return int(m.group(1)) * {"B": 1, "K": 1024, "M": 1 << 20, "G": 1 << 30}[unit]


def pprof_peak(binary, profile):
    out = subprocess.run(
        ["go", "tool", "pprof", "-top", "-nodecount=100000", "-nodefraction=0",
         "-edgefraction=0", "-unit=byte", "-sample_index=peak_inuse_space", binary, profile],
        capture_output=True, text=True, check=True).stdout

    def cum(line):
        m = re.match(r"\s*[0-9.]+[A-Za-z]*\s+[0-9.]+%\s+[0-9.]+%\s+([0-9.]+)([A-Za-z]*)\s+"
                     r"[0-9.]+%", line)
        if not m:
            return None
        scale = {"": 1, "B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}.get(m.group(2), 1)
        return float(m.group(1)) * scale
    return site_truth.per_site(out.splitlines(), SITES, cum)


def heaptrack_peak(profile):
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as f:
        subprocess.run(["heaptrack_print", "-f", profile, "-F", f.name,
                        "--flamegraph-cost-type", "peak", "-p", "0", "-a", "0", "-T", "0"],
                       capture_output=True, check=True)
        lines = f.read().splitlines()

    def value(line):
        head, _, v = line.rpartition(" ")
        return float(v) if head else None
    return site_truth.per_site(lines, SITES, value)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", default="1")
    parser.add_argument("--period", default="512KiB")
    parser.add_argument("--old-cli", default=None)
    parser.add_argument("--only", default="plain,inprof,inprof-old,heaptrack")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    binary = os.path.abspath(os.path.join(args.build_dir, "bench", "peak_sites"))
    cli = os.path.abspath(os.path.join(args.build_dir, "src", "cli", "inprof"))
    out_dir = args.out or tempfile.mkdtemp(prefix="peak_sites.")
    os.makedirs(out_dir, exist_ok=True)
    wanted = [w for w in args.only.split(",") if w != "inprof-old" or args.old_cli]
    results = {w: [] for w in wanted}
    for run in range(args.runs):
        for name in wanted:
            env = dict(os.environ)
            cmd = [binary, args.scale]
            profile = None
            if name in ("inprof", "inprof-old"):
                profile = os.path.join(out_dir, f"{name}.{run}.pb.gz")
                which = cli if name == "inprof" else args.old_cli
                cmd = [which, "run", f"--alloc={args.period}", "-o", profile, "--"] + cmd
            elif name == "heaptrack":
                stem = os.path.join(out_dir, f"heaptrack.{run}")
                for old in glob.glob(stem + "*"):
                    os.remove(old)
                cmd = ["heaptrack", "-o", stem] + cmd
            stdout, cpu, wall = run_measured(cmd, env)
            truth = site_truth.parse_truth(stdout, SITES, "peak_sites")
            est = None
            if name == "inprof":
                est = pprof_peak(binary, profile)
            elif name == "heaptrack":
                files = glob.glob(stem + "*")
                if not files:
                    sys.exit(f"heaptrack wrote nothing at {stem}*")
                est = heaptrack_peak(files[0])
            results[name].append({"cpu": cpu, "wall": wall, "truth": truth, "est": est})
            print(f"run {run} {name}: cpu {cpu:.2f} s wall {wall:.2f} s", file=sys.stderr)

    print(f"\nMedians over {args.runs} runs (scale {args.scale}); profiles in {out_dir}\n")
    print("| run | CPU s | CPU / plain, run by run: median (range) | wall s |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cpu = statistics.median(r["cpu"] for r in runs)
        ratio = "-"
        if "plain" in results and name != "plain":
            rs = [r["cpu"] / p["cpu"] for r, p in zip(runs, results["plain"])]
            ratio = f"{statistics.median(rs):.3f} ({min(rs):.3f}..{max(rs):.3f})"
        print(f"| {name} | {cpu:.2f} | {ratio} | "
              f"{statistics.median(r['wall'] for r in runs):.2f} |")
    if "inprof" in results and "inprof-old" in results:
        rs = [n["cpu"] / o["cpu"] for n, o in zip(results["inprof"], results["inprof-old"])]
        print(f"\ninprof / inprof-old CPU, run by run: median {statistics.median(rs):.3f} "
              f"({min(rs):.3f}..{max(rs):.3f})")
    truth = results[next(iter(results))][0]["truth"]
    period = parse_size(args.period)
    # Each site's computed bound (1e-6 a side) and how many inprof runs
    # stayed within it. The peak's moment is the sampled total's highest,
    # which may hold a block that lived for a moment (SiteF): sites whose
    # truth is 0 are shown, not bounded.
    if "inprof" in results:
        print(f"\ninprof's peak per site against its bound at {args.period} (Bernstein, "
              "1e-6 a side):\n")
        print("| site | truth | bound | runs within |")
        print("|---|---|---|---|")
        for s in SITES:
            t = truth[s]
            if t["peak_bytes"] == 0:
                continue
            n = t["peak_objects"]
            bound = bernstein_bound(n, t["peak_bytes"] / n, period)
            within = sum(abs(r["est"][s] - t["peak_bytes"]) <= bound for r in results["inprof"])
            print(f"| {s} | {t['peak_bytes'] / 1e6:.1f} MB | +-{bound / 1e6:.1f} MB "
                  f"({bound / t['peak_bytes'] * 100:.0f}%) | {within} of "
                  f"{len(results['inprof'])} |")
    print("\n| site | truth at the peak | blocks | 1 sd of a 512 KiB sampler | "
          + " | ".join(f"{n}: estimate / truth - 1 (median, range)" for n, r in results.items()
                       if r[0]["est"] is not None) + " |")
    print("|---|---|---|---|" + "---|" * sum(1 for r in results.values()
                                             if r[0]["est"] is not None))
    for s in SITES:
        t = truth[s]
        n = t["peak_objects"]
        if n > 0:
            p = -math.expm1(-(t["peak_bytes"] / n) / 524288)
            sd = f"{math.sqrt((1 - p) / (n * p)) * 100:.1f}%"
        else:
            sd = "-"
        cells = []
        for name, runs in results.items():
            if runs[0]["est"] is None:
                continue
            if t["peak_bytes"] == 0:
                vals = [r["est"][s] for r in runs]
                cells.append(f"{statistics.median(vals) / 1e6:.2f} MB for 0")
            else:
                errs = [r["est"][s] / t["peak_bytes"] - 1 for r in runs]
                cells.append(f"{statistics.median(errs) * 100:+.1f}% "
                             f"({min(errs) * 100:+.1f}..{max(errs) * 100:+.1f})")
        print(f"| {s} | {t['peak_bytes'] / 1e6:.1f} MB | {n} | {sd} | " + " | ".join(cells)
              + " |")


if __name__ == "__main__":
    main()
