"""The lambdas of the Python demo pipeline (``python -m sluice.demo``):
they run in worker processes next to the node."""

import json
import pickle

import numpy as np

# Imported when the worker starts (`dfg apply` waits for that), not when
# the first call unpickles the model: on a loaded 2-core machine the
# import takes seconds, and in a cluster every node's worker paid it on
# its first image, with the images behind it queued.
import sklearn.linear_model  # noqa: F401


class Preprocess:
    """Stage 1: an 8x8 image of 0..16 grey levels (uint8) to the
    classifier's features (float32, scaled to 0..1)."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        x = np.asarray(blob, dtype=np.uint8).astype(np.float32) / 16.0
        emit(key_suffix, x.tobytes())


class Classify:
    """Stage 2: a scikit-learn model, itself an object in the store
    (``model_key``), loaded on first use and again when a new version is
    put; emits the predicted digit."""

    def __init__(self, conf):
        self.model_key = json.loads(conf)["model_key"]
        self.model, self.version = None, None

    def ocdpo_handler(self, key_suffix, blob, emit, context, **kw):
        value, meta = context.get(self.model_key)
        if meta["version"] != self.version:
            self.model, self.version = pickle.loads(bytes(value)), meta["version"]
        x = np.frombuffer(blob, dtype=np.float32).reshape(1, -1)
        emit(key_suffix, str(int(self.model.predict(x)[0])))
