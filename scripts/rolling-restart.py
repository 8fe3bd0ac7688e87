#!/usr/bin/env python3
"""A rolling restart under load, as an operator upgrading a cluster does it.

Starts a three-node `sluice dev` cluster, runs writer threads (the Python
client, 1 KB puts to `/vol`, 1,000 keys each), and then, round after
round: finds the volatile shard's leader, stops it with SIGTERM, waits for
it to exit, restarts it a second later from its own config, and waits two
seconds before the next round. Prints each stop's longest put in the
second after it, the slowest puts of the run (with when they came), and
any errors. Exits non-zero if a put failed.

    python scripts/rolling-restart.py --sluice target/release/sluice --rounds 4

(needs the Python client installed: README, "Python").
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import sluice


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default="target/release/sluice", help="the sluice binary")
    ap.add_argument("--rounds", type=int, default=4, help="leaders stopped, one after the other")
    ap.add_argument("--writers", type=int, default=2, help="writer threads")
    ap.add_argument("--base-port", type=int, default=7520)
    ap.add_argument("--keep", action="store_true", help="keep the nodes' directories and logs")
    a = ap.parse_args()
    sl = os.path.abspath(a.sluice)
    d = tempfile.mkdtemp(prefix="sluice-rolling-")
    addrs = ",".join(f"127.0.0.1:{a.base_port + i}" for i in range(3))
    print(f"starting 3 nodes in {d}", file=sys.stderr)
    dev_log = open(os.path.join(d, "dev.log"), "w")
    dev = subprocess.Popen(
        [sl, "dev", "--dir", os.path.join(d, "c"), "--fresh", "--base-port", str(a.base_port)],
        stdout=dev_log,
        stderr=subprocess.STDOUT,
    )
    restarted = {}
    try:
        wait_up(os.path.join(d, "dev.log"), dev)
        return run(a, sl, os.path.join(d, "c"), addrs, restarted)
    finally:
        for p in restarted.values():
            p.send_signal(signal.SIGTERM)
            p.wait()
        dev.send_signal(signal.SIGTERM)
        dev.wait()
        if a.keep:
            print(f"logs kept in {d}", file=sys.stderr)
        else:
            shutil.rmtree(d, ignore_errors=True)


def wait_up(log: str, dev: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "nodes up" in open(log).read():
            return
        if dev.poll() is not None:
            sys.exit(f"sluice dev exited: {open(log).read()}")
        time.sleep(0.1)
    sys.exit("sluice dev did not come up within 60 s")


def run(a, sl: str, d: str, addrs: str, restarted: dict) -> int:
    stop = threading.Event()
    lat = []  # (start, seconds, error or None)

    def writer(prefix: str) -> None:
        c = sluice.Client(addrs, timeout=10)
        i = 0
        while not stop.is_set():
            t = time.monotonic()
            try:
                c.put(f"{prefix}/k{i % 1000}", b"x" * 1024)
                e = None
            except sluice.SluiceError as ex:
                e = repr(ex)
            lat.append((t, time.monotonic() - t, e))
            i += 1

    threads = [
        threading.Thread(target=writer, args=(f"/vol/rolling{w}",), daemon=True)
        for w in range(a.writers)
    ]
    for t in threads:
        t.start()
    time.sleep(1)
    stops = []
    for r in range(a.rounds):
        node = leader_of(sl, addrs, "volatile/0/0")
        cfg = os.path.join(d, f"node-{node}.toml")
        t0 = time.monotonic()
        if node in restarted:
            p = restarted.pop(node)
            p.send_signal(signal.SIGTERM)
            p.wait()
        else:
            pid = int(subprocess.check_output(["pgrep", "-f", f"serve --config {cfg}"]).split()[0])
            os.kill(pid, signal.SIGTERM)
            # A child of `sluice dev`: gone once its port is free.
            while subprocess.run(["pgrep", "-f", f"serve --config {cfg} "], capture_output=True).returncode == 0:
                time.sleep(0.002)
        t1 = time.monotonic()
        stops.append((node, t0, t1))
        time.sleep(1)
        restarted[node] = subprocess.Popen(
            [sl, "serve", "--config", cfg, "--cluster", os.path.join(d, "layout.toml"),
             "--node-id", str(node), "--data-dir", os.path.join(d, f"node-{node}")],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(d, f"node-{node}.log"), "a"),
        )
        time.sleep(2)
    stop.set()
    for t in threads:
        t.join()
    errors = [x for x in lat if x[2]]
    start = lat[0][0]
    print(f"puts {len(lat)}, errors {len(errors)}")
    for e in errors[:5]:
        print(f"  error at {e[0] - start:.3f} s: {e[2]}")
    for node, t0, t1 in stops:
        window = [x[1] for x in lat if t0 <= x[0] <= t1 + 1.0]
        print(
            f"node {node} (leader) stopped at {t0 - start:.2f} s: longest put in the second after "
            f"{1000 * max(window, default=0):.1f} ms ({len(window)} puts)"
        )
    ds = sorted(x[1] for x in lat)
    print(
        f"all puts: p50 {1000 * ds[len(ds) // 2]:.2f} ms, p99 {1000 * ds[int(len(ds) * 0.99)]:.2f} ms, "
        f"max {1000 * ds[-1]:.1f} ms"
    )
    for t, s, _ in sorted(lat, key=lambda x: -x[1])[:3]:
        print(f"  slow put at {t - start:.3f} s: {1000 * s:.1f} ms")
    return 1 if errors else 0


def leader_of(sl: str, addrs: str, group: str) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sl, "cluster", "status", "--addr", addrs, "--json"], capture_output=True, text=True
        )
        if out.returncode == 0:
            for n in json.loads(out.stdout)["nodes"]:
                for g in n.get("groups", []):
                    if g["group"] == group and g["role"] == "leader":
                        return n["node"]
        time.sleep(0.05)
    sys.exit(f"no leader of {group} within 10 s")


if __name__ == "__main__":
    sys.exit(main())
