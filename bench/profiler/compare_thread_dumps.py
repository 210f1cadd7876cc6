#!/usr/bin/env python3
"""A thread dump of a program with N threads, side by side: inprof's live
dump (`inprof stacks PID`, /debug/pprof/threads?debug=2), eu-stack -p PID
(elfutils) and gdb -batch -ex 'thread apply all bt' -p PID, on the same
program (bench/profiler/thread_dump_program.cc). For each: the tool's wall
time; for inprof's, the time the program spent on the dump and the
dumping thread's CPU (the dump's comment line); the threads whose stacks
it printed; and the longest the program's heartbeat thread was kept from
running meanwhile (how long the program was stopped). Medians of RUNS
rounds.

  python3 bench/profiler/compare_thread_dumps.py BUILD_DIR [THREADS] [RUNS]
"""
import re
import shutil
import statistics
import subprocess
import sys
import time


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    program = subprocess.Popen([f"{build}/bench/thread_dump_program", str(threads)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = program.stdout.readline().split()
    if not ready or ready[0] != "ready":
        sys.exit(f"thread_dump_program did not start: {ready}")
    pid = ready[1]

    def stall_us():
        program.stdin.write("\n")
        program.stdin.flush()
        return int(program.stdout.readline().split()[1])

    tools = [("inprof stacks", [f"{build}/src/cli/inprof", "stacks", pid])]
    if shutil.which("eu-stack"):
        tools.append(("eu-stack -p", ["eu-stack", "-p", pid]))
    if shutil.which("gdb"):
        tools.append(("gdb thread apply all bt",
                      ["gdb", "-batch", "-nx", "-ex", "thread apply all bt", "-p", pid]))
    print(f"{threads} threads (+ heartbeat, main), pid {pid}, medians of {runs}")
    print(f"{'tool':26} {'wall ms':>9} {'in-process ms':>14} {'its CPU ms':>11} {'threads':>8} "
          f"{'stall ms':>9}")
    for name, cmd in tools:
        walls, inside, cpus, counts, stalls = [], [], [], [], []
        for _ in range(runs):
            stall_us()  # reset
            start = time.monotonic()
            out = subprocess.run(cmd, capture_output=True, text=True)
            walls.append((time.monotonic() - start) * 1000)
            stalls.append(stall_us() / 1000)
            text = out.stdout
            if name.startswith("inprof"):
                m = re.search(r"registered threads in ([0-9.]+)(us|ms|s) \(([0-9.]+)(us|ms|s) of",
                              text)
                if m:
                    scale = {"us": 0.001, "ms": 1, "s": 1000}
                    inside.append(float(m.group(1)) * scale[m.group(2)])
                    cpus.append(float(m.group(3)) * scale[m.group(4)])
                counts.append(len(re.findall(r"^thread \d+ ", text, re.M)))
            elif name.startswith("eu-stack"):
                counts.append(len(re.findall(r"^TID \d+:", text, re.M)))
            else:
                counts.append(len(re.findall(r"^Thread \d+ ", text, re.M)))
        med_inside = f"{statistics.median(inside):14.1f}" if inside else f"{'-':>14}"
        med_cpu = f"{statistics.median(cpus):11.1f}" if cpus else f"{'-':>11}"
        print(f"{name:26} {statistics.median(walls):9.1f} {med_inside} {med_cpu} "
              f"{int(statistics.median(counts)):8d} {statistics.median(stalls):9.1f}")
    program.stdin.close()
    program.wait(timeout=60)


if __name__ == "__main__":
    main()
