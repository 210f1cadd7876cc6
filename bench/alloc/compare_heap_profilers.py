#!/usr/bin/env python3
"""Heap profilers side by side on one whole program (bench/alloc/alloc_sites.cc).

    python3 bench/alloc/compare_heap_profilers.py BUILD_DIR [--runs N] [--out DIR]

Runs alloc_sites N times (default 3) each way, interleaved:
  plain      alloc_sites none
  inprof     alloc_sites inprof (AllocationProvider, 512 KiB mean period)
  inprof-noalloc  the same with INPROF_ALLOC_PERIOD=0: the Profiler and its
             CPU provider without the allocation provider, to tell their costs apart
  jemalloc   alloc_sites none with libjemalloc.so.2 preloaded and
             MALLOC_CONF=prof:true,prof_accum:true,lg_prof_sample:19,prof_final:true
             (2^19 = 512 KiB, the same mean; prof_accum keeps allocated
             totals, prof_final dumps at exit, with the kept blocks live)
  jemalloc-noprof  jemalloc preloaded, profiling off: the allocator swap alone
             (jemalloc's cost is against this row, not plain's glibc malloc)
  heaptrack  heaptrack -o FILE alloc_sites none (every call traced)

Per run: the process tree's CPU (user+sys) and peak RSS from wait4() (for
heaptrack, the larger of the program and heaptrack_interpret), and the wall
time; per site, what the profile says was allocated (bytes, objects) and
live at the end (bytes), against the truth the program prints. Reading the
profiles (go tool pprof, jeprof, heaptrack_print) happens after the run and
is not counted. Prints the medians over the N runs.
"""
import argparse
import glob
import json
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

SITES = ["SiteA48B", "SiteB1KiB", "SiteC16KiB", "SiteD256KiB", "SiteE4MiB",
         "SiteFReallocGrow", "SiteGReallocarray", "SiteHNewArray48"]
PROFILERS = ["plain", "inprof", "inprof-noalloc", "jemalloc", "jemalloc-noprof", "heaptrack"]
JEMALLOC_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
]


def run_measured(cmd, env):
    """Runs cmd; returns (stdout, cpu_s, wall_s, maxrss_kib) of its process tree."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # wait4 on our child: its rusage includes the descendants it waited for.
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}\n{err.decode(errors='replace')}")
    return out.decode(), ru.ru_utime + ru.ru_stime, wall, ru.ru_maxrss


def pprof_top(binary, profile, index):
    """cum per site from `go tool pprof -top` (the site is the leaf: flat is the same)."""
    out = subprocess.run(
        ["go", "tool", "pprof", "-top", "-nodecount=100000", "-nodefraction=0",
         "-edgefraction=0", "-unit=byte" if "space" in index
         else "-unit=minimum", "-sample_index=" + index, binary, profile],
        capture_output=True, text=True, check=True).stdout

    def cum(line):
        m = re.match(r"\s*[0-9.]+[A-Za-z]*\s+[0-9.]+%\s+[0-9.]+%\s+([0-9.]+)([A-Za-z]*)\s+[0-9.]+%",
                     line)
        if not m:
            return None
        return float(m.group(1)) * unit_scale(m.group(2))
    return site_truth.per_site(out.splitlines(), SITES, cum)


def unit_scale(unit):
    return {"": 1, "B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "k": 1e3, "M": 1e6}.get(unit, 1)


def jeprof_top(binary, profile, flag):
    """Values per site from `jeprof --text` (bytes with --show_bytes)."""
    out = subprocess.run(["jeprof", "--text", "--show_bytes", flag, binary, profile],
                         capture_output=True, text=True, check=True).stdout

    # cum, not flat: jeprof names operator new's frame in libjemalloc
    # "malloc_usable_size" and puts SiteA48B's bytes there; the sites
    # are never on each other's stacks, so a site's cum is its own.
    def cum(line):
        m = re.match(r"\s*[0-9.]+\s+[0-9.]+%\s+[0-9.]+%\s+([0-9.]+)\s+[0-9.]+%", line)
        return float(m.group(1)) if m else None
    return site_truth.per_site(out.splitlines(), SITES, cum)


def heaptrack_stacks(profile, cost):
    """Per site sums of a heaptrack_print flame-graph file (cost per stack).
    heaptrack_print 1.4's costs are allocations, temporary, leaked and peak:
    it prints no bytes allocated per backtrace, so that column is n/a."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as f:
        subprocess.run(["heaptrack_print", "-f", profile, "-F", f.name,
                        "--flamegraph-cost-type", cost, "-p", "0", "-a", "0", "-T", "0"],
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
    parser.add_argument("--out", default=None, help="where profiles go (default: a temp dir)")
    parser.add_argument("--only", default=",".join(PROFILERS))
    args = parser.parse_args()
    binary = os.path.abspath(os.path.join(args.build_dir, "bench", "alloc_sites"))
    out_dir = args.out or tempfile.mkdtemp(prefix="heap_profilers.")
    os.makedirs(out_dir, exist_ok=True)
    jemalloc = next((p for p in JEMALLOC_CANDIDATES if os.path.exists(p)), None)
    wanted = args.only.split(",")
    if jemalloc is None and any(w.startswith("jemalloc") for w in wanted):
        sys.exit("libjemalloc.so.2 not found (apt-get install libjemalloc2 libjemalloc-dev)")

    results = {p: [] for p in wanted}  # per run: cost and per-site estimates
    for run in range(args.runs):
        for name in wanted:
            env = dict(os.environ)
            cmd = [binary, "none"]
            if name == "inprof-noalloc":
                env["INPROF_OUTPUT"] = os.path.join(out_dir, f"inprof-noalloc.{run}.pb.gz")
                env["INPROF_ALLOC_PERIOD"] = "0"
                cmd = [binary, "inprof"]
            elif name == "inprof":
                profile = os.path.join(out_dir, f"inprof.{run}.pb.gz")
                env["INPROF_OUTPUT"] = profile
                cmd = [binary, "inprof"]
            elif name == "jemalloc":
                prefix = os.path.join(out_dir, f"jeprof.{run}")
                for old in glob.glob(prefix + ".*"):
                    os.remove(old)
                env["LD_PRELOAD"] = jemalloc
                env["MALLOC_CONF"] = ("prof:true,prof_accum:true,lg_prof_sample:19,"
                                      f"prof_final:true,prof_prefix:{prefix}")
            elif name == "jemalloc-noprof":
                env["LD_PRELOAD"] = jemalloc
            elif name == "heaptrack":
                stem = os.path.join(out_dir, f"heaptrack.{run}")
                for old in glob.glob(stem + "*"):
                    os.remove(old)
                cmd = ["heaptrack", "-o", stem, binary, "none"]
            stdout, cpu, wall, rss = run_measured(cmd, env)
            truth = site_truth.parse_truth(stdout, SITES, "alloc_sites")
            est = {}
            if name == "inprof":
                est["alloc_bytes"] = pprof_top(binary, profile, "alloc_space")
                est["alloc_objects"] = pprof_top(binary, profile, "alloc_objects")
                est["live_bytes"] = pprof_top(binary, profile, "inuse_space")
            elif name == "jemalloc":
                dumps = sorted(glob.glob(prefix + ".*.heap"))
                if not dumps:
                    sys.exit(f"jemalloc wrote no dump at {prefix}.*.heap")
                dump = dumps[-1]  # prof_final's, at exit
                est["alloc_bytes"] = jeprof_top(binary, dump, "--alloc_space")
                est["alloc_objects"] = jeprof_top(binary, dump, "--alloc_objects")
                est["live_bytes"] = jeprof_top(binary, dump, "--inuse_space")
            elif name == "heaptrack":
                files = glob.glob(stem + "*")
                if not files:
                    sys.exit(f"heaptrack wrote nothing at {stem}*")
                est["alloc_objects"] = heaptrack_stacks(files[0], "allocations")
                est["live_bytes"] = heaptrack_stacks(files[0], "leaked")
            results[name].append({"cpu": cpu, "wall": wall, "rss": rss,
                                  "truth": truth, "est": est})
            print(f"run {run} {name}: cpu {cpu:.2f} s wall {wall:.2f} s "
                  f"peak RSS {rss / 1024:.0f} MiB", file=sys.stderr)

    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    plain_cpu = (statistics.median(r["cpu"] for r in results["plain"])
                 if "plain" in results else None)
    # Runs are interleaved (plain, inprof, ... then again), so each run's
    # ratio compares neighbours in time: their median is the robust figure.
    def paired_ratio(name):
        if "plain" not in results or name == "plain":
            return "-"
        ratios = [r["cpu"] / p["cpu"] for r, p in zip(results[name], results["plain"])]
        return (f"{statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}..{max(ratios):.3f})")
    print(f"\nMedians over {args.runs} runs; profiles in {out_dir}\n")
    print("| profiler | CPU s | CPU vs plain | run-by-run ratio: median (range) | wall s | "
          "peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        cpu = statistics.median(r["cpu"] for r in runs)
        ratio = f"{cpu / plain_cpu:.2f}x" if plain_cpu else "-"
        print(f"| {name} | {cpu:.2f} | {ratio} | {paired_ratio(name)} | "
              f"{statistics.median(r['wall'] for r in runs):.2f} | "
              f"{statistics.median(r['rss'] for r in runs) / 1024:.0f} |")
    truth = results[next(iter(results))][0]["truth"]
    print("\nTruth per site (the same every run):\n")
    # A sampler's spread: n blocks of `size` each sampled with chance
    # p = 1 - exp(-size/period) (both samplers' period is 512 KiB); the
    # estimate is samples/p, samples ~ Binomial(n, p): 1 sd = sqrt((1-p)/(n p)).
    print("| site | allocated | objects | live at the end | 1 sd of a 512 KiB sampler: "
          "allocated / live |")
    print("|---|---|---|---|---|")
    for s in SITES:
        t = truth[s]
        # The realloc-growth site's allocations differ in size: its
        # allocated column uses their mean size (an approximation).
        sd = []
        for n, size in ((t["alloc_objects"], t["alloc_bytes"] / t["alloc_objects"]),
                        (t["live_objects"], t["live_bytes"] / max(t["live_objects"], 1))):
            p = -math.expm1(-size / 524288)
            sd.append(math.sqrt((1 - p) / (max(n, 1) * p)) * 100)
        print(f"| {s} | {t['alloc_bytes'] / 2**20:.1f} MiB | {t['alloc_objects']} | "
              f"{t['live_bytes'] / 2**20:.1f} MiB ({t['live_objects']} blocks) | "
              f"{sd[0]:.1f}% / {sd[1]:.1f}% |")
    print("\nPer-site relative error (estimate / truth - 1): median (lowest..highest "
          "of the runs); n/a: the tool does not report it\n")
    metrics = ["alloc_bytes", "alloc_objects", "live_bytes"]
    print("| profiler | site | " + " | ".join(metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    for name, runs in results.items():
        if not runs[0]["est"]:
            continue
        for s in SITES:
            cells = []
            for m in metrics:
                if m not in runs[0]["est"]:
                    cells.append("n/a")
                    continue
                errs = [r["est"][m][s] / r["truth"][s][m] - 1 for r in runs]
                cells.append(f"{statistics.median(errs) * 100:+.1f}% "
                             f"({min(errs) * 100:+.1f}..{max(errs) * 100:+.1f})")
            print(f"| {name} | {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
