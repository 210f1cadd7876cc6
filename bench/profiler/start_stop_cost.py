#!/usr/bin/env python3
"""Fixed cost of a short profiled run, side by side.

  python3 bench/profiler/start_stop_cost.py BUILD_DIR [ROUNDS] [WORK_MS]

Runs BUILD_DIR/bench/start_stop_cost (inprof and unprofiled) and, when it
was built, start_stop_cost_gperftools, interleaved round by round so that
the machine's noise falls on all of them alike, and prints the medians of
each figure and the differences to the unprofiled run.
"""
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return {k: float(v) for k, v in
                    (f.split("=") for f in line.split()[1:])}
    raise SystemExit(f"start_stop_cost: no RESULT line from {cmd}")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    work_ms = sys.argv[3] if len(sys.argv) > 3 else "100"
    inprof = os.path.join(build, "bench", "start_stop_cost")
    gperf = os.path.join(build, "bench", "start_stop_cost_gperftools")
    tmp = tempfile.mkdtemp(prefix="start_stop_cost.")
    env = dict(os.environ, INPROF_OUTPUT=os.path.join(tmp, "profile.pb.gz"))
    runs = {"none": [inprof, "none", work_ms], "inprof": [inprof, "inprof", work_ms]}
    if os.path.exists(gperf):
        runs["gperftools"] = [gperf, "gperftools", work_ms]
    results = {name: [] for name in runs}
    for _ in range(rounds):
        for name, cmd in runs.items():
            results[name].append(run(cmd, env))

    def median(name, key):
        return statistics.median(r[key] for r in results[name])

    base_cpu = median("none", "process_cpu_ms")
    base_rss = median("none", "maxrss_kib")
    print(f"medians of {rounds} rounds, {work_ms} ms of work")
    print(f"{'':12} {'start wall':>11} {'stop cpu':>9} {'stop wall':>10} "
          f"{'process cpu':>12} {'peak rss':>10}")
    for name in runs:
        cpu = median(name, "process_cpu_ms")
        rss = median(name, "maxrss_kib")
        extra = ""
        if name != "none":
            extra = (f"   (+{cpu - base_cpu:.1f} ms CPU, "
                     f"+{(rss - base_rss) / 1024:.1f} MiB)")
        print(f"{name:12} {median(name, 'start_ms'):9.2f}ms "
              f"{median(name, 'stop_cpu_ms'):7.1f}ms "
              f"{median(name, 'stop_ms'):8.1f}ms {cpu:10.1f}ms "
              f"{rss / 1024:8.1f}MiB{extra}")


if __name__ == "__main__":
    main()
