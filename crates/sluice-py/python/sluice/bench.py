"""The Python client next to the Rust client, in one run against one node
(run by ``sluice bench python``, or ``python -m sluice.bench --addr A``):

- ``get`` of a 10 KB value, closed loop, one caller: p50/p99/p999 of the
  Python client (blocking) and of the Rust client;
- puts of 10 KB values for a few seconds from 16 asyncio tasks (Python,
  with the client's work on its I/O threads, ``io="threads"``, and on the
  event loop's thread, ``io="loop"``; which one ``io="auto"``, the
  default, picks here is reported) and 16 tokio tasks (Rust, on a
  runtime of its own with a worker per core, as a Rust program has),
  taking turns over a few rounds: ops/s, and this process's CPU time per
  put (all its threads).
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


class Phase:
    """One client's put phases, summed over the rounds: ops/s, and CPU µs
    per put (all of this process's threads, ``getrusage``)."""

    def __init__(self):
        self.ops = self.seconds = self.cpu = 0.0

    def run(self, f):
        """Runs ``f()``, which returns its ops/s."""
        c0, t0 = cpu_s(), time.monotonic()
        rate = f()
        elapsed = time.monotonic() - t0
        self.ops += rate * elapsed
        self.seconds += elapsed
        self.cpu += cpu_s() - c0

    @property
    def rate(self):
        return self.ops / max(self.seconds, 1e-9)

    @property
    def cpu_us(self):
        return self.cpu / max(self.ops, 1) * 1e6


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
    ap.add_argument("--seconds", type=float, default=3.0, help="each client's put time, in all")
    ap.add_argument("--rounds", type=int, default=3, help="turns the put phases take")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1 or a.seconds <= 0:
        ap.error("--rounds must be at least 1 and --seconds positive")

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
    # The three clients take turns, in rounds, so that this machine's
    # drift hits all of them alike.
    threads, on_loop, rust = Phase(), Phase(), Phase()
    each = a.seconds / a.rounds
    for _ in range(a.rounds):
        for phase, io, prefix in ((threads, "threads", "p"), (on_loop, "loop", "l")):
            phase.run(
                lambda: asyncio.run(
                    async_puts(a.addr, f"/vol/bench-py/{prefix}", a.size, a.tasks, each, io)
                )
            )
        rust.run(
            lambda: _sluice._rust_put_throughput(a.addr, "/vol/bench-py/r", a.size, a.tasks, each)
        )
    py_put, py_cpu = threads.rate, threads.cpu_us
    loop_put, loop_cpu = on_loop.rate, on_loop.cpu_us
    rust_put, rust_cpu = rust.rate, rust.cpu_us
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
        "rounds": a.rounds,
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"get {a.size // 1024} KB, one caller, closed loop ({a.gets} each), µs:")
    print(f"  {'':8} {'p50':>8} {'p99':>8} {'p999':>8}")
    for name, s in (("python", py_get), ("rust", rust_get)):
        print(f"  {name:8} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
    print(f"  python / rust at p50: {result['get_us']['ratio_p50']:.2f}x  (target <= 1.3x)")
    print(f"put {a.size // 1024} KB, {a.tasks} concurrent tasks, {a.seconds:.0f} s each in {a.rounds} rounds:")
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
