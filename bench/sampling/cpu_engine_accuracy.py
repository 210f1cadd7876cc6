#!/usr/bin/env python3
"""CPU engines' accuracy side by side with gperftools (docs/measurements.md's accuracy table).

  python3 bench/sampling/cpu_engine_accuracy.py [BUILD_DIR] [--quick]

Runs bench/sampling/cpu_engine_accuracy (inprof, once per engine) and
cpu_engine_accuracy_gperftools with the same workloads, reads every profile
with `go tool pprof -top`, and prints a Markdown table:

  * samples per CPU-second at a 1 ms period (one spinning thread);
  * the kernel share of a thread alternating read() of /dev/zero and
    spinning, at 1 ms and 10 ms, against the share its own clock measured;
  * 2,000 threads of 1-2 ms of CPU each: the share of their CPU on their real
    stacks (SpinFor) and the profile's total against their clocks.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

build = next((a for a in sys.argv[1:] if not a.startswith("--")), "build")
quick = "--quick" in sys.argv
binary = os.path.join(build, "bench", "cpu_engine_accuracy")
gperf = binary + "_gperftools"
go = shutil.which("go")
if not go:
    sys.exit("cpu_engine_accuracy: go not found (apt-get install golang-go)")
tmp = tempfile.mkdtemp(prefix="inprof-accuracy-")


def run(exe, workload, seconds, period_ms, engine=None):
    out = os.path.join(tmp, f"{os.path.basename(exe)}-{workload}-{engine}-{period_ms}.prof")
    env = dict(os.environ, INPROF_CPU_PERIOD=f"{period_ms}ms",
               CPUPROFILE_FREQUENCY=str(int(1000 / period_ms)),
               INPROF_EXPORT_PERIOD="0")
    if engine:
        env["INPROF_CPU_ENGINE"] = engine
    p = subprocess.run([exe, workload, str(seconds), out], env=env,
                       capture_output=True, text=True, check=True)
    m = re.search(r"truth_cpu_s=([\d.]+) truth_kernel_pct=([\d.]+)", p.stdout)
    return out, float(m.group(1)), float(m.group(2))


def top_gperftools(exe, profile, period_ms):
    # gperftools' own pprof symbolizes its legacy format from the binary.
    p = subprocess.run(["google-pprof", "--text", "--cum", exe, profile],
                       capture_output=True, text=True, check=True)
    total = None
    cum = {}
    for line in p.stdout.splitlines():
        m = re.match(r"Total: (\d+) samples", line)
        if m:
            total = int(m.group(1)) * period_ms / 1000
        m = re.match(r"\s*\d+\s+\S+%\s+\S+%\s+(\d+)\s+\S+%\s+(.*)$", line)
        if m:
            cum[m.group(2)] = int(m.group(1)) * period_ms / 1000
    return total, cum


def top(exe, profile, index, period_ms=1):
    if index is None:
        return top_gperftools(exe, profile, period_ms)
    args = [go, "tool", "pprof", "-top", "-cum", "-nodecount=200"]
    if index:
        args.append(f"-sample_index={index}")
    # gperftools' legacy format needs the binary to symbolize.
    args += [exe, profile] if index is None else [profile]
    p = subprocess.run(args, capture_output=True, text=True, check=True,
                       env=dict(os.environ, PPROF_TMPDIR=tmp, HOME=tmp))
    total = None
    cum = {}
    for line in p.stdout.splitlines():
        m = re.search(r"Total samples = ([\d.]+)(ms|s|us|mins)?", line)
        if m:
            scale = {"ms": 1e-3, "s": 1, "us": 1e-6, "mins": 60, None: 1}[m.group(2)]
            total = float(m.group(1)) * scale
        m = re.match(r"\s*\S+\s+\S+%\s+\S+%\s+([\d.]+)(ms|s|us|mins)?\s+\S+%\s+(.*)$", line)
        if m:
            scale = {"ms": 1e-3, "s": 1, "us": 1e-6, "mins": 60, None: 1}[m.group(2)]
            cum[m.group(3)] = float(m.group(1)) * scale
    return total, cum


def share(cum, total, needle):
    return 100.0 * max((v for k, v in cum.items() if needle in k), default=0.0) / total


profilers = [("inprof perf", binary, "perf"), ("inprof timer", binary, "timer"),
             ("inprof itimer", binary, "itimer")]
if os.path.exists(gperf):
    profilers.append(("gperftools 2.10", gperf, None))

scale = 0.25 if quick else 1.0
rows = {}
for name, exe, engine in profilers:
    is_gperf = engine is None
    r = {}
    # Samples per CPU-second at 1 ms.
    prof, cpu, _ = run(exe, "rate", 2 * scale, 1, engine)
    if is_gperf:
        total, _ = top(exe, prof, None, 1)
        r["rate"] = total / 0.001 / cpu  # each sample is 1 ms
    else:
        total, _ = top(exe, prof, "cpu-samples")
        r["rate"] = total / cpu
    # Kernel share at 1 ms and 10 ms.
    for period, secs in ((1, 10), (10, 30)):
        prof, cpu, truth = run(exe, "kernel", secs * scale, period, engine)
        total, cum = top(exe, prof, None if is_gperf else "cpu-time", period)
        r[f"kernel{period}"] = (truth, share(cum, total, "ReadChunks"))
    # Churned threads.
    for period in (10, 1):
        prof, cpu, _ = run(exe, "churn", 0, period, engine)
        total, cum = top(exe, prof, None if is_gperf else "cpu-time", period)
        r[f"churn{period}"] = (share(cum, total, "SpinFor"), total, cpu)
    rows[name] = r
    print(name, r, file=sys.stderr)

print("| check | " + " | ".join(rows) + " |")
print("|---|" + "---|" * len(rows))
print("| samples per CPU-second at 1 ms | " +
      " | ".join(f"{r['rate']:.0f}" for r in rows.values()) + " |")
for period in (1, 10):
    print(f"| kernel share at {period} ms: thread clock / profile | " +
          " | ".join(f"{r[f'kernel{period}'][0]:.1f}% / {r[f'kernel{period}'][1]:.1f}%"
                     for r in rows.values()) + " |")
for period in (10, 1):
    print(f"| 2,000 threads of 1-2 ms at {period} ms: CPU on real stacks; profile / clocks | " +
          " | ".join(f"{r[f'churn{period}'][0]:.1f}%; {r[f'churn{period}'][1]:.3f} / {r[f'churn{period}'][2]:.3f} s"
                     for r in rows.values()) + " |")
shutil.rmtree(tmp, ignore_errors=True)
