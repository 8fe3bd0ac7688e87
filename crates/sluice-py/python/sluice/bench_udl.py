"""Python lambdas next to Rust ones, in one run against one node (run by
``sluice bench python-udl``, or ``python -m sluice.bench_udl --addr A``):

- a no-op stage: trigger put -> lambda -> emit -> the next stage (a watch
  on its output), closed loop, at 10 KB and 1 MB: the Python ``Noop``
  (emits the object it received) and Rust's ``relay``, alternating;
- stage throughput of a Python lambda that burns ~1 ms of CPU per call,
  with 1 and 2 worker processes;
- optionally (``--ray``) a Ray actor call carrying the same 10 KB.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

import sluice

NOOP_SRC = '''
class Noop:
    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, **kw):
        emit(key[len(pathname):], blob)


class Burn:
    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key, pathname, blob, emit, **kw):
        t = __import__("time").perf_counter() + 0.001
        while __import__("time").perf_counter() < t:
            pass
        emit(key[len(pathname):], b"done")
'''


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


SPIN_US = None


def deploy(c, code_dir, gid, src, dst, udl, cls=None, workers=1):
    conf = {}
    if udl == "python":
        conf = {"python_path": [code_dir], "module": "bench_udls", "entry_class": cls, "workers": workers}
        if SPIN_US is not None:
            conf["spin_us"] = SPIN_US
    c.dfg_apply(
        json.dumps(
            {
                "graphs": [
                    {
                        "id": gid,
                        "graph": [
                            {
                                "pathname": src,
                                "user_defined_logic_list": [udl],
                                "user_defined_logic_config_list": [conf],
                                "destinations": [{dst: "trigger_put"}],
                            }
                        ],
                    }
                ]
            }
        )
    )


def stage_latency(c, src, dst, size, n):
    """µs from trigger_put to the next stage's notification, one at a time."""
    value = os.urandom(size)
    out = []
    with c.watch(dst) as w:
        for i in range(n):
            t0 = time.perf_counter_ns()
            c.trigger_put(f"{src}/k", value)
            note = w.next(timeout=10)
            if note is None:
                raise RuntimeError("no output from the stage in 10 s")
            out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def throughput(c, src, dst, seconds):
    got = [0]
    stop = threading.Event()
    with c.watch(dst) as w:
        def count():
            while not stop.is_set():
                if w.next(timeout=0.2) is not None:
                    got[0] += 1
        t = threading.Thread(target=count)
        t.start()
        t0 = time.monotonic()
        sent = 0
        while time.monotonic() - t0 < seconds:
            # Keep a bounded backlog so the queue limits never refuse.
            if sent - got[0] < 64:
                c.trigger_put(f"{src}/k{sent % 16}", b"x")
                sent += 1
            else:
                time.sleep(0.0005)
        elapsed = time.monotonic() - t0
        n = got[0]
        stop.set()
        t.join()
    return n / elapsed


def ray_latency(size, n):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")

    @ray.remote
    class Echo:
        def call(self, v):
            return v

    a = Echo.remote()
    value = os.urandom(size)
    ray.get(a.call.remote(value))
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ray.get(a.call.remote(value))
        out.append((time.perf_counter_ns() - t0) / 1000)
    ray.shutdown()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=sluice.default_address())
    ap.add_argument("--n", type=int, default=2000, help="calls per size and variant")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ray", action="store_true", help="also measure a Ray actor call (needs ray)")
    ap.add_argument("--spin-us", type=int, help="the vertex's spin_us (default: the node's)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    global SPIN_US
    SPIN_US = a.spin_us
    c = sluice.Client(a.addr)
    code_dir = tempfile.mkdtemp(prefix="sluice-bench-udl-")
    with open(os.path.join(code_dir, "bench_udls.py"), "w") as f:
        f.write(NOOP_SRC)
    tag = uuid.uuid4().hex[:6]
    pools = {}
    for v in ("py", "rs", "burn"):
        pools[v] = (f"/bu-{v}-in-{tag}", f"/bu-{v}-out-{tag}")
        for p in pools[v]:
            c.create_object_pool(p, "trigger")
    deploy(c, code_dir, f"bu-py-{tag}", *pools["py"], "python", "Noop")
    deploy(c, code_dir, f"bu-rs-{tag}", *pools["rs"], "relay")
    result = {"stage_us": {}, "throughput": {}}
    for size in (10 * 1024, 1 << 20):
        n = a.n if size < (1 << 20) else max(200, a.n // 10)
        for v in ("py", "rs"):
            stage_latency(c, *pools[v], size, 50)  # warm up
        py, rs = [], []
        for _ in range(2):  # alternate halves: drift hits both
            py += stage_latency(c, *pools["py"], size, n // 2)
            rs += stage_latency(c, *pools["rs"], size, n // 2)
        result["stage_us"][size] = {
            "python": {p: pct(py, p) for p in (50, 99, 99.9)},
            "relay": {p: pct(rs, p) for p in (50, 99, 99.9)},
            "added_p50_us": pct(py, 50) - pct(rs, 50),
        }
    for workers in () if a.skip_throughput else (1, 2):
        deploy(c, code_dir, f"bu-burn-{tag}", *pools["burn"], "python", "Burn", workers=workers)
        throughput(c, *pools["burn"], 0.5)  # warm up
        result["throughput"][workers] = throughput(c, *pools["burn"], a.seconds)
    if result["throughput"]:
        result["scaling_1_to_2"] = result["throughput"][2] / result["throughput"][1]
    if a.ray:
        r = ray_latency(10 * 1024, a.n)
        result["ray_actor_us"] = {p: pct(r, p) for p in (50, 99, 99.9)}
        result["ray_over_python_stage_p50"] = pct(r, 50) / result["stage_us"][10 * 1024]["python"][50]
    for g in list(c.dfg_list()):
        if g["id"].endswith(tag):
            c.dfg_remove(g["id"])
    if a.json:
        print(json.dumps(result, indent=2))
        return
    for size, r in result["stage_us"].items():
        label = "10 KB" if size < (1 << 20) else "1 MB"
        print(f"no-op stage, {label} (trigger put -> lambda -> next stage), µs:")
        print(f"  {'':14} {'p50':>8} {'p99':>8} {'p999':>8}")
        for name in ("python", "relay"):
            s = r[name]
            print(f"  {name:14} {s[50]:8.1f} {s[99]:8.1f} {s[99.9]:8.1f}")
        print(f"  python adds {r['added_p50_us']:.1f} µs at p50 over Rust's relay")
    t = result["throughput"]
    if t:
        print(f"Python stage of ~1 ms CPU per call: 1 worker {t[1]:.0f}/s, 2 workers {t[2]:.0f}/s ({result['scaling_1_to_2']:.2f}x)")

    if a.ray:
        r = result["ray_actor_us"]
        print(f"Ray actor call, 10 KB: p50 {r[50]:.1f} µs, p99 {r[99]:.1f} µs: {result['ray_over_python_stage_p50']:.1f}x a Sluice Python stage at p50")


if __name__ == "__main__":
    main()
