"""EdgeServe's decentralized ensemble (its Table 2 shape) on Sluice streams.

Four "sensors", each one feature group of scikit-learn's bundled digits
dataset (64 pixels: 4 groups of 16), each recording on its own node
process; a broker node holds the topics. The stream replays test samples
in real time, one every --step-ms, the class changing every --segment
samples; the ground truth is the class of the sample being recorded.

- centralized: sensors publish raw features (lazy); the consumer aligns
  them (one item per sensor from the same moment, `Aligner`) and, at the
  target frequency, fetches the newest complete tuple's features, joins
  them and runs one model over all 64;
- decentralized: each sensor runs a local model over its 16 features and
  publishes its class probabilities; the consumer (`RateConsumer`)
  averages the last known ones at each tick (an ensemble).

Each prediction is scored against the truth at the time it is made
(real-time accuracy). With one sensor delayed by a constant (--delay-ms:
its items arrive late), the centralized model can only predict for moments
every sensor has reported, so all its predictions lag by the delay, while
the ensemble lets one voter be late: the paper's point, decentralized
degrades less. Run:

    python examples/streams/ensemble.py            # about 1.5 minutes
    python examples/streams/ensemble.py --json     # machine-readable

Needs the `sluice` package (maturin develop) and scikit-learn, and the
`sluice` binary (target/release or target/debug, or $SLUICE_BIN).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

import sluice
from sluice.streams import Aligner, Producer, RateConsumer, Subscriber, realtime_accuracy

ROOT = Path(__file__).resolve().parents[2]
SENSORS = ["s0", "s1", "s2", "s3"]


def sluice_bin() -> str:
    if os.environ.get("SLUICE_BIN"):
        return os.environ["SLUICE_BIN"]
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "sluice"
        if p.exists():
            return str(p)
    sys.exit("no sluice binary: cargo build --release -p sluice-cli (or set SLUICE_BIN)")


class Nodes:
    """A broker and one edge node per sensor: `sluice serve` processes."""

    def __init__(self, n: int):
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-ensemble-"))
        cfg = self.dir / "node.toml"
        cfg.write_text('[persistent]\nsync = "never"\n')
        self.procs, self.addrs = [], []
        for i in range(n):
            log = self.dir / f"node{i}.log"
            p = subprocess.Popen(
                [sluice_bin(), "serve", "--listen", "127.0.0.1:0", "--config", str(cfg),
                 "--data-dir", str(self.dir / f"node{i}")],
                stdout=open(log, "w"), stderr=subprocess.STDOUT,
                env={**os.environ, "SLUICE_LOG": "warn"},
            )
            self.procs.append(p)
            deadline = time.monotonic() + 30
            while True:
                m = re.search(r"listening on (\S+)", log.read_text())
                if m:
                    self.addrs.append(m.group(1))
                    break
                if time.monotonic() > deadline or p.poll() is not None:
                    raise RuntimeError("node did not start: " + log.read_text())
                time.sleep(0.01)

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def models(seed: int):
    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.4, random_state=seed, stratify=y)
    groups = np.array_split(np.arange(X.shape[1]), len(SENSORS))
    local = [LogisticRegression(max_iter=2000).fit(Xtr[:, g], ytr) for g in groups]
    central = LogisticRegression(max_iter=2000).fit(Xtr, ytr)
    return groups, local, central, Xte, yte


def schedule(Xte, yte, n_steps: int, segment: int, seed: int):
    """The samples replayed: the class changes every `segment` steps."""
    rng = np.random.default_rng(seed)
    by_class = {c: np.flatnonzero(yte == c) for c in np.unique(yte)}
    order = []
    while len(order) < n_steps:
        c = rng.choice(list(by_class))
        order += list(rng.choice(by_class[c], size=segment))
    return order[:n_steps]


def run_once(nodes, mode, freq_hz, delay_ms, args, m, run_id):
    groups, local, central, Xte, yte = m
    broker = sluice.Client(nodes.addrs[0])
    topic = f"ens-{run_id}"
    step = args.step_ms / 1000.0
    n_steps = int(args.seconds / step)
    # Both modes replay the same samples at a given frequency and delay.
    order = schedule(Xte, yte, n_steps, args.segment, seed=int(freq_hz * 1000) + delay_ms)
    t0 = time.time() + 0.5  # everyone starts together, on the wall clock
    producers = [
        Producer(broker, nodes.addrs[1 + i], topic, s, routing="lazy") for i, s in enumerate(SENSORS)
    ]
    truth = [(int((t0 + k * step) * 1e6), str(int(yte[idx]))) for k, idx in enumerate(order)]

    def sensor(i: int):
        g, delay = groups[i], (delay_ms / 1000.0 if i == 0 else 0.0)
        for k, idx in enumerate(order):
            at = t0 + k * step
            time.sleep(max(0.0, at + delay - time.time()))  # replaying a recording at its pace
            x = Xte[idx, g].astype(np.float32)
            value = local[i].predict_proba(x[None, :])[0].astype(np.float32) if mode == "decentralized" else x
            producers[i].publish(value, ts_us=int(at * 1e6))

    consume = decentralized if mode == "decentralized" else centralized
    out = consume(broker, topic, freq_hz, t0, t0 + n_steps * step, step, truth, central, sensor)
    broker.close()
    return out


def start_sensors(sensor):
    threads = [threading.Thread(target=sensor, args=(i,), daemon=True) for i in range(len(SENSORS))]
    for t in threads:
        t.start()
    return threads


def decentralized(broker, topic, freq_hz, t0, end, step, truth, central, sensor):
    """At each tick, average the last known local predictions (stale ones
    included: the ensemble tolerates one late voter)."""
    consumer = RateConsumer(broker, topic, SENSORS, period_s=1.0 / freq_hz)
    for ts, label in truth:
        consumer.truth(ts, label)
    threads = start_sensors(sensor)
    while time.time() < end:
        ts, slots = consumer.tick()
        if ts < t0 * 1e6 or any(s is None for s in slots):
            continue
        payloads = [np.frombuffer(p, dtype=np.float32) for p in consumer.payloads([s[1] for s in slots])]
        consumer.predicted(str(int(np.argmax(np.mean(payloads, axis=0)))))
    for t in threads:
        t.join()
    return consumer.metrics()


def centralized(broker, topic, freq_hz, t0, end, step, truth, central, sensor):
    """Raw features must describe one moment: at each tick, predict from the
    newest tuple the aligner completed (one item per sensor within half a
    step), so a late sensor holds every prediction back."""
    sub = Subscriber(broker, topic)
    aligner = Aligner(SENSORS, max_skew=int(step * 1e6 / 2), fail_soft="drop")
    threads = start_sensors(sensor)
    period, next_tick = 1.0 / freq_hz, time.time() + 1.0 / freq_hz
    newest, predictions, used = None, [], 0
    while time.time() < end:
        h = sub.next(timeout_s=max(0.0, next_tick - time.time()))
        if h is not None:
            for _, slots in aligner.push(h.source, h.ts_us, h):
                newest = [s[3] for s in slots]
        if time.time() < next_tick:
            continue
        next_tick += period
        if newest is None:
            continue
        x = np.concatenate([np.frombuffer(sub.fetch(hh), dtype=np.float32) for hh in newest])
        used += len(newest)
        predictions.append((int(time.time() * 1e6), str(int(central.predict(x[None, :])[0]))))
    for t in threads:
        t.join()
    times = np.diff([p[0] for p in predictions]) / 1e3
    stats = sub.stats()
    return {
        "realtime_accuracy": realtime_accuracy(predictions, truth),
        "predictions": len(predictions),
        "frequency_hz": 1e3 / times.mean() if len(times) else None,
        "interval_std_ms": float(times.std()) if len(times) else None,
        "fetched": stats["fetched"],
        "received": stats["received"],
        "skipped": stats["received"] - aligner.waiting - used,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--freqs", default="5,10,25", help="target prediction frequencies (Hz)")
    ap.add_argument("--delay-ms", type=int, default=400, help="constant delay of sensor s0")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each run")
    ap.add_argument("--step-ms", type=int, default=20, help="one sample every this many ms")
    ap.add_argument("--segment", type=int, default=25, help="samples per class segment")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    m = models(seed=0)
    nodes = Nodes(1 + len(SENSORS))
    rows, run_id = [], 0
    try:
        for freq in [float(f) for f in args.freqs.split(",")]:
            for delay in (0, args.delay_ms):
                row = {"target_hz": freq, "delay_ms": delay}
                for mode in ("centralized", "decentralized"):
                    run_id += 1
                    r = run_once(nodes, mode, freq, delay, args, m, run_id)
                    row[mode] = r
                    print(
                        f"{freq:>5} Hz, s0 delayed {delay:>4} ms, {mode:<13}: real-time accuracy "
                        f"{r['realtime_accuracy'] or 0:.3f} ({r['predictions']} predictions at "
                        f"{r['frequency_hz'] or 0:.1f} Hz ± {r['interval_std_ms'] or 0:.1f} ms, "
                        f"{r['fetched']} payloads fetched of {r['received']} items, {r['skipped']} skipped)",
                        file=sys.stderr,
                    )
                rows.append(row)
    finally:
        nodes.close()
    if args.json:
        print(json.dumps(rows))
    else:
        print("\ntarget Hz | s0 delay | centralized | decentralized")
        for r in rows:
            print(
                f"{r['target_hz']:>9} | {r['delay_ms']:>5} ms | {r['centralized']['realtime_accuracy'] or 0:>11.3f}"
                f" | {r['decentralized']['realtime_accuracy'] or 0:>13.3f}"
            )


if __name__ == "__main__":
    main()
