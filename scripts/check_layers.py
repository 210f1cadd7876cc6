#!/usr/bin/env python3
"""Checks that inprof's dependencies point one way, from the base up.

Every source and header under src/ and include/inprof/ belongs to one
component (by its folder, or for the headers in include/inprof/ and
include/inprof/internal/, by the table below), and each component to a
layer. An #include may reach its own component, a component of a lower
layer, or a peer of the same layer, and the components' graph must have no
cycle. A file this script cannot place is an error too: a new header is
given its component here.

Besides, the core's files (CORE_FILES) name no attachment.

  python3 scripts/check_layers.py [REPO]      exit 0: clean; 1: each
                                              offending include on a line
"""
import os
import re
import sys

# Lowest first. Peers share a layer.
LAYERS = [
    ["base"],
    # alloc: the allocation profiler's core (GOT patching, byte countdown,
    # live-heap table); it may use base and, for the sampled path's stack
    # walk, unwind.
    ["sampling", "unwind", "symbolize", "export", "alloc"],
    # heap: the allocation provider (alloc's hooks as a SampleProvider);
    # locks: the lock-wait provider (alloc's lock hooks, the same way).
    ["pipeline", "heap", "locks"],
    ["upload", "serve", "agent"],
    ["profiler"],
    ["run", "gperftools", "cli"],
]
RANK = {c: i for i, layer in enumerate(LAYERS) for c in layer}

# The core knows no attachment (issue 61, item 2): the agent, the live
# endpoint and the uploaders attach to the pipeline through hooks it
# declares (PipelineAttachment: Connect, the threads' ring memory, the
# served address), and one place above the core wires them for a profiler
# (internal/composition.h, ComposePipeline). These files name none of
# them, in code or in comments.
CORE_FILES = ["include/inprof/profiler.h", "include/inprof/internal/profiler_base.h",
              "src/profiler/profiler_base.cc", "src/pipeline/"]
ATTACHMENT_NAMES = re.compile(r"agent|composition|endpoint|upload", re.IGNORECASE)

# Components of the headers in include/inprof/ (public) and
# include/inprof/internal/; include/inprof/base/ is base.
HEADERS = {
    "base": ["options"],
    "sampling": [
        "sample_provider", "spsc_ring", "cpu_time_provider", "wall_time_provider",
        "tick_provider",
        "sample_aggregator", "labels", "signal_dispatch", "pending_slots", "thread_info", "label_table",
        "sample_record", "cpu_lattice", "thread_slot_windows", "event_stack", "event_stack_table",
        "sample_provider_windows", "cpu_time_provider_windows",
        "wall_time_provider_windows"],
    "unwind": [
        "unwinder", "frame_pointer_unwinder", "dwarf_unwinder", "cfi_table", "cfi_rule", "cfi_walk",
        "leaf_frame_resolver", "dwarf_registers", "machine_context", "thread_snapshot_windows",
        "unwind_snapshot_windows", "os_unwinder_windows"],
    "symbolize": ["symbolizer", "line_table", "process_maps"],
    "export": ["pprof_writer", "pprof_reader", "sink", "profile_data", "proto_wire",
               "legacy_heap"],
    "pipeline": ["pipeline", "thread_dump_text"],
    "upload": ["datadog_uploader", "pyroscope_uploader", "uploader", "http_client",
               "upload_util", "sinks_from_options"],
    "serve": ["debug_endpoint", "endpoint_attachment", "dump_signal"],
    "agent": ["agent_link", "agent_protocol", "agent_stream", "agent_forwarding"],
    "profiler": [
        "profiler", "inprof", "profiler_common", "profiler_base", "profiler_collector",
        "profiler_collector_windows", "profiler_layout", "profiler_layout_windows",
        "profiler_sampler_windows", "profiler_control", "provider_set", "provider_table",
        "profiler_visits", "sample_handler",
        "wall_ticker", "wall_ticker_thread", "composition", "profiler_windows"],
    "gperftools": ["profiler_gperftools"],
}
HEADER_COMPONENT = {name: c for c, names in HEADERS.items() for name in names}

# src/ folders and their components.
SRC_COMPONENT = {
    "base": "base", "sampling": "sampling", "unwind": "unwind",
    "symbolize": "symbolize", "export": "export", "report": "export", "alloc": "alloc",
    "heap": "heap", "locks": "locks", "pipeline": "pipeline", "upload": "upload", "serve": "serve", "agent": "agent",
    "profiler": "profiler", "run": "run", "gperftools": "gperftools", "cli": "cli",
    "pch": None,  # the precompiled header: standard and Abseil headers only
}
# src/platform/windows: the Windows backend's parts, by file.
WINDOWS_FILES = {
    "thread_info_windows": "sampling", "thread_snapshot_windows": "unwind",
    "sample_providers_windows": "sampling", "os_unwinder_windows": "unwind",
    "autoregister_dll_windows": "run",
}


def component_of(path):
    """The component of a repository path, or None when it has none."""
    parts = path.split("/")
    base = os.path.splitext(parts[-1])[0]
    if parts[0] == "src":
        if parts[1] == "platform":
            return WINDOWS_FILES.get(base, "?")
        return SRC_COMPONENT.get(parts[1], "?")
    if parts[:2] == ["include", "inprof"]:
        if parts[2] == "base":
            return "base"
        if parts[2] == "gperftools":
            return "gperftools"
        if parts[2] == "alloc":
            return "alloc"
        if parts[2] == "heap":
            return "heap"
        if parts[2] == "locks":
            return "locks"
        return HEADER_COMPONENT.get(base, "?")
    return "?"


def include_path(inc):
    return inc if inc.startswith("src/") else "include/" + inc


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    os.chdir(repo)
    files = []
    for top in ("src", "include/inprof"):
        for root, _, names in os.walk(top):
            files += [os.path.join(root, n) for n in names if n.endswith((".h", ".cc"))]
    errors = []
    edges = {}
    for f in sorted(files):
        src = component_of(f)
        if src is None:
            continue
        if src == "?":
            errors.append(f"{f}: no component (give it one in scripts/check_layers.py)")
            continue
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                m = re.match(r'\s*#\s*include\s+"((?:inprof|src)/[^"]+)"', line)
                if not m:
                    continue
                dst = component_of(include_path(m.group(1)))
                if dst in (None, src):
                    continue
                if dst == "?":
                    errors.append(f"{f}:{n}: {m.group(1)} has no component")
                    continue
                edges.setdefault(src, {}).setdefault(dst, f"{f}:{n}")
                if RANK[dst] > RANK[src]:
                    errors.append(f"{f}:{n}: {src} (layer {RANK[src]}) includes "
                                  f"{m.group(1)} of {dst} (layer {RANK[dst]}): upward")
    for f in sorted(files):
        if not any(f == c or (c.endswith("/") and f.startswith(c)) for c in CORE_FILES):
            continue
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                m = ATTACHMENT_NAMES.search(line)
                if m:
                    errors.append(f"{f}:{n}: names '{m.group(0)}': the core reaches its "
                                  "attachments through PipelineAttachment only")
    # Peers may depend on each other one way only: no cycle.
    state = {}

    def visit(c, stack):
        state[c] = 1
        for d in sorted(edges.get(c, {})):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d] if d in stack else [c, d]
                errors.append("cycle: " + " -> ".join(cycle) + " (" + ", ".join(
                    edges[a][b] for a, b in zip(cycle, cycle[1:])) + ")")
            elif d not in state:
                visit(d, stack + [d])
        state[c] = 2

    for c in sorted(edges):
        if c not in state:
            visit(c, [c])
    for e in errors:
        print(e)
    if not errors:
        print(f"{len(files)} files, {sum(len(v) for v in edges.values())} component "
              "dependencies, all pointing down or across without a cycle")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
