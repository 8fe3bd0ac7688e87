"""How long a cluster-wide `sluice dfg apply` takes, and until every node
runs the graph (BENCHMARKS.md, issue #17). Needs a running cluster:

    ./target/release/sluice dev --nodes 3 --base-port 7810 --dir /tmp/devm &
    python3 scripts/bench-dfg-apply.py 127.0.0.1:7810,127.0.0.1:7811,127.0.0.1:7812

Each round removes the graph, waits until no node lists it, applies it
(timing the CLI), then polls `dfg ls` until all nodes run it. A `sluice
ping` (process start and connect) is the baseline in the same run."""

import json
import statistics
import subprocess
import sys
import tempfile
import time

ADDR = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7810"
S = ["./target/release/sluice", "--addr", ADDR]
GRAPH = [{"id": "m", "graph": [{"pathname": "/trig/in", "user_defined_logic_list": ["relay"],
                                "destinations": [{"/vol/out": "put"}]}]}]


def nodes():
    return json.loads(subprocess.run(S + ["--json", "dfg", "ls"], capture_output=True, text=True).stdout)


with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
    json.dump(GRAPH, f)
    f.flush()
    apply, running = [], []
    for _ in range(20):
        subprocess.run(S + ["dfg", "rm", "m"], capture_output=True)
        while any(n["graphs"] for n in nodes()):
            pass
        t0 = time.perf_counter()
        subprocess.run(S + ["dfg", "apply", f.name], check=True, capture_output=True)
        t1 = time.perf_counter()
        while not all(n["graphs"] and n["graphs"][0]["state"] == "running" for n in nodes()):
            pass
        t2 = time.perf_counter()
        apply.append((t1 - t0) * 1e3)
        running.append((t2 - t0) * 1e3)
    ping = []
    for _ in range(20):
        t0 = time.perf_counter()
        subprocess.run(S + ["ping"], capture_output=True)
        ping.append((time.perf_counter() - t0) * 1e3)
print(f"dfg apply (CLI wall): p50 {statistics.median(apply):.1f} ms, max {max(apply):.1f} ms")
print(f"until every node runs it (incl. >= 1 `dfg ls` poll): p50 {statistics.median(running):.1f} ms, max {max(running):.1f} ms")
print(f"baseline, sluice ping (CLI wall): p50 {statistics.median(ping):.1f} ms")
