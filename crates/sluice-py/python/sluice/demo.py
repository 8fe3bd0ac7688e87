"""The Python demo: a two-stage pipeline of Python lambdas classifying
handwritten digits (scikit-learn's bundled dataset; nothing downloaded).

    python -m sluice.demo [--addr HOST:PORT] [--images N] [--rate R]

Against a running node (``sluice serve``, ``sluice dev``; default: the
address the CLI would use). It trains a logistic regression on the
training split here, puts the model into the store, deploys

    /pydemo/frames --Preprocess--> /pydemo/features --Classify--> /pydemo-out/labels

(both Python lambdas, in worker processes next to the node, using this
Python: it has NumPy and scikit-learn), streams the held-out images
through it, checks the pipeline's accuracy against the model's offline
accuracy, and prints the per-stage latency breakdown from the objects'
traces (transfer, queueing, compute, forward; p50 / p99), as
``sluice demo`` does. Needs: pip install numpy scikit-learn.
"""

import argparse
import json
import os
import pickle
import sys
import threading
import time

import sluice

STAGES = ["/pydemo/frames", "/pydemo/features"]
# Objects sent through the pipeline before the measured ones.
WARMUP_KEYS = 16


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else 0


def pools(c):
    for path, kind in (("/pydemo", "trigger"), ("/pydemo-out", "volatile"), ("/pydemo-models", "volatile")):
        try:
            c.create_object_pool(path, kind)
        except sluice.PoolExists:
            pass


def deploy(c, python):
    here = os.path.dirname(os.path.abspath(__file__))
    conf = {"python_path": [os.path.dirname(here)], "python": python}
    c.dfg_apply(
        json.dumps(
            {
                "graphs": [
                    {
                        "id": "pydemo",
                        "desc": "digits: preprocess and classify, in Python",
                        "graph": [
                            {
                                "pathname": STAGES[0],
                                "user_defined_logic_list": ["python"],
                                "user_defined_logic_config_list": [
                                    {**conf, "module": "sluice.demo_udls", "entry_class": "Preprocess"}
                                ],
                                "destinations": [{STAGES[1]: "trigger_put"}],
                            },
                            {
                                "pathname": STAGES[1],
                                "user_defined_logic_list": ["python"],
                                "user_defined_logic_config_list": [
                                    {
                                        **conf,
                                        "module": "sluice.demo_udls",
                                        "entry_class": "Classify",
                                        "model_key": "/pydemo-models/digits",
                                    }
                                ],
                                "destinations": [{"/pydemo-out/labels": "put"}],
                            },
                        ],
                    }
                ]
            }
        )
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description="Sluice's Python demo pipeline")
    ap.add_argument(
        "--addr", default=sluice.default_address(), help="the node (default: $SLUICE_ADDR, else sluice dev's nodes, else 127.0.0.1:7420)"
    )
    ap.add_argument("--images", type=int, default=450, help="held-out images to classify (at most 450)")
    ap.add_argument("--rate", type=float, default=200.0, help="images per second")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the accuracy matches the offline one")
    a = ap.parse_args(argv)
    if a.images < 1 or a.rate <= 0:
        ap.error("--images and --rate must be positive")
    try:
        import numpy as np
        from sklearn.datasets import load_digits
        from sklearn.linear_model import LogisticRegression
    except ImportError as e:
        sys.exit(f"the demo needs numpy and scikit-learn: pip install numpy scikit-learn ({e})")

    digits = load_digits()
    X = digits.images.reshape(len(digits.images), -1).astype(np.uint8)
    y = digits.target
    n_train = len(X) - 450
    model = LogisticRegression(max_iter=2000).fit(X[:n_train] / 16.0, y[:n_train])
    X_test, y_test = X[n_train:][: a.images], y[n_train:][: a.images]
    offline = float((model.predict(X_test / 16.0) == y_test).mean())

    c = sluice.Client(a.addr)
    print(f"== node {c.node_id} at {a.addr}; model trained on {n_train} images (offline accuracy {offline:.4f})")
    pools(c)
    c.put("/pydemo-models/digits", pickle.dumps(model))
    deploy(c, sys.executable)
    print("== pipeline: /pydemo/frames -> Preprocess -> /pydemo/features -> Classify -> /pydemo-out/labels")

    results = {}
    sent_at = {}
    done = threading.Event()
    lock = threading.Lock()

    def on(n):
        if n.kind != "put":
            return
        name = n.key.rsplit("/", 1)[1]
        if not name.isdigit():
            return
        i = int(name)
        with lock:
            results[i] = (n.value.tobytes().decode(), n.object.trace, time.perf_counter())
            if len(results) == len(X_test):
                done.set()

    # Warm up: each worker loads the model on its first call; that is
    # start-up, not the pipeline's latency. In a cluster the images spread
    # over the nodes' workers, so several keys warm them all.
    warmups = [f"warmup-{j}" for j in range(WARMUP_KEYS)]
    for name in warmups:
        c.trigger_put(f"/pydemo/frames/{name}", X_test[0].tobytes())
    deadline = time.monotonic() + 60
    for name in warmups:
        while True:
            try:
                c.get(f"/pydemo-out/labels/{name}")
                break
            except sluice.NotFound:
                if time.monotonic() > deadline:
                    sys.exit("the pipeline gave no answer in 60 s (see the node's log)")
                time.sleep(0.01)
    w = c.watch("/pydemo-out/labels", callback=on)
    t0 = time.perf_counter()
    for i, img in enumerate(X_test):
        due = t0 + i / a.rate
        while time.perf_counter() < due:
            time.sleep(max(0.0, min(0.001, due - time.perf_counter())))
        sent_at[i] = time.perf_counter()
        c.trigger_put(f"/pydemo/frames/{i}", img.tobytes(), trace_id=i + 1)
    if not done.wait(30):
        sys.exit(f"only {len(results)} of {len(X_test)} images came back in 30 s")
    wall = time.perf_counter() - t0
    w.close()

    correct = sum(int(results[i][0]) == int(y_test[i]) for i in range(len(X_test)))
    acc = correct / len(X_test)
    print(f"== accuracy {acc:.4f} over {len(X_test)} images (offline {offline:.4f}), {len(X_test) / wall:.0f} images/s")
    stages = {s: {"transfer": [], "queueing": [], "compute": [], "forward": []} for s in STAGES}
    for label, trace, _ in results.values():
        if not trace:
            continue
        hops = trace["hops"]
        for h, hop in enumerate(hops):
            b = stages.get(hop["stage"])
            if b is None:
                continue
            if h == 0:
                b["transfer"].append(hop["enqueued_us"] - trace["client_sent_us"])
            b["queueing"].append(hop["started_us"] - hop["enqueued_us"])
            b["compute"].append(hop["emitted_us"] - hop["started_us"])
            if h + 1 < len(hops):
                b["forward"].append(hops[h + 1]["enqueued_us"] - hop["emitted_us"])
    e2e = [(results[i][2] - sent_at[i]) * 1e6 for i in results]
    print("== latency breakdown per stage (µs, p50 / p99)")
    print(f"  {'stage':<20} {'transfer':>14} {'queueing':>14} {'compute':>14} {'forward':>14}")
    for s, b in stages.items():
        cells = [f"{pct(v, 50):>6} / {pct(v, 99):<6}" if v else f"{'-':>14}" for v in b.values()]
        print(f"  {s:<20} " + " ".join(cells))
    print(f"  end to end (client put -> watch): p50 {pct(e2e, 50):.0f} µs, p99 {pct(e2e, 99):.0f} µs")
    c.dfg_remove("pydemo")
    if a.check and abs(acc - offline) > 1e-9:
        sys.exit(f"accuracy {acc:.4f} differs from the offline {offline:.4f}")
    return acc, offline


if __name__ == "__main__":
    main()
