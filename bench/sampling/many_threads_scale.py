#!/usr/bin/env python3
"""bench/sampling/many_threads at scale: idle and loaded, exported at Stop()
and each second, against the unprofiled program, in one interleaved loop.

  python3 bench/sampling/many_threads_scale.py [DIR] [--threads=1000,10000]
      [--seconds=3] [--runs=2] [--loads=idle,loaded] [--timeout=120]

DIR holds many_threads and many_threads_none (default build/bench). Each
round runs, for each load and thread count: the unprofiled program, inprof
with the profile exported at Stop() ("stop") and inprof with
INPROF_EXPORT_PERIOD=1s ("1s"). "loaded" keeps one busy loop per core
(os.cpu_count()) running beside the program. Every run's RESULT line is
printed as it comes; the table at the end gives, for each case, the medians
over the rounds (the worst window over all of them):

  wall_real      share of the profile's wall time on real stacks (min)
  vs_life        the profile's wall time over the threads' registered
                 lifetimes (all runs' values)
  windows        with 1s: the worst window's wall time over the lifetimes
                 within it, min-max over all runs, and its share on real
                 stacks (min)
  busy           the busy thread's wall on its own stack over its lifetime
  nap_running    share of the nappers' wall labelled running (max)
  ticker         the wall sampler's CPU, % of one core (max)
  cpu_ratio      process CPU over the unprofiled run's median, same load
  register_us    RegisterThread's CPU in the burst, median over runs of
                 each run's p50
  rss            peak RSS, KiB a thread, profiled / unprofiled
"""
import os
import re
import statistics
import subprocess
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
exe_dir = args[0] if args else os.path.join("build", "bench")
thread_counts = [int(t) for t in opts.get("threads", "1000,10000").split(",")]
seconds = opts.get("seconds", "3")
runs = int(opts.get("runs", "2"))
loads = opts.get("loads", "idle,loaded").split(",")
timeout = float(opts.get("timeout", "120"))
inprof_exe = os.path.join(exe_dir, "many_threads")
none_exe = os.path.join(exe_dir, "many_threads_none")
CASES = [("none", None), ("inprof", "stop"), ("inprof", "1s")]


def run_one(threads, profiler, export):
    env = dict(os.environ)
    env.pop("INPROF_EXPORT_PERIOD", None)
    if profiler == "none":
        cmd = [none_exe, str(threads), seconds, "nap", "-"]
    else:
        cmd = [inprof_exe, str(threads), seconds, "nap"]
        if export == "1s":
            env["INPROF_EXPORT_PERIOD"] = "1s"
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"many_threads_scale: {' '.join(cmd)}: still running after {timeout:g} s, "
              "killed", flush=True)
        return None
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT many_threads")), None)
    if p.returncode != 0 or line is None:
        print(f"many_threads_scale: {' '.join(cmd)}: exit {p.returncode}: "
              f"{p.stderr[-1500:]}", flush=True)
        return None
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}, line


def busy_loops(n):
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]


results = {}  # (load, threads, profiler, export) -> [dict]
for round_ in range(runs):
    for load in loads:
        loops = busy_loops(os.cpu_count()) if load == "loaded" else []
        try:
            for threads in thread_counts:
                for profiler, export in CASES:
                    got = run_one(threads, profiler, export)
                    if got is None:
                        continue
                    fig, line = got
                    results.setdefault((load, threads, profiler, export), []).append(fig)
                    print(f"# round {round_ + 1} {load} {export or 'off'}: {line}", flush=True)
        finally:
            for p in loops:
                p.kill()
                p.wait()


def vals(key, *case):
    return [float(f[key]) for f in results.get(case, []) if key in f]


def med(v):
    return statistics.median(v) if v else float("nan")


print(f"\n{os.cpu_count()} cores, {seconds} s, nappers + one busy thread, threads joined "
      f"before Stop(); medians of {runs} rounds unless said")
print("| load | threads | export | wall_real | vs_life | windows (min-max, real) | busy | "
      "nap_running | ticker % core | cpu_ratio | register_us p50 | rss KiB/thread |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for load in loads:
    for threads in thread_counts:
        off = med(vals("process_cpu_s", load, threads, "none", None))
        rss_off = med(vals("rss_kib_per_thread", load, threads, "none", None))
        for export in ("stop", "1s"):
            case = (load, threads, "inprof", export)
            if case not in results:
                continue
            win = ""
            if export == "1s":
                lo, hi = vals("win_vs_life_min", *case), vals("win_vs_life_max", *case)
                win = (f"{min(lo):.3f}-{max(hi):.3f}, "
                       f"{min(vals('win_real_min', *case)):.3f}")
            ratios = ", ".join(f"{c / off:.3f}" for c in vals("process_cpu_s", *case))
            print(f"| {load} | {threads:,} | {export} | {min(vals('wall_real', *case)):.3f} | "
                  f"{', '.join(f'{v:.3f}' for v in vals('wall_vs_life', *case))} | {win} | "
                  f"{med(vals('busy_vs_life', *case)):.3f} | "
                  f"{max(vals('nap_running', *case)):.4f} | "
                  f"{max(vals('ticker_core_pct', *case)):.2f} | {ratios} | "
                  f"{med(vals('register_us_p50', *case)):.1f} | "
                  f"{med(vals('rss_kib_per_thread', *case)):.1f} / {rss_off:.1f} |")
