#!/usr/bin/env python3
"""A whole cluster (or one node) stopped under a stream of puts into a lambda, and started again.

Starts a three-node `sluice dev` cluster, a persistent pool `/per` (or the
volatile `/vol`) and a graph whose `relay` lambda copies each `<pool>/in/<i>`
to `<pool>/out/<i>`, and puts `<pool>/in/0`, `1`, ... in a loop (the Python
client). After 1.5 s it kills (`kill -9`) or stops (SIGTERM) every node at
once (or one), says how long they took to exit, starts them again with
`sluice serve`, and reports: acknowledged puts missing right after `sluice
health` passes, puts without an output, the lambda runs each node made after
the restart before any new put, outputs written more than once (persistent
pools: their history), and whether 100 new puts each get their output.
With `--reboot` the stopped nodes' volatile logs are removed too, as a
machine's reboot empties `/dev/shm` (the volatile pool's data then lives
only on the nodes left running, or nowhere).

    python scripts/cluster-restart.py --sluice target/release/sluice --stop kill
    python scripts/cluster-restart.py --stop term --pool vol --nodes 1
    python scripts/cluster-restart.py --pool vol --nodes 1 --reboot
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import sluice


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--stop", choices=["kill", "term"], default="kill")
    ap.add_argument("--pool", choices=["per", "vol"], default="per")
    ap.add_argument("--nodes", default="all", help="all, or one node id (0-2)")
    ap.add_argument("--reboot", action="store_true",
                    help="also remove the stopped nodes' volatile logs (a reboot)")
    ap.add_argument("--dir", default="/tmp/sluice-cluster-restart")
    ap.add_argument("--base-port", type=int, default=8050)
    a = ap.parse_args()
    sl, d = os.path.abspath(a.sluice), a.dir
    addrs = ",".join(f"127.0.0.1:{a.base_port + i}" for i in range(3))
    env = dict(os.environ, SLUICE_ADDR=addrs)
    os.makedirs(d, exist_ok=True)
    dev_log = os.path.join(d, "..", os.path.basename(d) + "-dev.log")
    dev = subprocess.Popen(
        [sl, "dev", "--dir", d, "--fresh", "--base-port", str(a.base_port)],
        stdout=open(dev_log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    restarted = []
    try:
        deadline = time.time() + 60
        while "nodes up" not in open(dev_log).read():
            if time.time() > deadline or dev.poll() is not None:
                print(open(dev_log).read(), file=sys.stderr)
                return 1
            time.sleep(0.1)
        return run(a, sl, d, addrs, env, restarted)
    finally:
        for p in restarted:
            p.kill()
        subprocess.run(["pkill", "-f", f"{d}/node-"])
        os.killpg(dev.pid, signal.SIGTERM)
        dev.wait()


def cli(sl: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sl, *args], env=env, capture_output=True, text=True)


def run(a, sl: str, d: str, addrs: str, env: dict, restarted: list) -> int:
    p = f"/{a.pool}"
    if a.pool == "per":
        cli(sl, env, "pools", "create", p, "--type", "persistent").check_returncode()
    graph = os.path.join(d, "relay.json")
    with open(graph, "w") as f:
        json.dump([{"id": "relay", "graph": [
            {"pathname": f"{p}/in", "user_defined_logic_list": ["relay"],
             "destinations": [{f"{p}/out": "put"}]}]}], f)
    cli(sl, env, "dfg", "apply", graph).check_returncode()
    c = sluice.Client(addrs)
    acked, stop = [], threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                c.put(f"{p}/in/{i}", b"v")
            except sluice.SluiceError:
                return  # the cluster is down
            acked.append(i)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(1.5)
    victims = [0, 1, 2] if a.nodes == "all" else [int(a.nodes)]
    pids = [int(subprocess.run(["pgrep", "-f", f"{d}/node-{i}.toml"], capture_output=True,
                               text=True).stdout.split()[0]) for i in victims]
    t0 = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL if a.stop == "kill" else signal.SIGTERM)
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            time.sleep(0.01)
    gone = time.time() - t0
    if a.reboot:
        for i in victims:
            conf = open(f"{d}/node-{i}.toml").read()
            vdir = conf.split('volatile_dir = "')[1].split('"')[0]
            shutil.rmtree(vdir)
    stop.set()
    t.join()
    print(f"{a.stop} nodes {victims}{' (rebooted)' if a.reboot else ''}: gone after {gone:.2f} s; "
          f"{len(acked)} puts acknowledged")
    for i in victims:
        restarted.append(subprocess.Popen(
            [sl, "serve", "--config", f"{d}/node-{i}.toml", "--cluster", f"{d}/layout.toml",
             "--node-id", str(i), "--data-dir", f"{d}/node-{i}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    t0 = time.time()
    while cli(sl, env, "health").returncode != 0 and time.time() - t0 < 30:
        time.sleep(0.1)
    print(f"  healthy after {time.time() - t0:.2f} s")
    c = sluice.Client(addrs)

    def keys() -> set:
        return set(c.list_keys_in_object_pool(p))

    ks = keys()
    missing = [i for i in acked if f"{p}/in/{i}" not in ks]
    print(f"  right after: acknowledged puts missing {len(missing)}, "
          f"without output {sum(f'{p}/out/{i}' not in ks for i in acked)}")
    # The runs after the restart, once settled (the same count twice).
    runs, settle = None, time.time() + 10
    while time.time() < settle:
        now = [line.split("calls ")[1].split()[0] for line in cli(sl, env, "dfg", "ls").stdout.splitlines()
               if "calls " in line]
        if now == runs:
            break
        runs = now
        time.sleep(0.5)
    ks = keys()
    print(f"  settled: lambda runs on each node since the restart {runs}; "
          f"puts without output {sum(f'{p}/out/{i}' not in ks for i in acked)}")
    if a.pool == "per":
        twice = sum(len(c.history(f"{p}/out/{i}")) > 1 for i in acked if f"{p}/out/{i}" in ks)
        print(f"  outputs written more than once: {twice}")
    for i in range(100):
        c.put(f"{p}/in/new{i}", b"n")
    deadline = time.time() + 10
    while time.time() < deadline:
        ks = keys()
        if all(f"{p}/out/new{i}" in ks for i in range(100)):
            break
        time.sleep(0.2)
    print(f"  100 new puts: {sum(f'{p}/out/new{i}' in ks for i in range(100))} outputs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
