#!/usr/bin/env python3
"""Runs the overhead harness (bench/overhead/run.sh calls this after building).

For each workload, each repetition runs every (profiler, rate) pair once,
round-robin and rotated by one position per repetition, so that noise from
other work on the machine falls on all of them alike. Each profiled run is
compared with the `none` run of the same repetition. Writes a Markdown
report (bench/overhead/README.md explains the columns).

Only the standard library: no pip packages.
"""

import argparse
import bisect
import datetime
import gzip
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

RATES = [100, 1000]  # Hz; 1000 is inprof's fastest (INPROF_CPU_PERIOD >= 1ms)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def read_text(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def loadavg():
    return " ".join(read_text("/proc/loadavg").split()[:3])


def tool_version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "not found"


# ---------------------------------------------------------------------------
# Running one process and reading what it printed.

class Run:
    """One process: its RESULT line, the OS's view of it, its profile's totals."""

    def __init__(self, workload, profiler, hz, rep):
        self.workload, self.profiler, self.hz, self.rep = workload, profiler, hz, rep
        self.ok = False
        self.error = ""
        self.result = {}
        self.run_wall_s = 0.0
        self.os_cpu_s = 0.0      # wait4 rusage: the process and its waited-for children
        self.os_maxrss_kib = 0
        self.profile = None      # dict: samples, cpu_s, chain, complete
        self.stderr = ""

    def r(self, key, default=0.0):
        v = self.result.get(key)
        if v is None:
            return default
        try:
            return float(v)
        except ValueError:
            return default


def parse_result(stdout):
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return None


def run_process(argv, env, stdout_path, stderr_path, timeout_s):
    """Runs argv; returns (rc, wall seconds, rusage) with the rusage of wait4."""
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        deadline = t0 + timeout_s
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid != 0:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.002)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return p.returncode, wall, ru


# ---------------------------------------------------------------------------
# Reading the three kinds of profile. Each gives the workers' CPU samples,
# their CPU according to the profiler, and how many samples in the 42-frame
# chain have a complete stack (OverheadRoot reached through every Frame<K>).

CHAIN_DEPTH = 40


def classify_stack(names):
    """(in_chain, complete) for a stack given leaf first."""
    in_leaf = has_root = False
    frames, deepest = 0, -1
    for n in names:
        if "OverheadLeaf" in n:
            in_leaf = True
        if "OverheadRoot" in n:
            has_root = True
        m = re.search(r"Frame<(\d+)", n)
        if m:
            frames += 1
            deepest = max(deepest, int(m.group(1)))
    if not in_leaf and frames == 0:
        return False, False
    all_frames = frames == CHAIN_DEPTH if in_leaf else frames == deepest + 1
    return True, has_root and all_frames


def analyze_inprof(workload_exe, path):
    out = subprocess.run([workload_exe, "analyze", path], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("ANALYZE "):
            kv = dict(x.split("=", 1) for x in line.split()[1:])
            return {"samples": int(kv["samples"]), "cpu_s": float(kv["cpu_s"]),
                    "pseudo_cpu_s": float(kv["pseudo_cpu_s"]),
                    "chain": int(kv["chain_samples"]), "complete": int(kv["complete_samples"])}
    raise RuntimeError("analyze %s: %s" % (path, out.stderr.strip()))


class Symbols:
    """Function symbols of one ELF file (nm), looked up by file address."""

    def __init__(self, path):
        out = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True,
                             text=True).stdout
        syms = []
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tTwW":
                syms.append((int(parts[0], 16), parts[2]))
        syms.sort()
        self.addrs = [a for a, _ in syms]
        self.names = [n for _, n in syms]

    def lookup(self, addr):
        i = bisect.bisect_right(self.addrs, addr) - 1
        return self.names[i] if i >= 0 else "?"


def analyze_gperftools(path, binary, symbols):
    """gperftools' legacy CPU profile: a header of 64-bit words
    [0, 3, 0, period_us, 0], records [count, depth, pc...], a trailer
    [0, 1, 0], then the text of /proc/self/maps."""
    with open(path, "rb") as f:
        data = f.read()
    hdr = struct.unpack_from("<5Q", data, 0)
    if hdr[0] != 0 or hdr[1] != 3:
        raise RuntimeError("%s: not a gperftools CPU profile" % path)
    period_s = hdr[3] * 1e-6
    off, records = 40, []
    while off + 16 <= len(data):
        count, depth = struct.unpack_from("<2Q", data, off)
        off += 16
        pcs = struct.unpack_from("<%dQ" % depth, data, off)
        off += 8 * depth
        if count == 0 and depth == 1 and pcs[0] == 0:
            break
        records.append((count, pcs))
    # Load bias of the workload binary, from its executable mapping. The
    # binary's text segment has p_vaddr == p_offset (GNU ld's layout), so a
    # pc's file address is pc - start + offset.
    text_maps = []
    for line in data[off:].decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == binary and "x" in parts[1]:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            text_maps.append((start, end, int(parts[2], 16)))
    samples = chain = complete = 0
    for count, pcs in records:
        names = []
        for i, pc in enumerate(pcs):
            lookup_pc = pc if i == 0 else pc - 1  # a return address points past its call
            name = "?"
            for start, end, offset in text_maps:
                if start <= lookup_pc < end:
                    name = symbols.lookup(lookup_pc - start + offset)
            names.append(name)
        samples += count
        in_chain, ok = classify_stack(names)
        if in_chain:
            chain += count
            if ok:
                complete += count
    return {"samples": samples, "cpu_s": samples * period_s, "chain": chain,
            "complete": complete, "period_s": period_s}


def analyze_perf(path):
    """perf script's samples of the worker threads: CPU = the sum of their
    periods (ns of cpu-clock)."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "comm,tid,period,ip,sym",
                          "--no-inline"], capture_output=True, text=True,
                         errors="replace").stdout
    samples = cpu_ns = chain = complete = kernel = 0
    for block in out.split("\n\n"):
        lines = [l for l in block.split("\n") if l.strip()]
        if not lines:
            continue
        header = lines[0].split()
        if len(lines) > 1:
            try:
                kernel += int(lines[1].split()[0], 16) >= 0xffff800000000000
            except (ValueError, IndexError):
                pass
        if not header or not header[0].startswith("worker"):
            continue
        samples += 1
        cpu_ns += int(header[-1])
        names = [l.strip().split(None, 1)[1] if len(l.strip().split(None, 1)) > 1 else "?"
                 for l in lines[1:]]
        in_chain, ok = classify_stack(names)
        if in_chain:
            chain += 1
            complete += ok
    return {"samples": samples, "cpu_s": cpu_ns / 1e9, "chain": chain, "complete": complete,
            "kernel_samples": kernel}


# ---------------------------------------------------------------------------
# The harness.

class Harness:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build_dir)
        self.workload_exe = os.path.join(self.build, "bench/overhead/overhead_workload")
        self.gperf_exe = self.workload_exe + "_gperftools"
        # The gperftools program on inprof's drop-in (inprof-gperftools).
        self.dropin_exe = self.workload_exe + "_dropin"
        self.outdir = os.path.join(self.build, "overhead-runs")
        shutil.rmtree(self.outdir, ignore_errors=True)
        os.makedirs(self.outdir)
        self.notes = []
        self.unavailable = {}  # profiler -> reason
        self.engines = {}
        self.gperf_method = "?"

    # -- what can run here --------------------------------------------------
    def probe(self):
        out = subprocess.run([self.workload_exe, "engines"], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            _, name, engine = line.split(" ", 2)
            self.engines[name] = engine
        if not os.path.exists(self.gperf_exe):
            self.unavailable["gperftools"] = (
                "overhead_workload_gperftools not built: gperftools' libprofiler was not "
                "found (Debian: libgoogle-perftools-dev)")
        if not os.path.exists(self.dropin_exe):
            self.unavailable["dropin"] = "overhead_workload_dropin not built"
        if shutil.which("perf") is None:
            self.unavailable["perf"] = "no perf binary (Debian: linux-perf)"
        else:
            tmp = os.path.join(self.outdir, "probe.perf.data")
            p = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-g", "-o", tmp,
                                "--", "true"], capture_output=True, text=True)
            if p.returncode != 0:
                reason = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[0]
                self.unavailable["perf"] = "`perf record -e cpu-clock -g -- true` failed: " + reason
        # perf's own CPU for recording a run that does nothing: its start and
        # its end, where it collects the build-ids of the modules that have
        # samples. Measured here: ~170 ms, and ~95 ms (and ~10 MB) more when
        # any sample is in the kernel (it then reads the kernel's symbols),
        # whatever the rate. So it is measured for both cases (the 1000 Hz
        # probes nearly always catch a kernel sample, the 100 Hz ones rarely),
        # and each run has the one for its case subtracted in "CPU x" and
        # "own CPU"; "start / stop" shows it.
        self.perf_fixed_cpu_s = {}  # has kernel samples -> seconds
        if "perf" not in self.unavailable:
            fixed = {False: [], True: []}
            for hz in RATES:
                for i in range(5):
                    r = self.run("probe", ["cpu", "1", "1"], "perf", hz, i)
                    if r.ok:
                        fixed[r.profile["kernel_samples"] > 0].append(
                            r.os_cpu_s - r.r("run_cpu_s"))
            for case, values in fixed.items():
                if values:
                    self.perf_fixed_cpu_s[case] = statistics.median(values)
            for case in (False, True):  # a case no probe met: the other's
                if case not in self.perf_fixed_cpu_s and self.perf_fixed_cpu_s:
                    self.perf_fixed_cpu_s[case] = self.perf_fixed_cpu_s[not case]
                    self.notes.append("perf's fixed cost %s kernel samples was not observed; "
                                      "the other case's is used" % ("with" if case else "without"))
        cal = subprocess.run([self.workload_exe, "calibrate"], capture_output=True, text=True,
                             check=True).stdout
        m = re.search(r"ns_per_call=([\d.]+)", cal)
        self.ns_per_call = float(m.group(1))

    def profilers(self):
        names = ["inprof"]
        if self.engines.get("inprof-dwarf") != self.engines.get("inprof"):
            names.append("inprof-dwarf")
        else:
            self.notes.append(
                "`inprof-dwarf` (inprof::DwarfProfiler) is the same composition as "
                "`inprof` (DefaultProfiler: %s) on this machine, so it is not run twice; "
                "`inprof-fp` is the frame-pointer composition." % self.engines["inprof"])
        names += ["inprof-fp", "gperftools", "dropin", "perf"]
        if self.args.profilers:
            names = [n for n in names if n in self.args.profilers.split(",")]
        return [n for n in names if n not in self.unavailable]

    def workloads(self):
        quick = self.args.quick
        total_cpu = 0.4 if quick else 1.5  # seconds of CPU per cpu run, all threads together
        calls = lambda seconds: max(1, int(seconds * 1e9 / self.ns_per_call))
        burst = calls(0.002)               # ~2 ms of CPU per burst
        cycles = 30 if quick else 120      # per thread: 4 x 120 x 2 ms = ~1 s of CPU
        idle_s = 1.5 if quick else 4.0
        wl = [
            ("cpu-1", ["cpu", "1", str(calls(total_cpu))]),
            ("cpu-2", ["cpu", "2", str(calls(total_cpu / 2))]),
            ("cpu-8", ["cpu", "8", str(calls(total_cpu / 8))]),
            ("mixed-4", ["mixed", "4", str(cycles), str(burst)]),
            ("idle-1000", ["idle", "1000", str(idle_s)]),
        ]
        if self.args.workloads:
            wl = [w for w in wl if w[0] in self.args.workloads.split(",")]
        return wl

    # -- one run ------------------------------------------------------------
    def run(self, wl_name, wl_args, profiler, hz, rep):
        run = Run(wl_name, profiler, hz, rep)
        stem = os.path.join(self.outdir, "%s.%s.%s.%d" % (wl_name, profiler, hz, rep))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("INPROF_", "CPUPROFILE", "DD_"))}
        exe = self.workload_exe
        argv_tail = [profiler] + wl_args
        profile_path = None
        if profiler.startswith("inprof"):
            profile_path = stem + ".pb.gz"
            env["INPROF_OUTPUT"] = profile_path
            env["INPROF_CPU_PERIOD"] = "%gms" % (1000.0 / hz)
            argv = [exe] + argv_tail
        elif profiler == "gperftools":
            profile_path = stem + ".prof"
            exe = self.gperf_exe
            env["CPUPROFILE"] = profile_path
            env["CPUPROFILE_FREQUENCY"] = str(hz)
            env["TCMALLOC_STACKTRACE_METHOD_VERBOSE"] = "1"
            argv = [exe] + argv_tail
        elif profiler == "dropin":
            # The same program and variables as gperftools; the file is pprof.
            profile_path = stem + ".pb.gz"
            env["CPUPROFILE"] = profile_path
            env["CPUPROFILE_FREQUENCY"] = str(hz)
            argv = [self.dropin_exe, "gperftools"] + wl_args
        elif profiler == "perf":
            profile_path = stem + ".perf.data"
            # GNU time reports perf's peak RSS: wait4's ru_maxrss of a child
            # of this Python process would include Python's own RSS.
            wrap = (["/usr/bin/time", "-f", "TIME maxrss_kib=%M", "-o", stem + ".time"]
                    if os.path.exists("/usr/bin/time") else [])
            argv = wrap + ["perf", "record", "-q", "-g", "-e", "cpu-clock", "-F", str(hz),
                    "-o", profile_path, "--", exe] + argv_tail
        else:
            argv = [exe] + argv_tail
        rc, run.run_wall_s, ru = run_process(argv, env, stem + ".out", stem + ".err",
                                             timeout_s=300)
        run.os_cpu_s = ru.ru_utime + ru.ru_stime
        m = re.search(r"maxrss_kib=(\d+)", read_text(stem + ".time"))
        run.os_maxrss_kib = int(m.group(1)) if m else 0
        run.stderr = read_text(stem + ".err")
        result = parse_result(read_text(stem + ".out"))
        if rc != 0 or result is None:
            run.error = "exit %d: %s" % (rc, run.stderr.strip().splitlines()[-1:] or "")
            return run
        run.result = result
        m = re.search(r"Chosen stacktrace method is (\w+)", run.stderr)
        if m:
            self.gperf_method = m.group(1)
        try:
            if profiler.startswith("inprof") or profiler == "dropin":
                run.profile = analyze_inprof(self.workload_exe, profile_path)
            elif profiler == "gperftools":
                if not hasattr(self, "gperf_symbols"):
                    self.gperf_symbols = Symbols(self.gperf_exe)
                run.profile = analyze_gperftools(profile_path, os.path.realpath(self.gperf_exe),
                                                 self.gperf_symbols)
            elif profiler == "perf":
                run.profile = analyze_perf(profile_path)
        except (RuntimeError, OSError, struct.error, KeyError, ValueError) as e:
            run.error = "profile unreadable: %s" % e
            return run
        run.ok = True
        if profile_path and not self.args.keep and os.path.exists(profile_path):
            os.remove(profile_path)
        return run

    def go(self):
        self.load_start = loadavg()
        self.load_max = float(self.load_start.split()[0])
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.probe()
        profs = self.profilers()
        variants = [("none", 0)] + [(p, hz) for hz in RATES for p in profs]
        self.runs = []
        reps = self.args.reps or (3 if self.args.quick else 5)
        self.reps = reps
        for wl_name, wl_args in self.workloads():
            for rep in range(reps):
                k = rep % len(variants)
                for profiler, hz in variants[k:] + variants[:k]:
                    run = self.run(wl_name, wl_args, profiler, hz, rep)
                    self.runs.append(run)
                    self.load_max = max(self.load_max, float(loadavg().split()[0]))
                    status = "ok" if run.ok else "FAILED " + run.error
                    log("%-9s rep %d  %-12s %4s Hz  wall %.3fs  %s" % (
                        wl_name, rep, profiler, hz or "-", run.r("wall_s"), status))
        self.load_end = loadavg()
        self.finished = datetime.datetime.now(datetime.timezone.utc)
        with open(os.path.join(self.outdir, "runs.json"), "w") as f:
            json.dump([vars(r) for r in self.runs], f, indent=1, default=str)

    # -- the report ----------------------------------------------------------
    def report(self):
        by_key = {}
        for r in self.runs:
            by_key.setdefault((r.workload, r.profiler, r.hz), []).append(r)
        none = {(r.workload, r.rep): r for r in self.runs if r.profiler == "none" and r.ok}

        def med(xs):
            xs = [x for x in xs if x is not None]
            return statistics.median(xs) if xs else None

        def fmt(x, spec, suffix=""):
            return "—" if x is None else format(x, spec) + suffix

        rows = []
        rows.append("| workload | profiler | rate | wall × | CPU × | run CPU × "
                    "| start / stop CPU ms | peak RSS KiB (Δ) | own CPU, % core "
                    "| samples/s (% of expected) | signals/s | profile CPU vs OS "
                    "| complete stacks | µs/sample |")
        rows.append("|" + "---|" * 14)
        base_rows = ["| workload | wall s | CPU s | run wall s | run CPU s | peak RSS KiB "
                     "| workers' CPU s |",
                     "|---|---|---|---|---|---|---|"]
        seen_wl = []
        for r in self.runs:
            if r.workload not in seen_wl:
                seen_wl.append(r.workload)
        order = {p: i for i, p in enumerate(
            ["inprof", "inprof-dwarf", "inprof-fp", "gperftools", "dropin", "perf"])}

        def residual(run):  # CPU outside the measured phase and Stop(): start, exit
            return run.r("run_cpu_s") - run.r("cpu_s") - run.r("stop_cpu_s")

        for wl in seen_wl:
            idle = wl.startswith("idle")
            base = [none[(wl, rep)] for rep in range(self.reps) if (wl, rep) in none]
            if not base:
                continue
            base_rows.append("| %s | %.3f | %.3f | %.3f | %.3f | %d | %.3f |" % (
                wl, med(b.r("wall_s") for b in base), med(b.r("cpu_s") for b in base),
                med(b.run_wall_s for b in base), med(b.os_cpu_s for b in base),
                med(b.r("maxrss_kib") for b in base), med(b.r("workers_cpu_s") for b in base)))
            none_rss = med(b.r("maxrss_kib") for b in base)
            keys = [k for k in by_key if k[0] == wl and k[1] != "none"]
            keys.sort(key=lambda k: (k[2], order.get(k[1], 99)))
            for key in keys:
                runs = by_key[key]
                good = [r for r in runs if r.ok and (wl, r.rep) in none]
                label = "| %s | %s | %d Hz |" % (wl, key[1], key[2])
                if not good:
                    rows.append(label + " failed: %s |" % (runs[0].error or "no baseline")
                                + " |" * 10)
                    continue
                v = {k: [] for k in ("wall_x", "cpu_x", "run_cpu_x", "start", "stop", "rss",
                                     "own", "sps", "expected", "sig", "err", "err_ms",
                                     "os_ms", "complete", "per_sample", "perf_run",
                                     "own_collect", "own_tick", "perf_fixed")}
                for r in good:
                    b = none[(wl, r.rep)]
                    inprof = r.profiler.startswith("inprof")
                    perf_extra = 0.0
                    if r.profiler == "perf":
                        # Not clamped at 0: beyond its fixed cost perf's own
                        # CPU is small and noisy, and clamping would bias it up.
                        perf_total = r.os_cpu_s - r.r("run_cpu_s")
                        perf_fixed = self.perf_fixed_cpu_s.get(
                            r.profile["kernel_samples"] > 0, 0.0)
                        perf_extra = perf_total - perf_fixed
                        v["perf_fixed"].append(perf_fixed)
                        v["perf_run"].append(100 * perf_total / r.run_wall_s)
                    phase_cpu = r.r("cpu_s") + perf_extra
                    v["wall_x"].append(r.r("wall_s") / b.r("wall_s"))
                    v["cpu_x"].append(phase_cpu / b.r("cpu_s"))
                    v["run_cpu_x"].append(r.os_cpu_s / b.os_cpu_s)
                    if inprof:
                        v["start"].append(1e3 * r.r("start_cpu_s"))
                    elif r.profiler in ("gperftools", "dropin"):
                        v["start"].append(1e3 * (residual(r) - residual(b)))
                    v["stop"].append(1e3 * r.r("stop_cpu_s"))
                    v["rss"].append(r.r("maxrss_kib"))
                    if inprof:
                        v["own"].append(100 * r.r("prof_threads_cpu_s") / r.r("wall_s"))
                        per_thread = {}
                        for item in r.result.get("prof_thread_cpu", "-").split(","):
                            if ":" in item:
                                name, cpu = item.rsplit(":", 1)
                                name = name.replace("inprof-", "")
                                per_thread[name] = per_thread.get(name, 0.0) + float(cpu)
                        for name in ("collect", "tick"):
                            v["own_" + name].append(
                                100 * per_thread.get(name, 0.0) / r.r("wall_s"))
                    elif r.profiler == "perf":
                        v["own"].append(100 * perf_extra / r.r("wall_s"))
                    p = r.profile
                    v["sps"].append(p["samples"] / r.r("wall_s"))
                    signals = r.r("samples_taken") if r.profiler != "perf" else p["samples"]
                    v["sig"].append(signals / r.r("wall_s"))
                    workers_cpu = r.r("workers_cpu_s")
                    if workers_cpu * r.hz >= 20:
                        v["expected"].append(100 * p["samples"] / (workers_cpu * r.hz))
                    if idle:
                        v["err_ms"].append(1e3 * p["cpu_s"])
                        v["os_ms"].append(1e3 * workers_cpu)
                    elif workers_cpu > 0:
                        v["err"].append(100 * (p["cpu_s"] - workers_cpu) / workers_cpu)
                    if p["chain"] >= 20:
                        v["complete"].append(100.0 * p["complete"] / p["chain"])
                    if not idle and signals >= 50:
                        v["per_sample"].append(1e6 * (phase_cpu - b.r("cpu_s")) / signals)
                m = {k: med(x) for k, x in v.items()}
                rss_s = "%d (%+d)" % (m["rss"], m["rss"] - none_rss)
                if key[1] == "perf":
                    rss_s += "; perf itself %d" % med(r.os_maxrss_kib for r in good)
                if key[1] == "perf":
                    start_s = "perf: %.0f of its %.0f" % (
                        1e3 * m["perf_fixed"],
                        1e3 * med(r.os_cpu_s - r.r("run_cpu_s") for r in good))
                elif key[1] in ("gperftools", "dropin"):
                    start_s = "≈%s / %s" % (fmt(m["start"], ".0f"), fmt(m["stop"], ".1f"))
                else:
                    start_s = "%s / %s" % (fmt(m["start"], ".0f"), fmt(m["stop"], ".0f"))
                own_s = fmt(m["own"], ".2f", "%") if v["own"] else "— (in handler)"
                if key[1] == "dropin":
                    own_s = "— (in CPU ×)"
                if v["own_collect"]:
                    own_s += " (collect %.2f, tick %.2f)" % (m["own_collect"], m["own_tick"])
                if key[1] == "perf":
                    own_s = "%s of the run; %s beyond fixed" % (
                        fmt(m["perf_run"], ".1f", "%"), fmt(m["own"], "+.2f", "%"))
                sps_s = fmt(m["sps"], ".0f")
                if m["expected"] is not None and not idle:
                    sps_s += " (%.0f%%)" % m["expected"]
                sig_s = "—" if key[1] == "perf" else fmt(m["sig"], ".0f")
                if idle:
                    err_s = "%s vs %s ms" % (fmt(m["err_ms"], ".0f"), fmt(m["os_ms"], ".0f"))
                else:
                    err_s = fmt(m["err"], "+.1f", "%")
                failed = len(runs) - len(good)
                note = " (%d failed)" % failed if failed else ""
                rows.append(label + " %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    fmt(m["wall_x"], ".3f") + note, fmt(m["cpu_x"], ".3f"),
                    fmt(m["run_cpu_x"], ".3f"), start_s, rss_s, own_s, sps_s, sig_s, err_s,
                    fmt(m["complete"], ".1f", "%"), fmt(m["per_sample"], ".1f")))
        return rows, base_rows

    def write(self):
        rows, base_rows = self.report()
        cpu_model = "?"
        for line in read_text("/proc/cpuinfo").splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        hz = "?"
        config = read_text("/boot/config-" + os.uname().release)
        if not config:
            try:
                with gzip.open("/proc/config.gz", "rt") as f:
                    config = f.read()
            except OSError:
                pass
        for line in config.splitlines():
            if line.startswith("CONFIG_HZ="):
                hz = line.split("=")[1]
        busy = ""
        if self.load_max > 1.5:
            busy = (" **The machine was busy at times** (1-min load average above 1.5 on %d "
                    "cores, other builds running): ratios carry that noise; the interleaving "
                    "spreads it over all profilers alike." % os.cpu_count())
        lines = [
            "# inprof overhead and accuracy vs gperftools and perf%s" % (
                " (--quick)" if self.args.quick else ""),
            "",
            "- date: %s → %s (UTC)" % (self.started.strftime("%Y-%m-%d %H:%M"),
                                      self.finished.strftime("%H:%M")),
            "- command: `%s`" % self.args.command,
            "- machine: nproc %d, %s, kernel %s (CONFIG_HZ=%s)" % (
                os.cpu_count(), cpu_model, os.uname().release, hz),
            "- load average (1/5/15 min) at start: %s; at end: %s; highest 1-min value "
            "read after each run: %.2f.%s" % (self.load_start, self.load_end, self.load_max,
                                              busy),
            "- repetitions: %d per row, interleaved (round-robin over all rows of a workload, "
            "rotated each repetition); medians" % self.reps,
            "- inprof: %s; `INPROF_CPU_PERIOD` 10ms / 1ms, everything else default "
            "(wall sampling every 10 ms, 5 threads per tick; export at Stop)" % "; ".join(
                "`%s` = %s" % (k, v) for k, v in self.engines.items()),
            "- gperftools: %s, `CPUPROFILE_FREQUENCY` 100 / 1000 (it accepts up to 4000), "
            "process-wide ITIMER_PROF (its default), stack method `%s`, `ProfilerStop()` "
            "called before the end" % (
                tool_version(["pkg-config", "--modversion", "libprofiler"]), self.gperf_method),
            "- dropin: the gperftools build of the workload linked with inprof's drop-in "
            "(`pkg-config inprof-gperftools`) instead of -lprofiler; the same `CPUPROFILE`, "
            "`CPUPROFILE_FREQUENCY` 100 / 1000; CPU only (no wall sampling), per-thread "
            "task-clock periods; its collector's CPU is in CPU ×",
            "- perf: %s, `perf record -g -e cpu-clock -F 100 / 1000` (frame-pointer call "
            "graphs) around the unprofiled program" % tool_version(["perf", "--version"]),
            "- workload calibration: one 42-frame descent = %.0f ns of CPU" % self.ns_per_call,
            "- perf's fixed cost (its own CPU recording a run that does nothing; medians of 10 "
            "probes): %s ms with no sample in the kernel, %s ms with one (perf then reads the "
            "kernel's symbols)" % tuple(
                "%.0f" % (1e3 * self.perf_fixed_cpu_s[c]) if c in self.perf_fixed_cpu_s else "?"
                for c in (False, True)),
        ]
        inprof_runs = [r for r in self.runs if r.ok and r.profiler.startswith("inprof")]
        if inprof_runs:
            lines.append(
                "- inprof's own counters over its %d runs: samples dropped (ring full) %d, "
                "stacks truncated %d" % (
                    len(inprof_runs), sum(int(r.r("samples_dropped")) for r in inprof_runs),
                    sum(int(r.r("stacks_truncated")) for r in inprof_runs)))
        for name, reason in self.unavailable.items():
            lines.append("- **%s: unavailable**: %s" % (name, reason))
        for n in self.notes:
            lines.append("- " + n)
        lines += ["", "Baselines (`none`, medians):", ""] + base_rows
        lines += ["", "Columns: see bench/overhead/README.md. Ratios are profiled ÷ `none` of the "
                  "same repetition.", ""] + rows
        text = "\n".join(lines) + "\n"
        out = self.args.output
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text)
        print(text)
        log("written to %s (raw runs: %s)" % (out, os.path.join(self.outdir, "runs.json")))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--quick", action="store_true", help="3 repetitions, shorter work")
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--output", default="")
    ap.add_argument("--command", default=" ".join(sys.argv))
    ap.add_argument("--workloads", default="", help="comma-separated subset, e.g. cpu-1,idle-1000")
    ap.add_argument("--profilers", default="", help="comma-separated subset")
    ap.add_argument("--keep", action="store_true", help="keep the profiles of every run")
    args = ap.parse_args()
    if not args.output:
        here = os.path.dirname(os.path.abspath(__file__))
        args.output = (os.path.join(os.path.abspath(args.build_dir), "overhead-quick.md")
                       if args.quick else os.path.join(here, "results.md"))
    h = Harness(args)
    h.go()
    h.write()


if __name__ == "__main__":
    main()
