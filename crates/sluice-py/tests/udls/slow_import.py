"""A lambda whose module takes seconds to import, as one that imports a
large framework or loads a model at import does."""

import time

time.sleep(4)


class Echo:
    """Emits its input unchanged under the same key suffix."""

    def __init__(self, conf):
        pass

    def ocdpo_handler(self, key_suffix, blob, emit, **kw):
        emit(key_suffix, bytes(blob))
