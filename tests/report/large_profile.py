#!/usr/bin/env python3
"""Writes a pprof profile (raw protobuf) with N distinct stacks:

    large_profile.py N OUT.pb

20 to 40 frames deep through 5,000 function names (a fixed seed, so the
same file every time), two sample types (cpu-time, wall-time) and 8 named
threads: the flame graph page's worst case in tests/report/report_test.cc."""
import random
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, payload):  # length-delimited
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def uint(num, n):
    return varint(num << 3) + varint(n)


def packed(num, values):
    return field(num, b"".join(varint(v) for v in values))


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(20261122)
    strings = ["", "cpu-time", "nanoseconds", "wall-time", "thread name"]
    functions = ["Fn%04d_%s" % (i, rng.choice(["Parse", "Encode", "Lookup", "Hash", "Sort",
                                              "Read", "Write", "Alloc"]))
                 for i in range(5000)]
    fn_base = len(strings)
    strings += functions
    thread_base = len(strings)
    strings += ["worker-%d" % i for i in range(8)]
    roots = ["main"] + ["Handler%02d" % i for i in range(30)]
    root_base = len(strings)
    strings += roots
    body = bytearray()
    body += field(1, uint(1, 1) + uint(2, 2))
    body += field(1, uint(1, 3) + uint(2, 2))
    seen = set()
    while len(seen) < n:
        depth = rng.randint(20, 40)
        # A few wide levels at the root, then paths that share prefixes.
        stack = [root_base + rng.randrange(len(roots))]
        stack += [fn_base + rng.randrange(40) for _ in range(3)]
        stack += [fn_base + rng.randrange(len(functions)) for _ in range(depth - 4)]
        key = tuple(stack)
        if key in seen:
            continue
        seen.add(key)
        cpu = rng.randint(1, 50) * 1000000
        # location ids = string index (one location per function), leaf first
        sample = packed(1, list(reversed(stack)))
        sample += packed(2, [cpu, cpu + rng.randint(0, 20) * 1000000])
        sample += field(3, uint(1, 4) + uint(2, thread_base + rng.randrange(8)))
        body += field(2, sample)
    for sid in list(range(fn_base, fn_base + len(functions))) + list(
            range(root_base, root_base + len(roots))):
        body += field(4, uint(1, sid) + field(4, uint(1, sid)))  # location
        body += field(5, uint(1, sid) + uint(2, sid))            # function
    for s in strings:
        body += field(6, s.encode())
    with open(out, "wb") as f:
        f.write(body)


if __name__ == "__main__":
    main()
