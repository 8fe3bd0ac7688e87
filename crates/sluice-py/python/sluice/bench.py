"""The Python client next to the Rust client, in one run against one node
(run by ``sluice bench python``, or ``python -m sluice.bench --addr A``):

- ``get`` of a 10 KB value, closed loop, one caller: p50/p99/p999 of the
  Python client (blocking) and of the Rust client;
- puts of 10 KB values for a few seconds from 16 asyncio tasks (Python,
  with the client's work on its I/O threads, ``io="threads"``, and on the
  event loop's thread, ``io="loop"``; which one ``io="auto"``, the
  default, picks here is reported) and 16 tokio tasks (Rust, on a
  runtime of its own with a worker per core, as a Rust program has):
  ops/s, and this process's CPU time per put (all its threads).
"""

import argparse
import asyncio
import json
import os
import resource
import time

import sluice
from sluice import _sluice


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def summary(ns):
    return {p: pct(ns, p) / 1000 for p in (50, 99, 99.9)}


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measured(f):
    """(ops/s, CPU µs per op) of ``f()``, which returns its ops/s and
    runs for ``seconds``."""
    c0, t0 = cpu_s(), time.monotonic()
    rate = f()
    ops = rate * (time.monotonic() - t0)
    return rate, (cpu_s() - c0) / max(ops, 1) * 1e6


async def async_puts(addr, prefix, size, tasks, seconds, io):
    c = await sluice.AsyncClient.connect(addr, io=io)
    value = os.urandom(size)
    until = time.monotonic() + seconds
    counts = [0] * tasks

    async def worker(t):
        n = 0
        while time.monotonic() < until:
            await c.put(f"{prefix}/{t}/{n % 64}", value)
            n += 1
        counts[t] = n

    t0 = time.monotonic()
    await asyncio.gather(*(worker(t) for t in range(tasks)))
    return sum(counts) / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=sluice.default_address())
    ap.add_argument("--gets", type=int, default=20000)
    ap.add_argument("--size", type=int, default=10 * 1024)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    c = sluice.Client(a.addr)
    key = "/vol/bench-py/get"
    c.put(key, os.urandom(a.size))
    # Warm both clients up, then alternate halves so drift hits both.
    for _ in range(1000):
        c.get(key)
    _sluice._rust_get_latencies(a.addr, key, 1000)
    py_ns, rust_ns = [], []
    half = a.gets // 2
    for _ in range(2):
        for _ in range(half):
            t0 = time.perf_counter_ns()
            c.get(key)
            py_ns.append(time.perf_counter_ns() - t0)
        rust_ns += _sluice._rust_get_latencies(a.addr, key, half)
    py_put, py_cpu = measured(
        lambda: asyncio.run(
            async_puts(a.addr, "/vol/bench-py/p", a.size, a.tasks, a.seconds, "threads")
        )
    )
    loop_put, loop_cpu = measured(
        lambda: asyncio.run(
            async_puts(a.addr, "/vol/bench-py/l", a.size, a.tasks, a.seconds, "loop")
        )
    )
    rust_put, rust_cpu = measured(
        lambda: _sluice._rust_put_throughput(a.addr, "/vol/bench-py/r", a.size, a.tasks, a.seconds)
    )
    py_get, rust_get = summary(py_ns), summary(rust_ns)
    result = {
        "get_us": {"python": py_get, "rust": rust_get, "ratio_p50": py_get[50] / rust_get[50]},
        "put_ops_per_s": {
            "python": py_put,
            "python_loop": loop_put,
            "rust": rust_put,
            "ratio": py_put / rust_put,
            "ratio_loop": loop_put / rust_put,
            "default_io": sluice.default_io(),
            "ratio_default": (loop_put if sluice.default_io() == "loop" else py_put) / rust_put,
        },
        "put_cpu_us": {"python": py_cpu, "python_loop": loop_cpu, "rust": rust_cpu},
        "size": a.size,
        "tasks": a.tasks,
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"get {a.size // 1024} KB, one caller, closed loop ({a.gets} each), µs:")
    print(f"  {'':8} {'p50':>8} {'p99':>8} {'p999':>8}")
    for name, s in (("python", py_get), ("rust", rust_get)):
        print(f"  {name:8} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
    print(f"  python / rust at p50: {result['get_us']['ratio_p50']:.2f}x  (target <= 1.3x)")
    print(f"put {a.size // 1024} KB, {a.tasks} concurrent tasks, {a.seconds:.0f} s:")
    print(f"  {'':31} {'ops/s':>8} {'CPU µs/put':>11}")
    for name, rate, cpu in (
        ('python (asyncio, io="threads")', py_put, py_cpu),
        ('python (asyncio, io="loop")', loop_put, loop_cpu),
        ("rust (tokio)", rust_put, rust_cpu),
    ):
        print(f"  {name:31} {rate:8.0f} {cpu:11.1f}")
    r = result["put_ops_per_s"]
    print(
        f"  python / rust: threads {r['ratio']:.2f}x, loop {r['ratio_loop']:.2f}x; "
        f"the default here (io=\"{r['default_io']}\"): {r['ratio_default']:.2f}x  (target >= 0.7x)"
    )


if __name__ == "__main__":
    main()
