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
import shutil
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


# The vertex settings given on the command line (spin_us, worker_spin_us).
VERTEX_SETTINGS = {}


def one_vertex_graph(gid, src, dst, udl, conf):
    """A DFG of one vertex at `src` running `udl` (with `conf`) that
    trigger-puts its output to `dst`, as `dfg apply` takes it."""
    vertex = {
        "pathname": src,
        "user_defined_logic_list": [udl],
        "user_defined_logic_config_list": [conf],
        "destinations": [{dst: "trigger_put"}],
    }
    return json.dumps({"graphs": [{"id": gid, "graph": [vertex]}]})


def deploy(c, code_dir, gid, src, dst, udl, cls=None, workers=1, **more):
    conf = {}
    if udl == "python":
        conf = {"python_path": [code_dir], "module": "bench_udls", "entry_class": cls, "workers": workers, **VERTEX_SETTINGS, **more}
    c.dfg_apply(one_vertex_graph(gid, src, dst, udl, conf))


def wakeups(c, gid):
    """The eventfd wake-ups of graph `gid`'s Python vertex so far (`dfg
    list`'s counters): {"node": n, "worker": n}."""
    for g in c.dfg_list():
        if g["id"] == gid:
            return dict(g["status"][0]["counters"]["wakeups"])
    raise RuntimeError(f"no graph {gid}")


def failures(c, tag, skip=None):
    """Calls of the benchmark's graphs (ids ending in `tag`, but not
    starting with `skip`) that failed, panicked or were dropped so far,
    and the last error: a run with any measured something else than it
    says."""
    n, last = 0, None
    for g in c.dfg_list():
        if g["id"].endswith(tag) and not (skip and g["id"].startswith(skip)):
            for st in g.get("status") or []:
                n += st.get("failures", 0) + st.get("panics", 0) + st.get("dropped", 0)
                last = st.get("last_error") or last
    return n, last


def warn_failures(result):
    """Says on stderr when the run's lambdas failed calls (see `failures`)."""
    if result.get("failed_calls"):
        print(
            f"WARNING: {result['failed_calls']} lambda calls failed or were dropped during this run"
            f" (last error: {result['last_error']}): the figures include them",
            file=sys.stderr,
        )


def clean_up(c, tag, code_dir):
    """Removes a benchmark's graphs (their ids end in `tag`) and its code."""
    for g in list(c.dfg_list()):
        if g["id"].endswith(tag):
            c.dfg_remove(g["id"])
    shutil.rmtree(code_dir, ignore_errors=True)


def stage_calls(c, stages, size, n, each, timeout=10.0):
    """`n` rounds of one trigger put of `size` bytes to each of `stages`
    ((src, dst) pairs) in turn, each waiting for the stage's output:
    `each(i, t0_ns, notification)` for stage i, t0 taken before the put.
    Taking turns call by call lets the machine's drift hit every stage
    alike."""
    value = os.urandom(size)
    watches = [c.watch(dst) for _, dst in stages]
    try:
        for _ in range(n):
            for i, (src, _) in enumerate(stages):
                t0 = time.perf_counter_ns()
                c.trigger_put(f"{src}/k", value)
                note = watches[i].next(timeout=timeout)
                if note is None:
                    raise RuntimeError(f"no output from the stage at {src} in {timeout:g} s")
                each(i, t0, note)
    finally:
        for w in watches:
            w.close()


def stage_latencies(c, stages, size, n):
    """µs from trigger_put to the next stage's notification, one object at
    a time, for each of `stages` ((src, dst) pairs), taking turns."""
    out = [[] for _ in stages]
    stage_calls(c, stages, size, n, lambda i, t0, _: out[i].append((time.perf_counter_ns() - t0) / 1000))
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


def copy_latency(size, n):
    """µs of one copy of `size` bytes into a shared mapping whose pages are
    already in place: what the node pays to hand a value to a worker."""
    import mmap

    src = os.urandom(size)
    dst = mmap.mmap(-1, size)
    view = memoryview(dst)
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        view[:] = src
        out.append((time.perf_counter_ns() - t0) / 1000)
    view.release()
    dst.close()
    return out


def ray_chain_latencies(size, n, lengths):
    """µs of a chain of Ray actor calls (each actor's result handed to the
    next as an object reference, as a Ray pipeline passes it), for each
    chain length, taking turns call by call."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:

        @ray.remote
        class Echo:
            def call(self, v):
                return v

        actors = [Echo.remote() for _ in range(max(lengths))]
        value = os.urandom(size)

        def chain(k):
            ref = value
            for actor in actors[:k]:
                ref = actor.call.remote(ref)
            return ray.get(ref)

        for k in lengths:
            chain(k)
        out = [[] for _ in lengths]
        for _ in range(n):
            for i, k in enumerate(lengths):
                t0 = time.perf_counter_ns()
                chain(k)
                out[i].append((time.perf_counter_ns() - t0) / 1000)
        return out
    finally:
        ray.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=sluice.default_address())
    ap.add_argument("--n", type=int, default=2000, help="calls per size and variant (taking turns call by call)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ray", action="store_true", help="also measure a Ray actor call (needs ray)")
    ap.add_argument("--spin-us", type=int, help="the vertex's spin_us (default: the node's)")
    ap.add_argument("--worker-spin-us", type=int, help="the vertex's worker_spin_us (default: the node's)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for name in ("spin_us", "worker_spin_us"):
        if getattr(a, name) is not None:
            VERTEX_SETTINGS[name] = getattr(a, name)
    c = sluice.Client(a.addr)
    code_dir = tempfile.mkdtemp(prefix="sluice-bench-udl-")
    with open(os.path.join(code_dir, "bench_udls.py"), "w") as f:
        f.write(NOOP_SRC)
    tag = uuid.uuid4().hex[:6]
    pools = {}
    for v in ("py", "rs", "burn", "pycopy"):
        pools[v] = (f"/bu-{v}-in-{tag}", f"/bu-{v}-out-{tag}")
        for p in pools[v]:
            c.create_object_pool(p, "trigger")
    deploy(c, code_dir, f"bu-py-{tag}", *pools["py"], "python", "Noop")
    deploy(c, code_dir, f"bu-rs-{tag}", *pools["rs"], "relay")
    result = {"stage_us": {}, "throughput": {}}
    for size in (10 * 1024, 1 << 20):
        stage_latencies(c, [pools["py"], pools["rs"]], size, 50)  # warm up
        before = wakeups(c, f"bu-py-{tag}")
        py, rs = stage_latencies(c, [pools["py"], pools["rs"]], size, a.n)
        after = wakeups(c, f"bu-py-{tag}")
        result["stage_us"][size] = {
            "python": {p: pct(py, p) for p in (50, 99, 99.9)},
            "relay": {p: pct(rs, p) for p in (50, 99, 99.9)},
            "added_p50_us": pct(py, 50) - pct(rs, 50),
            # Eventfd wake-ups per call: a side that found the message
            # while polling paid none.
            "wakeups_per_call": {k: (after[k] - before[k]) / a.n for k in after},
        }
    # The same 1 MB stage with its values copied into the worker's arena
    # (no landing area), next to relay in a phase of its own: what reading
    # the value from the socket straight into shared memory buys.
    deploy(c, code_dir, f"bu-pycopy-{tag}", *pools["pycopy"], "python", "Noop", landing_mb=0)
    stage_latencies(c, [pools["pycopy"], pools["rs"]], 1 << 20, 50)  # warm up
    py, rs = stage_latencies(c, [pools["pycopy"], pools["rs"]], 1 << 20, a.n)
    result["copied_1mb_us"] = {
        "python": {p: pct(py, p) for p in (50, 99, 99.9)},
        "relay": {p: pct(rs, p) for p in (50, 99, 99.9)},
        "added_p50_us": pct(py, 50) - pct(rs, 50),
    }
    small, large = result["stage_us"][10 * 1024], result["stage_us"][1 << 20]
    copy = copy_latency(1 << 20, max(200, a.n // 10))
    result["copy_1mb_us"] = {p: pct(copy, p) for p in (50, 99)}
    # How much more the Python stage grows from 10 KB to 1 MB than relay
    # does, in copies of 1 MB measured just now (target: at most one).
    growth = large["added_p50_us"] - small["added_p50_us"]
    result["growth_1mb_over_relay_us"] = growth
    result["growth_in_copies"] = growth / result["copy_1mb_us"][50]
    failed, last = 0, None
    for workers in () if a.skip_throughput else (1, 2):
        deploy(c, code_dir, f"bu-burn-{tag}", *pools["burn"], "python", "Burn", workers=workers)
        throughput(c, *pools["burn"], 0.5)  # warm up
        result["throughput"][workers] = throughput(c, *pools["burn"], a.seconds)
        # Counted now: the next deployment starts the graph's counters anew.
        n, last = failures(c, f"bu-burn-{tag}")
        failed += n
    if result["throughput"]:
        result["scaling_1_to_2"] = result["throughput"][2] / result["throughput"][1]
    if a.ray:
        # One call, end to end: a Ray actor call against a whole Sluice
        # stage (trigger put, lambda, emit, notification to the client).
        # Then per stage in a pipeline: what a third stage (or actor)
        # adds over a first, halved, in chains of 1 and 3 of each, so
        # that the client's own way in and out is counted in neither.
        ends = []
        for k in (1, 3):
            hops = [f"/bu-chain{k}-{i}-{tag}" for i in range(k + 1)]
            for p in hops:
                c.create_object_pool(p, "trigger")
            for i in range(k):
                deploy(c, code_dir, f"bu-chain{k}-{i}-{tag}", hops[i], hops[i + 1], "python", "Noop")
            ends.append((hops[0], hops[-1]))
        one, three = ends
        stage_latencies(c, [one, three], 10 * 1024, 50)  # warm up
        s1, s3 = stage_latencies(c, [one, three], 10 * 1024, a.n)
        r1, r3 = ray_chain_latencies(10 * 1024, a.n, (1, 3))
        result["ray_actor_us"] = {p: pct(r1, p) for p in (50, 99, 99.9)}
        result["ray_over_python_stage_p50"] = pct(r1, 50) / result["stage_us"][10 * 1024]["python"][50]
        result["per_stage_p50_us"] = {
            "sluice_python": (pct(s3, 50) - pct(s1, 50)) / 2,
            "ray_actor": (pct(r3, 50) - pct(r1, 50)) / 2,
        }
        result["chain_p50_us"] = {
            "sluice_python": {1: pct(s1, 50), 3: pct(s3, 50)},
            "ray_actor": {1: pct(r1, 50), 3: pct(r3, 50)},
        }
        ps = result["per_stage_p50_us"]
        result["ray_over_python_per_stage_p50"] = ps["ray_actor"] / max(ps["sluice_python"], 1e-9)
    n, last_here = failures(c, tag, skip="bu-burn-")  # the burn graph's counted above
    result["failed_calls"], result["last_error"] = failed + n, last_here or last
    clean_up(c, tag, code_dir)
    warn_failures(result)
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
        w = r["wakeups_per_call"]
        print(
            f"  python adds {r['added_p50_us']:.1f} µs at p50 over Rust's relay"
            f" (wake-ups per call: node {w['node']:.2f}, worker {w['worker']:.2f})"
        )
    cp = result["copied_1mb_us"]
    print(
        f"1 MB, the value copied into the worker's arena instead of landing (landing_mb 0), its own phase:"
        f" python {cp['python'][50]:.1f}, relay {cp['relay'][50]:.1f} µs p50: adds {cp['added_p50_us']:.1f} µs"
    )
    print(
        f"from 10 KB to 1 MB the python stage grows {result['growth_1mb_over_relay_us']:.1f} µs more than relay;"
        f" one 1 MB copy takes {result['copy_1mb_us'][50]:.1f} µs (p50): {result['growth_in_copies']:.2f} copies (target <= 1)"
    )
    t = result["throughput"]
    if t:
        print(f"Python stage of ~1 ms CPU per call: 1 worker {t[1]:.0f}/s, 2 workers {t[2]:.0f}/s ({result['scaling_1_to_2']:.2f}x)")

    if a.ray:
        r = result["ray_actor_us"]
        print(f"Ray actor call, 10 KB: p50 {r[50]:.1f} µs, p99 {r[99]:.1f} µs: {result['ray_over_python_stage_p50']:.1f}x a whole Sluice Python stage at p50")
        ch, ps = result["chain_p50_us"], result["per_stage_p50_us"]
        print("chains of 1 and 3, 10 KB, p50 µs (per stage: what the 2 more add, halved):")
        for name, label in (("sluice_python", "Sluice Python stages"), ("ray_actor", "Ray actor calls")):
            print(f"  {label:22} 1: {ch[name][1]:8.1f}   3: {ch[name][3]:8.1f}   per stage: {ps[name]:7.1f}")
        print(f"  a Ray actor in a chain costs {result['ray_over_python_per_stage_p50']:.1f}x a Sluice Python stage at p50")


if __name__ == "__main__":
    main()
