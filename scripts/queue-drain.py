#!/usr/bin/env python3
"""How fast competing consumers drain a shared queue's backlog.

Pushes N items to a new shared queue on a running node, then starts K
consumer threads (a client each) that take and acknowledge until the
queue is empty, and prints the items per second and how many each
consumer took. Run it with K = 1 and K = 3 to see whether consumers
scale:

    sluice serve --listen 127.0.0.1:7590 --data-dir /tmp/q &
    python scripts/queue-drain.py --addr 127.0.0.1:7590 --items 3000 --consumers 3
"""

import argparse
import threading
import time
import uuid

import sluice
import sluice.streams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default="127.0.0.1:7420")
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--consumers", type=int, default=3)
    a = ap.parse_args()
    name = f"drain-{uuid.uuid4().hex[:8]}"
    c = sluice.Client(a.addr)
    p = sluice.streams.SharedQueue(c, name, "producer", lease_s=5)
    for i in range(a.items):
        p.push(b"x" * 100)
    taken = [0] * a.consumers
    missed = [0] * a.consumers

    def consumer(k: int) -> None:
        q = sluice.streams.SharedQueue(sluice.Client(a.addr), name, f"w{k}", lease_s=5)
        while True:
            d = q.take(timeout_s=0.2)
            if d is None:
                break
            q.ack(d)
            taken[k] += 1
        missed[k] = q.missed

    t = time.monotonic()
    threads = [threading.Thread(target=consumer, args=(k,)) for k in range(a.consumers)]
    for x in threads:
        x.start()
    for x in threads:
        x.join()
    el = time.monotonic() - t
    print(
        f"{a.consumers} consumers drained {sum(taken)}/{a.items} items in {el:.2f} s: "
        f"{sum(taken) / el:.0f} items/s; taken per consumer {taken}, missed {missed}"
    )


if __name__ == "__main__":
    main()
