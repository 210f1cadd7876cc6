#!/usr/bin/env python3
"""bench/sampling/many_threads side by side with gperftools and async-profiler.

  python3 bench/sampling/many_threads.py [BUILD_DIR] [--threads=100,1000,10000]
      [--seconds=3] [--runs=2] [--asprof=DIR]

Runs the same workload (N threads napping 200 ms at a time, one more
spinning for SECONDS) unprofiled (build/bench/many_threads_none), under
inprof (build/bench/many_threads), under gperftools' CPU profiler
(many_threads_gperftools, ProfilerStart/ProfilerStop) and, with --asprof=DIR
(an async-profiler build: DIR/lib/libasyncProfiler.so, DIR/bin/jfrconv),
under async-profiler injected into many_threads_none with LD_PRELOAD and
ASPROF_COMMAND=start,event=cpu,interval=10ms,wall=10ms,file=OUT.jfr, once
with its default C-stack walker for a native program (frame pointers) and
once with cstack=dwarf. The runs interleave (each round runs every
profiler once per thread count); the table gives medians over the rounds,
then every run's figures.

Figures, for each profiler:
  cpu_real   share of the profile's CPU samples on real stacks. inprof: not
             on an "[inprof: ...]" pseudo-frame (many_threads' own RESULT).
             gperftools: the stack has at least one frame in the program's
             own binary (a location in its mapping, `go tool pprof -raw`),
             not only libc/libstdc++/vdso/libprofiler frames.
             async-profiler (`jfrconv --cpu -o collapsed`): the stack has a
             frame that is one of the program's own functions (`nm` of the
             binary) or an unsymbolized address in it; samples of
             async-profiler's own threads (WallClock::, Profiler:: frames)
             are left out of both sides.
  wall_real  the same for wall time (gperftools: no wall time, n/a).
             async-profiler: `jfrconv --wall`, each sample one wall
             interval (10 ms), idle threads' batched samples included.
  busy_wall  the busy thread's wall time on stacks through Spin over its
             lifetime (async-profiler: Spin's wall samples x 10 ms).
  cpu_s      process CPU (getrusage) of the whole run; the "off" column is
             the unprofiled program.
  rss_kib    peak RSS over the thread count, KiB per thread.
  own_ms     CPU of the threads the workload did not start (the
             profiler's own threads, /proc/self/task/TID/stat at the end of
             the busy thread; 10 ms ticks). gperftools has none: its
             sampling runs in the profiled threads' signal handlers (in
             cpu_s, not here); so do inprof's and async-profiler's CPU
             samples.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

args = [a for a in sys.argv[1:] if not a.startswith("--")]
opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
build = args[0] if args else "build"
thread_counts = [int(t) for t in opts.get("threads", "100,1000,10000").split(",")]
seconds = float(opts.get("seconds", "3"))
runs = int(opts.get("runs", "2"))
asprof = opts.get("asprof")
bench = os.path.join(build, "bench")
none_exe = os.path.abspath(os.path.join(bench, "many_threads_none"))
inprof_exe = os.path.join(bench, "many_threads")
gperf_exe = os.path.abspath(os.path.join(bench, "many_threads_gperftools"))
go = shutil.which("go")
tmp = tempfile.mkdtemp(prefix="inprof-many-threads-")
WALL_INTERVAL_S = 0.010

profilers = ["none", "inprof"]
if os.path.exists(gperf_exe) and go:
    profilers.append("gperftools")
elif os.path.exists(gperf_exe):
    print("many_threads: go not found (apt-get install golang-go): no gperftools column",
          file=sys.stderr)
if asprof:
    asprof_lib = os.path.abspath(os.path.join(asprof, "lib", "libasyncProfiler.so"))
    jfrconv = os.path.abspath(os.path.join(asprof, "bin", "jfrconv"))
    profilers += ["async-fp", "async-dwarf"]


def result(stdout):
    line = next(l for l in stdout.splitlines() if l.startswith("RESULT many_threads"))
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def program_functions(exe):
    p = subprocess.run(["nm", "-C", "--defined-only", exe], capture_output=True,
                       text=True, check=True)
    names = set()
    for line in p.stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            names.add(parts[2])
            names.add(without_parameters(parts[2]))
    return names


def without_parameters(name):
    """"ns::f(int, std::vector<int> const&) const [clone .isra.0]" -> "ns::f"."""
    name = re.sub(r"( \[clone [^\]]*\])+$", "", name)  # "f(long) [clone .isra.0]"
    name = re.sub(r" const$", "", name)
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i]
    return name


PROGRAM_FUNCTIONS = program_functions(none_exe)
ASPROF_OWN = re.compile(r"^(WallClock|Profiler|PerfEvents|CTimer|ITimer|Engine|"
                        r"FlightRecorder|Recording|Lookup|CodeCache|Symbols)\b")


def gperftools_cpu_real(profile):
    p = subprocess.run([go, "tool", "pprof", "-raw", gperf_exe, profile],
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, HOME=tmp, PPROF_TMPDIR=tmp))
    section = None
    samples, loc_mapping, program_mappings = [], {}, set()
    for line in p.stdout.splitlines():
        if line in ("Samples:", "Locations", "Mappings"):
            section = line
            continue
        if section == "Samples:":
            m = re.match(r"\s*(\d+)\s+\d+:\s*([\d ]+)$", line)
            if m:
                samples.append((int(m.group(1)), [int(x) for x in m.group(2).split()]))
        elif section == "Locations":
            m = re.match(r"\s*(\d+): \S+ M=(\d+)", line)
            if m:
                loc_mapping[int(m.group(1))] = int(m.group(2))
        elif section == "Mappings":
            m = re.match(r"\s*(\d+): \S+ (\S+)", line)
            if m and os.path.basename(m.group(2)) == os.path.basename(gperf_exe):
                program_mappings.add(int(m.group(1)))
    total = sum(n for n, _ in samples)
    real = sum(n for n, locs in samples
               if any(loc_mapping.get(l) in program_mappings for l in locs))
    return real / total if total else float("nan"), total


def collapsed(jfr, kind):
    out = jfr + "." + kind + ".txt"
    subprocess.run([jfrconv, "--" + kind, "-o", "collapsed", jfr, out],
                   capture_output=True, text=True, check=True)
    stacks = []
    with open(out) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            stacks.append((stack.split(";"), int(n)))
    return stacks


def asprof_shares(stacks):
    total = real = spin = own = 0
    for frames, n in stacks:
        if any(ASPROF_OWN.match(f) for f in frames):
            own += n
            continue
        total += n
        if any(f in PROGRAM_FUNCTIONS or f == none_exe for f in frames):
            real += n
        if any(re.search(r"\bSpin$", f) for f in frames):
            spin += n
    return (real / total if total else float("nan")), spin, total, own


def run_one(profiler, threads):
    out = os.path.join(tmp, f"{profiler}-{threads}-{len(os.listdir(tmp))}")
    env = dict(os.environ)
    base = [str(threads), str(seconds), "nap"]
    if profiler == "none":
        cmd = [none_exe] + base + ["-"]
    elif profiler == "inprof":
        cmd = [inprof_exe] + base
    elif profiler == "gperftools":
        cmd = [gperf_exe] + base + [out + ".prof"]
    else:
        cstack = ",cstack=dwarf" if profiler == "async-dwarf" else ""
        cmd = [none_exe] + base + ["-"]
        env["LD_PRELOAD"] = asprof_lib
        env["ASPROF_COMMAND"] = (f"start,event=cpu,interval=10ms,wall=10ms{cstack},"
                                 f"file={out}.jfr")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"many_threads: {profiler} {threads}: exit {p.returncode}: {p.stderr[-2000:]}",
              file=sys.stderr)
        return None
    r = result(p.stdout)
    fig = {"cpu_s": float(r["process_cpu_s"]), "rss_kib": float(r["rss_kib_per_thread"]),
           "own_ms": float(r["profiler_threads_cpu_ms"])}
    run_s = float(r["run_s"])
    if profiler == "inprof":
        fig.update(cpu_real=float(r["cpu_real"]), wall_real=float(r["wall_real"]),
                   busy_wall=float(r["busy_wall_share"]), wall_total_s=float(r["wall_total_s"]))
    elif profiler == "gperftools":
        fig["cpu_real"], fig["cpu_samples"] = gperftools_cpu_real(out + ".prof")
        os.remove(out + ".prof")
    elif profiler.startswith("async"):
        fig["cpu_real"], _, fig["cpu_samples"], fig["own_cpu_samples"] = asprof_shares(
            collapsed(out + ".jfr", "cpu"))
        fig["wall_real"], spin, wall_samples, _ = asprof_shares(collapsed(out + ".jfr", "wall"))
        fig["busy_wall"] = spin * WALL_INTERVAL_S / run_s
        fig["wall_total_s"] = wall_samples * WALL_INTERVAL_S
        for f in os.listdir(tmp):
            if f.startswith(os.path.basename(out)):
                os.remove(os.path.join(tmp, f))
    return fig


results = {}  # (profiler, threads) -> [figures]
for round_ in range(runs):
    for threads in thread_counts:
        for profiler in profilers:
            fig = run_one(profiler, threads)
            if fig is None:
                continue
            results.setdefault((profiler, threads), []).append(fig)
            print(f"# round {round_ + 1} {profiler} threads={threads} " +
                  " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in sorted(fig.items())), flush=True)


def median(profiler, threads, key):
    vals = [f[key] for f in results.get((profiler, threads), []) if key in f]
    return statistics.median(vals) if vals else None


def pct(v):
    return "n/a" if v is None else f"{100 * v:.1f}%"


columns = [("CPU on real stacks", "cpu_real", pct),
           ("wall on real stacks", "wall_real", pct),
           ("busy thread's wall share", "busy_wall", pct),
           ("process CPU s", "cpu_s", lambda v: "n/a" if v is None else f"{v:.2f}"),
           ("RSS KiB/thread", "rss_kib", lambda v: "n/a" if v is None else f"{v:.1f}"),
           ("profiler threads' CPU ms", "own_ms", lambda v: "n/a" if v is None else f"{v:.0f}")]
print(f"\nmedians of {runs} runs, {seconds:g} s, nap; off = no profiler")
head = ["threads"]
for title, key, _ in columns:
    for profiler in profilers:
        if profiler == "none" and key not in ("cpu_s", "rss_kib"):
            continue
        head.append(f"{title}, {'off' if profiler == 'none' else profiler}")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for threads in thread_counts:
    row = [f"{threads:,}"]
    for title, key, fmt in columns:
        for profiler in profilers:
            if profiler == "none" and key not in ("cpu_s", "rss_kib"):
                continue
            row.append(fmt(median(profiler, threads, key)))
    print("| " + " | ".join(row) + " |")
shutil.rmtree(tmp, ignore_errors=True)
