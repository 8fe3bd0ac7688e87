"""CPU time per asyncio put, for comparing builds of the client on a
noisy machine (``python -m sluice.bench_cpu --addr A``).

``--tasks`` asyncio tasks put ``--size``-byte values for ``--seconds``;
over the middle half of the run this process's CPU time (all threads,
``getrusage``) and, given ``--node-pid``, the node's (``/proc``) are
divided by the puts made meanwhile. Throughput on a shared machine
swings with its other tenants; CPU per put swings less, and two builds
run at once (``scripts/pair-python-builds``) meet the same spells.
"""

import argparse
import asyncio
import json
import os
import resource
import time

import sluice


def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _node_s(pid):
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(addr, io, tasks, size, seconds, node_pid=None):
    """Puts from ``tasks`` tasks for ``seconds``; returns ops/s, client
    and node CPU µs per put, and voluntary context switches per put, all
    over the middle half of the run."""
    c = await sluice.AsyncClient.connect(addr, io=io)
    try:
        value = os.urandom(size)
        start = time.monotonic()
        done = [0]
        marks = []

        async def worker(t):
            n = 0
            while time.monotonic() - start < seconds:
                await c.put(f"/vol/bench-cpu/{os.getpid()}/{t}/{n % 64}", value)
                n += 1
                done[0] += 1

        async def sampler():
            for wait in (seconds / 4, seconds / 2):
                await asyncio.sleep(wait)
                r = resource.getrusage(resource.RUSAGE_SELF)
                marks.append((done[0], _cpu_s(), _node_s(node_pid), r.ru_nvcsw, time.monotonic()))

        await asyncio.gather(sampler(), *(worker(t) for t in range(tasks)))
    finally:
        c.close()
    (n0, c0, s0, v0, t0), (n1, c1, s1, v1, t1) = marks
    puts = max(n1 - n0, 1)
    return {
        "io": "loop" if c._driven else "threads",
        "ops_per_s": puts / (t1 - t0),
        "client_cpu_us": (c1 - c0) / puts * 1e6,
        "node_cpu_us": (s1 - s0) / puts * 1e6 if node_pid is not None else None,
        "voluntary_switches": (v1 - v0) / puts,
        "puts": puts,
        "package": os.path.dirname(sluice.__file__),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=sluice.default_address())
    ap.add_argument("--io", default="auto", choices=["auto", "loop", "threads"])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--size", type=int, default=10 * 1024)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--node-pid", type=int, help="the node's process, to count its CPU too")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.tasks < 1 or a.size < 0 or a.seconds <= 0:
        ap.error("--tasks must be at least 1, --size not negative, --seconds positive")
    r = asyncio.run(measure(a.addr, a.io, a.tasks, a.size, a.seconds, a.node_pid))
    if a.json:
        print(json.dumps(r))
        return
    node = f"  node {r['node_cpu_us']:5.1f} µs/put" if r["node_cpu_us"] is not None else ""
    print(
        f"io={r['io']:7} {r['ops_per_s']:8.0f} puts/s  client {r['client_cpu_us']:5.1f} µs/put"
        f"{node}  {r['voluntary_switches']:.2f} switches/put"
    )


if __name__ == "__main__":
    main()
