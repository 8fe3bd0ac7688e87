"""A lambda whose module imports a package the worker's interpreter lacks
(as numpy or torch missing from the node's python3)."""

import sluice_test_no_such_package  # noqa: F401


class Echo:
    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        emit(key_suffix, bytes(blob))
