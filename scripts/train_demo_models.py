#!/usr/bin/env python3
"""Trains the demo pipeline's two models on scikit-learn's bundled digits set
and writes them as ONNX, with the held-out images and the offline metrics the
demo must reproduce. Run once; its outputs are committed under demo/.

    pip install scikit-learn onnx numpy
    python3 scripts/train_demo_models.py

Stage 1, the filter: logistic regression "is this a usable digit image?",
trained on real digits against synthetic unusable frames (blank, noise,
mostly-dropped pixels). Stage 2, the classifier: an MLP (64-32-10).
Both graphs are written with onnx.helper using only core operators
(Gemm, Relu, Sigmoid, Softmax) so any ONNX runtime (tract) can run them.
Nothing is downloaded: load_digits ships with scikit-learn.
"""
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo")
rng = np.random.default_rng(7)


def unusable(n):
    """Frames a camera produces that are not digits."""
    kinds = []
    for i in range(n):
        k = i % 3
        if k == 0:  # blank with sensor noise
            img = np.clip(rng.normal(0.02, 0.02, 64), 0, 1)
        elif k == 1:  # pure noise
            img = rng.uniform(0, 1, 64)
        else:  # a digit-like blob with most pixels dropped and a bright bar
            img = np.zeros(64)
            img[rng.choice(64, 6, replace=False)] = rng.uniform(0.5, 1, 6)
            img[8 * rng.integers(0, 8): 8 * rng.integers(0, 8) + 8] = 1.0
        kinds.append(img)
    return np.array(kinds, dtype=np.float32)


def gemm_graph(name, layers, out_act):
    """A chain of Gemm (+ activation) nodes: input [N,64] -> output."""
    nodes, inits = [], []
    cur = "input"
    for i, (w, b, act) in enumerate(layers):
        wn, bn, yn = f"W{i}", f"B{i}", f"Y{i}"
        inits.append(helper.make_tensor(wn, TensorProto.FLOAT, w.shape, w.astype(np.float32).ravel()))
        inits.append(helper.make_tensor(bn, TensorProto.FLOAT, b.shape, b.astype(np.float32).ravel()))
        nodes.append(helper.make_node("Gemm", [cur, wn, bn], [yn]))
        cur = yn
        if act:
            an = f"A{i}"
            nodes.append(helper.make_node(act, [cur], [an], **({"axis": 1} if act == "Softmax" else {})))
            cur = an
    nodes[-1].output[0] = "output"
    out_dim = layers[-1][0].shape[1]
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, out_dim])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="sluice-demo")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def main():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)

    # Stage 1: filter.
    neg_tr, neg_te = unusable(600), unusable(60)
    fx = np.vstack([x_tr, neg_tr])
    fy = np.concatenate([np.ones(len(x_tr)), np.zeros(len(neg_tr))])
    filt = LogisticRegression(max_iter=2000, C=1.0).fit(fx, fy)
    filt_model = gemm_graph("filter", [(filt.coef_.T, filt.intercept_, "Sigmoid")], None)

    # Stage 2: classifier.
    mlp = MLPClassifier(hidden_layer_sizes=(32,), max_iter=600, random_state=0).fit(x_tr, y_tr)
    layers = [(mlp.coefs_[0], mlp.intercepts_[0], "Relu"), (mlp.coefs_[1], mlp.intercepts_[1], "Softmax")]
    clf_model = gemm_graph("classifier", layers, None)

    # Held-out stream: real digits and unusable frames, interleaved.
    images = np.vstack([x_te, neg_te]).astype(np.float32)
    labels = np.concatenate([y_te, -np.ones(len(neg_te), dtype=int)]).astype(np.int8)
    order = rng.permutation(len(images))
    images, labels = images[order], labels[order]

    # Offline predictions in float32, the same arithmetic as the graphs.
    def f32(a):
        return a.astype(np.float32)

    p_usable = 1 / (1 + np.exp(-(images @ f32(filt.coef_.T) + f32(filt.intercept_))))
    usable = p_usable[:, 0] >= 0.5
    h = np.maximum(images @ f32(mlp.coefs_[0]) + f32(mlp.intercepts_[0]), 0)
    pred = np.argmax(h @ f32(mlp.coefs_[1]) + f32(mlp.intercepts_[1]), axis=1)
    digit = labels >= 0
    classifier_acc = float(np.mean(pred[digit] == labels[digit]))
    filter_acc = float(np.mean(usable == digit))
    # End to end: an unusable frame is right when filtered out; a digit is
    # right when it passes the filter and is classified correctly.
    e2e = np.where(digit, usable & (pred == labels), ~usable)
    os.makedirs(OUT, exist_ok=True)
    onnx.save(filt_model, os.path.join(OUT, "filter.onnx"))
    onnx.save(clf_model, os.path.join(OUT, "classifier.onnx"))
    images.tofile(os.path.join(OUT, "images.f32"))
    labels.tofile(os.path.join(OUT, "labels.i8"))
    meta = {
        "source": "sklearn.datasets.load_digits, 20% held out (random_state=0) + 60 synthetic unusable frames",
        "images": int(len(images)),
        "digits": int(digit.sum()),
        "unusable": int((~digit).sum()),
        "image_shape": [1, 64],
        "filter_threshold": 0.5,
        "offline_filter_accuracy": filter_acc,
        "offline_classifier_accuracy": classifier_acc,
        "offline_pipeline_accuracy": float(np.mean(e2e)),
        "offline_pipeline_correct": int(e2e.sum()),
    }
    with open(os.path.join(OUT, "offline_metrics.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
