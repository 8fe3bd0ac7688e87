#!/usr/bin/env python3
"""A member of a replicated shard killed under a stream of puts into a lambda.

Starts a three-node `sluice dev` cluster, applies a graph whose `relay`
lambda (dispatched to one member of the shard, the default) copies each
`/vol/in/<i>` to `/vol/out/<i>`, and puts `/vol/in/0`, `/vol/in/1`, ... in a
loop (the Python client, one at a time). A second in, it kills (`kill -9`)
a follower of the volatile shard, or its leader, and goes on putting for
two more seconds. Then it counts the puts whose lambda has not run while
the member stays down, restarts the member, and counts again.

    python scripts/lambda-kill.py --sluice target/release/sluice --kill follower
"""
import argparse
import json
import os
import signal
import subprocess
import threading
import time

import sluice


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--kill", choices=["follower", "leader"], default="follower")
    ap.add_argument("--dir", default="/tmp/sluice-lambda-kill")
    ap.add_argument("--base-port", type=int, default=7850)
    a = ap.parse_args()
    sl, d = os.path.abspath(a.sluice), a.dir
    addrs = ",".join(f"127.0.0.1:{a.base_port + i}" for i in range(3))
    env = dict(os.environ, SLUICE_ADDR=addrs)
    dev = subprocess.Popen(
        [sl, "dev", "--dir", d, "--fresh", "--base-port", str(a.base_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        for line in dev.stdout:
            if "nodes up" in line:
                break
        return run(a, sl, d, addrs, env)
    finally:
        subprocess.run(["pkill", "-f", f"{d}/node-"])
        os.killpg(dev.pid, signal.SIGTERM)
        dev.wait()


def run(a, sl: str, d: str, addrs: str, env: dict) -> int:
    graph = os.path.join(d, "relay.json")
    with open(graph, "w") as f:
        json.dump([{"id": "relay", "graph": [
            {"pathname": "/vol/in", "user_defined_logic_list": ["relay"],
             "destinations": [{"/vol/out": "put"}]}]}], f)
    subprocess.run([sl, "dfg", "apply", graph], env=env, check=True, capture_output=True)
    status = json.loads(subprocess.run(
        [sl, "cluster", "status", "--json"], env=env, capture_output=True, text=True,
        check=True).stdout)
    leader = next(g["leader"] for node in status["nodes"] for g in node.get("groups", [])
                  if g["group"] == "volatile/0/0" and g.get("leader") is not None)
    victim = leader if a.kill == "leader" else next(i for i in range(3) if i != leader)
    c = sluice.Client(addrs)
    n, stop = [0], threading.Event()

    def writer() -> None:
        while not stop.is_set():
            c.put(f"/vol/in/{n[0]}", b"v")
            n[0] += 1

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(1.0)
    pid = int(subprocess.run(["pgrep", "-f", f"{d}/node-{victim}.toml"],
                             capture_output=True, text=True).stdout.split()[0])
    at = n[0]
    os.kill(pid, signal.SIGKILL)
    time.sleep(2.0)
    stop.set()
    t.join()
    total = n[0]

    def not_run() -> list:
        outs = set(c.list_keys_in_object_pool("/vol"))
        return [i for i in range(total) if f"/vol/out/{i}" not in outs]

    # Settled: the same count twice in a row (lambdas still queued run).
    missing, deadline = not_run(), time.time() + 5
    while time.time() < deadline:
        time.sleep(0.2)
        again = not_run()
        if again == missing:
            break
        missing = again
    print(f"{a.kill} (node {victim}) killed after put {at}; {total} puts; "
          f"lambdas not run while it is down: {len(missing)} {missing[:8]}")
    subprocess.Popen(
        [sl, "serve", "--config", f"{d}/node-{victim}.toml", "--cluster",
         f"{d}/layout.toml", "--node-id", str(victim), "--data-dir", f"{d}/node-{victim}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 10
    while time.time() < deadline and missing:
        time.sleep(0.2)
        try:
            missing = not_run()
        except sluice.SluiceError:
            pass
    print(f"  10 s after it restarted: not run {len(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
